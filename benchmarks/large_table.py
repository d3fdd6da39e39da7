"""Workload (b): 10k changes applied to a 1M-row table and to a 10M-row table.

    .venv/bin/python -m benchmarks.large_table [--runs 3] [--sizes 1000000,10000000] [--changes 10000]

For each size, a table of N rows is made in the benchmark's MariaDB (INSERT ... SELECT from a sequence,
kept out of the binlog) and loaded into current state by `cdc-lakehouse snapshot` (streamed, in key order,
4 MB files). Then 10k changes hit it (40% updates, 30% inserts, 30% deletes, ten to a transaction) and
are captured once. Each run applies them to a fresh copy of that lakehouse in a child process of its own:
the change-log stage, then the current-state stage (the MERGE), timed apart.

Two change patterns, each on its own table:
  recent   updates and deletes among the newest 100k keys, inserts past the end: the common OLTP pattern,
           where a merge rewrites only the files of the key range it touches;
  uniform  updates and deletes anywhere in the table: every file holds some changed key, so any
           copy-on-write layout rewrites the whole table.
The ratio is the 10M-row table's current-state seconds over the 1M-row table's, per pattern (target ≤ 2).
Last, each prepared lakehouse is brought up to date by `sync` (with every asset check, the equality check over
the whole table among them) and checked by `verify`: seconds and peak memory of each.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.run import child, timed
from benchmarks.workloads import CLI, fresh_server
from cdc_assets.local_source import server as local_server

SCHEMA = "bench_b"
READER_SERVER_ID = 4243
HOT_KEYS = 100_000
PATTERNS = ("recent", "uniform")

APPLY = (
    "import os, time\n"
    "from spark_resources.resources import LazySparkResource\n"
    "from cdc_assets.core.names import TableRef\n"
    "from cdc_assets.defs.resources import initialized_resources\n"
    "from cdc_assets.lake.layout import CURRENT\n"
    "from cdc_assets.stages.changes.run import process_new_batches\n"
    "from cdc_assets.stages.current.run import apply_pending\n"
    "from spark_resources.resources import TransformsResource\n"
    "from spark_resources.session import spark_config\n"
    "lakehouse = initialized_resources().lakehouse.get()\n"
    "spark = TransformsResource(pyspark=LazySparkResource(spark_config=spark_config('local[2]')))\n"
    "began = time.monotonic()\n"
    "changes = process_new_batches(lakehouse, spark.for_changes)\n"
    "middle = time.monotonic()\n"
    "current = apply_pending(lakehouse, spark.for_changes)\n"
    "done = time.monotonic()\n"
    "table = lakehouse.open(CURRENT, TableRef.parse(os.environ['TABLE']))\n"
    "metrics = table.history(1)[0].get('operationMetrics', {})\n"
    "out = {'changes_s': middle - began, 'current_s': done - middle,\n"
    "    'changes_in': sum(r.changes_in for r in current.applied), 'files': len(table.file_uris()),\n"
    "    'files_rewritten': metrics.get('num_target_files_removed'), 'rows_copied': metrics.get('num_target_rows_copied')}\n"
)
CAPTURE = (
    "import os\nfrom cdc_assets.capture.run import capture\nfrom cdc_assets.lake.store import Lakehouse\n"
    "from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter\n"
    "settings = SourceSettings(MySQLUrl.parse(os.environ['CDC_MYSQL_URL']), int(os.environ['CDC_SERVER_ID']),\n"
    "    TableFilter.parse(os.environ['CDC_TABLES'], None))\n"
    "capture(settings, Lakehouse(os.environ['CDC_LAKEHOUSE']))\n"
)


def _table_env(env: dict[str, str], work: Path, table: str) -> dict[str, str]:
    """The environment of the CLI for one benchmark table: its own lakehouse and Dagster home under `work`."""
    return {
        **env,
        "CDC_TABLES": f"{SCHEMA}.{table}",
        "CDC_LAKEHOUSE": str(work / table),
        "DAGSTER_HOME": str(work / f"{table}-dh"),
    }


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"cdc-lakehouse {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done.stdout


def make_table(server: local_server.LocalServer, table: str, rows: int, schema: str = SCHEMA) -> None:
    """N rows in key order, written without the binlog (the snapshot is what brings them to the lakehouse)."""
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"USE {schema}")  # where the seq_1_to_N tables of the Sequence engine are found
        cur.execute(
            f"CREATE TABLE {schema}.{table} (id BIGINT PRIMARY KEY, account INT NOT NULL, amount DECIMAL(12,2), "
            "status VARCHAR(16), updated DATETIME(6), note VARCHAR(64))"
        )
        step = 1_000_000
        for start in range(0, rows, step):
            count = min(step, rows - start)
            cur.execute(
                f"INSERT INTO {schema}.{table} SELECT seq, seq % 100000, (seq % 100000) / 100, "
                "ELT(1 + seq % 4, 'new', 'paid', 'shipped', 'closed'), "
                "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND, CONCAT('row ', seq) "
                f"FROM seq_{start + 1}_to_{start + count}"
            )


def write_changes(server: local_server.LocalServer, table: str, rows: int, changes: int, pattern: str, seed: int) -> None:
    """`changes` row changes, ten to a transaction: updates and deletes on existing keys, inserts past the end."""
    rng = random.Random(seed)
    hot = list(range(max(1, rows - HOT_KEYS + 1), rows + 1)) if pattern == "recent" else None
    deleted: set[int] = set()
    next_id = rows + 1

    def existing_key(remove: bool) -> int:
        if hot is not None:
            i = rng.randrange(len(hot))
            key = hot[i]
            if remove:
                hot[i] = hot[-1]
                hot.pop()
            return key
        key = rng.randint(1, rows)
        while key in deleted:
            key = rng.randint(1, rows)
        if remove:
            deleted.add(key)
        return key

    with server.admin_connection(autocommit=False) as conn, conn.cursor() as cur:
        for done in range(changes):
            roll = rng.random()
            if roll < 0.3:
                cur.execute(f"INSERT INTO {SCHEMA}.{table} VALUES (%s, 1, 1.00, 'new', NOW(6), 'inserted')", (next_id,))
                next_id += 1
            elif roll < 0.7:
                cur.execute(
                    f"UPDATE {SCHEMA}.{table} SET amount = amount + 1, status = 'paid', updated = NOW(6) WHERE id = %s",
                    (existing_key(remove=False),),
                )
            else:
                cur.execute(f"DELETE FROM {SCHEMA}.{table} WHERE id = %s", (existing_key(remove=True),))
            if done % 10 == 9:
                conn.commit()
        conn.commit()


def _apply_run(env: dict[str, str], prepared: Path, table: str) -> dict:
    lakehouse = Path(tempfile.mkdtemp(prefix="cdc-bench-b-"))
    shutil.rmtree(lakehouse)
    shutil.copytree(prepared, lakehouse)
    try:
        return child(APPLY, {**env, "CDC_LAKEHOUSE": str(lakehouse), "TABLE": f"{SCHEMA}.{table}"}, timeout=7200)
    finally:
        shutil.rmtree(lakehouse, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    patterns = [p for p in args.patterns.split(",") if p]

    server = fresh_server()
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-b-work-"))
    env = {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_SERVER_ID": str(READER_SERVER_ID),
        "CDC_SPARK_MASTER": os.environ.get("CDC_SPARK_MASTER", "local[2]"),
    }
    results: dict[tuple[str, int], list[dict]] = {}
    for pattern in patterns:
        for size in sizes:
            table = f"{pattern}_{size}"
            began = time.monotonic()
            make_table(server, table, size)
            made = time.monotonic()
            table_env = _table_env(env, work, table)
            _cli(table_env, "snapshot")
            loaded = time.monotonic()
            write_changes(server, table, size, args.changes, pattern, seed=size)
            subprocess.run([sys.executable, "-c", CAPTURE], env=table_env, check=True, timeout=3600)
            print(
                f"{pattern} {size:,} rows: table made in {made - began:.0f} s, snapshot {loaded - made:.0f} s, "
                f"{args.changes} changes captured",
                flush=True,
            )
            runs = results[(pattern, size)] = []
            for i in range(args.runs):
                runs.append(_apply_run(table_env, work / table, table))
                r = runs[-1]
                print(
                    f"  run {i + 1}: change logs {r['changes_s']:.2f} s, current state {r['current_s']:.2f} s "
                    f"({r['changes_in']} changes, {r['files_rewritten']} of {r['files']} files rewritten, "
                    f"{r['rows_copied']} rows copied, peak {r['peak_mb']:.0f} MB)",
                    flush=True,
                )
            shutil.rmtree(work / f"{table}-dh", ignore_errors=True)
    checked = _sync_and_verify(env, work, patterns, sizes)
    print(f"\nmedians of {args.runs} runs, {args.changes} changes each")
    print(
        "| pattern | table rows | change logs (s) | current state (s) | both (s) | files rewritten | rows copied "
        "| current state, ratio to the smallest | both, ratio | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pattern in patterns:
        smallest = results[(pattern, sizes[0])]
        base = statistics.median(r["current_s"] for r in smallest)
        base_both = statistics.median(r["current_s"] + r["changes_s"] for r in smallest)
        for size in sizes:
            runs = results[(pattern, size)]
            current = statistics.median(r["current_s"] for r in runs)
            both = statistics.median(r["current_s"] + r["changes_s"] for r in runs)
            print(
                f"| {pattern} | {size:,} | {statistics.median(r['changes_s'] for r in runs):.2f} | {current:.2f} | "
                f"{both:.2f} | {runs[0]['files_rewritten']} of {runs[0]['files']} | {runs[0]['rows_copied']:,} | "
                f"{current / base:.2f} | {both / base_both:.2f} | {'≤ 2' if size != sizes[0] else ''} |"
            )
    print("\nthen each lakehouse synced (the changes applied and every asset check run) and verified, once each")
    print("| pattern | table rows | sync (s) | sync peak RSS (MB) | verify (s) | verify peak RSS (MB) | verify says |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(checked))
    shutil.rmtree(work, ignore_errors=True)


def _sync_and_verify(env: dict[str, str], work: Path, patterns: list[str], sizes: list[int]) -> list[str]:
    """Each prepared lakehouse brought up to date by `sync` (the change logs, the current state and the asset
    checks, among them the equality check over the whole table), then `verify` in a process of its own: both
    compare every row with the source, in buckets beyond 500k rows, so their memory must not grow with the
    table. Returns the lines of a results table."""
    lines = []
    for pattern in patterns:
        for size in sizes:
            table = f"{pattern}_{size}"
            table_env = _table_env(env, work, table)
            sync, verify = timed(table_env, CLI, "sync"), timed(table_env, CLI, "verify")
            for name, done in (("sync", sync), ("verify", verify)):
                if done["code"] != 0:
                    raise SystemExit(f"{name} of {table} failed:\n{done['out']}{done['err']}")
            verdict = verify["out"].strip().splitlines()[-1]
            print(f"{table}: sync {sync['seconds']:.1f} s, verify {verify['seconds']:.1f} s: {verdict}", flush=True)
            lines.append(
                f"| {pattern} | {size:,} | {sync['seconds']:.1f} | {sync['peak_mb']:,.0f} | {verify['seconds']:.1f} "
                f"| {verify['peak_mb']:,.0f} | {verdict} |"
            )
    return lines


if __name__ == "__main__":
    main()
