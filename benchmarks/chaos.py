"""Random kills: `cdc-lakehouse sync` SIGKILLed at random moments under a live workload with DDL and TRUNCATE.

    .venv/bin/python -m benchmarks.chaos [--kills 50] [--seed 15]        (or: make chaos KILLS=50)

A dedicated MariaDB under .local/chaos and a lakehouse beside it. A writer thread keeps committing row changes to a
keyed table, a keyless one (duplicate rows), an insert-only one, and every few seconds an ALTER (a column added, or
a column's type widened) or a TRUNCATE followed by inserts. Each round starts a `sync` process and SIGKILLs it at a
random moment within its usual duration (measured first), so kills land in capture, in either stage, in the
checks, or between them. Then, with the writer paused, a `sync` recovers (timed: the time to recover), `verify`
compares every table with the source, and the exactly-once oracle (cdc_assets_tests/exactly_once.py) checks that
every row change of the raw batches is in its change log once. A sync that ends by itself before its kill must exit
0. Prints one line per round and a summary table.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.workloads import CLI, fresh_server
from cdc_assets.lake.layout import CHANGES, CURRENT
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server
from cdc_assets_tests.exactly_once import check_exactly_once

BASE = Path(".local") / "chaos"
SCHEMA = "chaos"
WIDENING = ["SMALLINT", "INT", "BIGINT"]  # the successive types of wide.m, one MODIFY COLUMN each


class Writer:
    """The live workload, in a thread; `paused()` holds it still while a round is checked."""

    def __init__(self, server: local_server.LocalServer, seed: int) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.run = threading.Event()
        self.stop = threading.Event()
        self.idle = threading.Event()
        self.next_event = 1
        self.ddl: Counter[str] = Counter()
        self.transactions = 0
        self.thread = threading.Thread(target=self._loop, name="writer", daemon=True)

    def _loop(self) -> None:
        last_ddl = time.monotonic()
        with self.server.admin_connection(database=SCHEMA) as conn, conn.cursor() as cur:
            while not self.stop.is_set():
                if not self.run.is_set():
                    self.idle.set()
                    self.run.wait(0.1)
                    continue
                self.idle.clear()
                if time.monotonic() - last_ddl > 3:
                    self._ddl(cur)
                    last_ddl = time.monotonic()
                self._transaction(cur)
                time.sleep(0.005)
        self.idle.set()

    def _transaction(self, cur) -> None:
        rng = self.rng
        cur.execute("BEGIN")
        for _ in range(rng.randint(1, 5)):
            k = rng.randint(1, 300)
            roll = rng.random()
            if roll < 0.4:
                cur.execute(
                    "INSERT INTO acct (id, owner, balance) VALUES (%s, %s, %s) "
                    "ON DUPLICATE KEY UPDATE balance = balance + 1",
                    (k, f"owner {k}", rng.randint(0, 1000)),
                )
            elif roll < 0.65:
                cur.execute("UPDATE acct SET balance = balance - 1 WHERE id = %s", (k,))
            elif roll < 0.75:
                cur.execute("DELETE FROM acct WHERE id = %s", (k,))
            elif roll < 0.85:
                cur.execute("INSERT INTO ledger (a, note) VALUES (%s, 'dup')", (k % 9,))
            elif roll < 0.92:
                cur.execute("DELETE FROM ledger WHERE a = %s LIMIT 1", (k % 9,))
            else:
                cur.execute("INSERT INTO trunc (id, v) VALUES (%s, 1) ON DUPLICATE KEY UPDATE v = v + 1", (k % 40,))
        cur.execute("INSERT INTO events (id) VALUES (%s)", (self.next_event,))
        self.next_event += 1
        cur.execute("COMMIT")
        self.transactions += 1

    def _ddl(self, cur) -> None:
        roll = self.rng.random()
        if roll < 0.4:
            cur.execute("TRUNCATE TABLE trunc")
            cur.execute("INSERT INTO trunc (id, v) VALUES (1, 0), (2, 0)")
            self.ddl["TRUNCATE"] += 1
        elif roll < 0.6 and self.ddl["MODIFY COLUMN"] < len(WIDENING):
            cur.execute(f"ALTER TABLE wide MODIFY m {WIDENING[self.ddl['MODIFY COLUMN']]}")
            cur.execute("INSERT INTO wide (m) VALUES (%s)", (1000 * (self.ddl["MODIFY COLUMN"] + 1),))
            self.ddl["MODIFY COLUMN"] += 1
        else:
            n = self.ddl["ADD COLUMN"]
            cur.execute(f"ALTER TABLE wide ADD COLUMN x{n} INT DEFAULT {n}")
            cur.execute("INSERT INTO wide (m) VALUES (1)")
            self.ddl["ADD COLUMN"] += 1

    def resume(self) -> None:
        self.run.set()

    def pause(self) -> None:
        self.run.clear()
        self.idle.wait(60)
        while not self.idle.is_set():
            self.idle.wait(1)


def _footprint(lakehouse: Lakehouse) -> tuple[int, int, int]:
    """Raw batches, and the Delta versions of all change logs and of all current-state tables: what a run wrote."""

    def versions(layer: str) -> int:
        return sum(t.version() for t in (lakehouse.open(layer, ref) for ref in lakehouse.tables(layer)) if t is not None)

    return len(list_batches(lakehouse.store)), versions(CHANGES), versions(CURRENT)


def _landed(before: tuple[int, int, int], after: tuple[int, int, int]) -> str:
    """The furthest stage the killed run had written to."""
    if after[2] != before[2]:
        return "current state"
    if after[1] != before[1]:
        return "change logs"
    if after[0] != before[0]:
        return "capture"
    return "before any write"


@dataclass
class Round:
    killed_after: float  # seconds after the sync started
    landed: str  # the furthest stage the run had written to when it was killed
    killed: bool  # False: the sync ended by itself before the kill was due
    recovered_in: float  # the recovery sync's seconds
    outcome: str  # equal / lost / duplicated / clear error / failed
    detail: str = ""


def _env(server: local_server.LocalServer, base: Path) -> dict[str, str]:
    home = base / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_LAKEHOUSE": str((base / "lakehouse").resolve()),
        "CDC_TABLES": f"{SCHEMA}.*",
        "CDC_MAX_BATCH_ROWS": "100",  # small batches: a capture writes many, so kills land between them too
        "DAGSTER_HOME": str(home.resolve()),
    }


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *argv], env=env, capture_output=True, text=True, timeout=900)


def _prepare(server: local_server.LocalServer) -> None:
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        cur.execute(f"USE {SCHEMA}")
        cur.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
        cur.execute("CREATE TABLE ledger (a INT, note VARCHAR(10))")  # no primary key
        cur.execute("CREATE TABLE events (id INT PRIMARY KEY)")
        cur.execute("CREATE TABLE trunc (id INT PRIMARY KEY, v INT)")
        cur.execute("CREATE TABLE wide (id INT AUTO_INCREMENT PRIMARY KEY, m TINYINT)")


def _check(env: dict[str, str], lakehouse: Lakehouse) -> tuple[float, str, str]:
    """Recover (a sync, timed), then verify and the exactly-once oracle: (seconds, outcome, detail)."""
    began = time.monotonic()
    recovery = _cli(env, "sync")
    seconds = time.monotonic() - began
    if recovery.returncode != 0:
        lines = (recovery.stderr or recovery.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit {recovery.returncode}"
        return seconds, ("clear error" if recovery.returncode == 2 and len(lines) == 1 else "failed"), detail
    verify = _cli(env, "verify")
    once = check_exactly_once(lakehouse)
    if once.outcome != "exactly once":
        return seconds, once.outcome, once.describe()
    if verify.returncode != 0:
        return seconds, "lost", verify.stdout.strip()[-500:]  # a difference with every change logged once
    return seconds, "equal", once.describe()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    server = fresh_server(BASE)
    try:
        _prepare(server)
        env = _env(server, BASE)
        lakehouse = Lakehouse(env["CDC_LAKEHOUSE"])
        writer = Writer(server, args.seed)
        writer.thread.start()
        writer.resume()
        time.sleep(2)
        # The usual length of a sync under this load: kills are drawn within it.
        lengths = []
        for _ in range(2):
            began = time.monotonic()
            first = _cli(env, "sync")
            assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
            lengths.append(time.monotonic() - began)
        usual = statistics.median(lengths)
        writer.pause()
        seconds, outcome, detail = _check(env, lakehouse)
        assert outcome == "equal", detail
        print(f"a sync under load takes {usual:.1f} s; killing at random within {0.4 * usual:.1f}-{1.05 * usual:.1f} s")

        rounds: list[Round] = []
        failed_under_load: list[str] = []
        for n in range(args.kills):
            writer.resume()
            time.sleep(rng.uniform(0.2, 1.5))  # changes pile up before the sync starts
            delay = rng.uniform(0.4 * usual, 1.05 * usual)  # the first ~40% is the process starting (imports)
            before = _footprint(lakehouse)
            process = subprocess.Popen([CLI, "sync"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                ended = process.wait(timeout=delay)
                killed = False
                if ended != 0:  # a sync under a live workload must succeed when nothing stops it
                    failed_under_load.append(f"round {n + 1}: a sync under load that was not killed exited {ended}")
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGKILL)
                process.wait()
                killed = True
            writer.pause()
            landed = _landed(before, _footprint(lakehouse)) if killed else "ran to its end"
            seconds, outcome, detail = _check(env, lakehouse)
            rounds.append(Round(delay, landed, killed, seconds, outcome, detail))
            print(
                f"round {n + 1:3d}: {'SIGKILL' if killed else 'ran out '} at {delay:4.1f} s ({landed}) -> {outcome}, "
                f"recovered in {seconds:4.1f} s ({detail[:120]})",
                flush=True,
            )
        writer.stop.set()
        writer.run.set()
        writer.thread.join(30)
        _summary(rounds, writer, failed_under_load)
    finally:
        local_server.stop(BASE)


def _summary(rounds: list[Round], writer: Writer, failed_under_load: list[str]) -> None:
    kills = [r for r in rounds if r.killed]
    outcomes = Counter(r.outcome for r in rounds)
    times = [r.recovered_in for r in kills] or [0.0]
    print()
    print(f"workload: {writer.transactions} transactions, DDL {dict(writer.ddl)}")
    print("| injections (SIGKILL of sync) | syncs that ended before their kill | equal | lost | duplicated | clear error "
          "| failed | time to recover, median | max |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {len(kills)} | {len(rounds) - len(kills)} | {outcomes['equal']} | {outcomes['lost']} | "
        f"{outcomes['duplicated']} | {outcomes['clear error']} | {outcomes['failed']} | "
        f"{statistics.median(times):.1f} s | {max(times):.1f} s |"
    )
    print(f"kills landed (the furthest stage written to): {dict(Counter(r.landed for r in kills))}")
    bad = [r for r in rounds if r.outcome != "equal"]
    for r in bad:
        print(f"  {r.outcome} after a kill at {r.killed_after:.1f} s: {r.detail}")
    for line in failed_under_load:
        print(f"  {line}")
    raise SystemExit(1 if bad or failed_under_load else 0)


if __name__ == "__main__":
    main()
