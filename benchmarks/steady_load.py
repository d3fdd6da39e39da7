"""Workload (c): a steady 1,000 row changes/s while the pipeline runs hands-off; commit-to-current-state latency.

    .venv/bin/python -m benchmarks.steady_load [--runs 3] [--seconds 180] [--rate 1000]

`dagster dev` (webserver and daemon) runs the pipeline by itself: the binlog sensor captures every
CDC_CAPTURE_INTERVAL_SECONDS (5 s here), the raw-batch sensor requests the apply runs, each run is a process
of its own. Meanwhile a writer commits `rate` row changes per second, ten to a transaction: nine inserts,
updates or deletes over 20 tables and one row into `ticks` holding its own commit time. A probe reads
current/…/ticks every second: a tick's latency is when it was first seen there minus when it was committed.
Every figure is the median over `runs` windows of `seconds` each; the pipeline's memory is the most that all
its processes (dagster dev, daemon, code server, runs) held at once, sampled every second. At the end every
table is verified against the source.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.workloads import CLI, fresh_server, remove_work
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server

SCHEMA = "bench_c"
TABLES = 20
READER_SERVER_ID = 4244
REPO = Path(__file__).resolve().parent.parent


def pipeline_env(
    server: local_server.LocalServer, work: Path, server_id: int = READER_SERVER_ID, spark_master: str | None = None
) -> dict[str, str]:
    """The environment of a pipeline over this workload's tables: the source (read as replica `server_id`), a
    lakehouse and a Dagster home under `work`, Spark on `spark_master` (by default CDC_SPARK_MASTER, else local[2])."""
    return {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_TABLES": f"{SCHEMA}.*",
        "CDC_SERVER_ID": str(server_id),
        "CDC_LAKEHOUSE": str(work / "lakehouse"),
        "DAGSTER_HOME": str(work / "dagster_home"),
        "CDC_SPARK_MASTER": spark_master or os.environ.get("CDC_SPARK_MASTER", "local[2]"),
    }


def _prepare(server: local_server.LocalServer, tables: int = TABLES) -> None:
    """The schema: `ticks` and `tables` tables t00, t01, … of 1,000 rows each."""
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        cur.execute(f"CREATE TABLE {SCHEMA}.ticks (id BIGINT AUTO_INCREMENT PRIMARY KEY, committed_at DATETIME(6))")
        for t in range(tables):
            cur.execute(
                f"CREATE TABLE {SCHEMA}.t{t:02d} (id INT PRIMARY KEY, v INT, note VARCHAR(40), updated DATETIME(6))"
            )
            values = ", ".join(f"({i}, {i}, 'row {i}', NOW(6))" for i in range(1000))
            cur.execute(f"INSERT INTO {SCHEMA}.t{t:02d} VALUES {values}")


@dataclass(frozen=True)
class BigTable:
    """A large table written as one more of the writer's tables (benchmarks/continuous.py): made by
    benchmarks.large_table.make_table (`id BIGINT` key 1..rows and five columns)."""

    name: str
    rows: int


def _write(
    server: local_server.LocalServer, rate: int, seconds: float, seed: int, big: BigTable | None = None,
    tables: int = TABLES,
) -> tuple[int, float]:  # fmt: skip
    """Row changes at `rate` per second for `seconds`, ten to a transaction, over the first `tables` tables; returns
    (changes, seconds taken).

    With `big`, it is one table more among those the nine changes of a transaction are spread over (its share:
    one in tables + 1): updates and deletes of keys drawn uniformly from its whole key range (the worst case for
    a copy-on-write current state: every file is as likely to be hit), inserts past its end."""
    rng = random.Random(seed)
    next_id = {t: 1000 + seed * 1_000_000 for t in range(tables)}
    if big is not None:
        next_id[tables] = big.rows + 1 + seed * 1_000_000
    transactions = rate // 10
    began = time.monotonic()
    written = 0
    with server.admin_connection(autocommit=False) as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        for n in range(int(transactions * seconds)):
            due = began + n / transactions
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            for _ in range(9):
                t = rng.randrange(tables + (1 if big is not None else 0))
                roll = rng.random()
                if t == tables and big is not None:
                    _big_change(cur, big, roll, rng.randint(1, big.rows), next_id, tables)
                elif roll < 0.4:
                    cur.execute(
                        f"UPDATE {SCHEMA}.t{t:02d} SET v = v + 1, updated = NOW(6) WHERE id = %s",
                        (rng.randrange(1000),),
                    )
                elif roll < 0.7:
                    cur.execute(f"INSERT INTO {SCHEMA}.t{t:02d} VALUES (%s, 0, 'new', NOW(6))", (next_id[t],))
                    next_id[t] += 1
                else:
                    cur.execute(f"DELETE FROM {SCHEMA}.t{t:02d} WHERE id = %s", (next_id[t] - 1,))
            cur.execute(f"INSERT INTO {SCHEMA}.ticks (committed_at) VALUES (NOW(6))")
            conn.commit()
            written += 10
    return written, time.monotonic() - began


def _big_change(cur: Any, big: BigTable, roll: float, key: int, next_id: dict[int, int], slot: int = TABLES) -> None:
    """One change of the big table: 40% updates and 30% deletes of `key` (uniform over its range), 30% inserts
    (its next id is `next_id[slot]`)."""
    table = f"{SCHEMA}.{big.name}"
    if roll < 0.4:
        cur.execute(f"UPDATE {table} SET amount = amount + 1, status = 'paid', updated = NOW(6) WHERE id = %s", (key,))
    elif roll < 0.7:
        cur.execute(f"INSERT INTO {table} VALUES (%s, 1, 1.00, 'new', NOW(6), 'inserted')", (next_id[slot],))
        next_id[slot] += 1
    else:
        cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))


class Probe:
    """Reads the ticks' current state every `every` seconds; a tick's latency is first seen minus committed."""

    def __init__(self, lakehouse: Lakehouse, every: float = 1.0) -> None:
        self.lakehouse, self.every = lakehouse, every
        self.latencies: dict[int, float] = {}
        self.last_id = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        ticks = TableRef(SCHEMA, "ticks")
        while not self._stop.wait(self.every):
            table = self.lakehouse.open(CURRENT, ticks)
            if table is None:
                continue
            seen = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            rows = read_query(table, f"SELECT id, committed_at FROM t WHERE id > {self.last_id}")
            for tick, committed in zip(
                rows.column("id").to_pylist(), rows.column("committed_at").to_pylist(), strict=True
            ):
                self.latencies[tick] = (seen - committed).total_seconds()
                self.last_id = max(self.last_id, tick)


def _group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in a process group, in MB."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[2]) != pgid:
                continue
            total += int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e6


class MemorySampler(threading.Thread):
    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.peak_mb, self._stopping = pgid, 0.0, threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(1.0):
            self.peak_mb = max(self.peak_mb, _group_rss_mb(self.pgid))

    def stop(self) -> None:
        self._stopping.set()
        self.join()


def _wait_for(what: str, condition, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--rate", type=int, default=1000)
    args = parser.parse_args()

    server = fresh_server()
    _prepare(server)
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-c-"))
    lakehouse = Lakehouse(str(work / "lakehouse"))
    env = {
        **pipeline_env(server, work),
        "CDC_CAPTURE_INTERVAL_SECONDS": os.environ.get("CDC_CAPTURE_INTERVAL_SECONDS", "2"),
        "DAGSTER_EVENT_BATCH_SIZE": "1000",
    }
    subprocess.run([CLI, "sync"], env=env, check=True, capture_output=True, timeout=600)
    port = local_server.free_port()
    dev = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster"),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(work / "dagster-dev.log").open("wb"),
        start_new_session=True,
        # dagster dev started from a script ignores SIGINT/SIGTERM unless they are reset to the default
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
    )
    memory = MemorySampler(dev.pid)
    probe = Probe(lakehouse)
    results = []
    try:
        _wait_for("dagster dev to listen", lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 120)
        memory.start()
        probe.start()
        for run in range(args.runs):
            first = probe.last_id + 1
            changes, took = _write(server, args.rate, args.seconds, seed=run + 1)
            with server.admin_connection() as conn, conn.cursor() as cur:
                cur.execute(f"SELECT MAX(id) FROM {SCHEMA}.ticks")
                last = int(cur.fetchone()[0])
            _wait_for("the pipeline to catch up", lambda last=last: probe.last_id >= last, 300)
            latencies = sorted(v for k, v in probe.latencies.items() if first <= k <= last)
            results.append(
                {
                    "rate": changes / took,
                    "p50": statistics.median(latencies),
                    "p95": latencies[int(0.95 * (len(latencies) - 1))],
                    "max": latencies[-1],
                    "ticks": len(latencies),
                }
            )
            r = results[-1]
            print(
                f"  run {run + 1}: {r['rate']:.0f} changes/s for {took:.0f} s; latency p50 {r['p50']:.1f} s, "
                f"p95 {r['p95']:.1f} s, max {r['max']:.1f} s over {r['ticks']} ticks; pipeline peak {memory.peak_mb:.0f} MB",
                flush=True,
            )
    finally:
        os.killpg(dev.pid, signal.SIGKILL)  # first: nothing below may leave the pipeline running
        dev.wait(timeout=60)
        probe.stop()
        memory.stop()
    verified = subprocess.run([CLI, "verify"], env=env, capture_output=True, text=True, timeout=600)
    print(verified.stdout.strip().splitlines()[-1] if verified.stdout.strip() else verified.stderr[-500:])
    print(f"\nmedians of {args.runs} runs of {args.seconds:.0f} s at {args.rate} changes/s, hands-off (dagster dev)")
    print("| figure | value | target |")
    print("|---|---|---|")
    print(f"| changes/s written | {statistics.median(r['rate'] for r in results):,.0f} | 1,000 |")
    print(f"| commit to current state, p50 (s) | {statistics.median(r['p50'] for r in results):.1f} | |")
    print(f"| commit to current state, p95 (s) | {statistics.median(r['p95'] for r in results):.1f} | ≤ 30 |")
    print(f"| commit to current state, max (s) | {statistics.median(r['max'] for r in results):.1f} | |")
    print(f"| pipeline peak memory, all processes (MB) | {memory.peak_mb:,.0f} | ≤ 2,000 |")
    remove_work(work, "verify found differences" if verified.returncode != 0 else None)
    if verified.returncode != 0:
        raise SystemExit("verify found differences after the steady load")


if __name__ == "__main__":
    main()
