"""Issue 45's measure: what a sync costs as the same changes spread over more tables.

    .venv/bin/python -m benchmarks.table_count [--tables 20,200,1000] [--rows-per-table 100] [--changes 8000]

For each table count N, on a fresh MariaDB (its binlog holds only this N's work): N tables of `--rows-per-table`
rows each; a first `cdc-lakehouse sync` from an empty lakehouse, with the tutorial baseline's capture of the same
binlog beside it; then `--changes` single-row autocommit transactions (workload (a)'s mix: 40% UPDATE, 30% INSERT,
30% DELETE) spread at random over the N tables, and an incremental `sync -v`, which also says where its time went.
Each sync and the baseline are whole processes, timed by a parent (interpreter start-up included), on the default
settings: Arrow, a local lakehouse.
`verify` then confirms each lakehouse equal to its source. The ratios are each N's against the smallest N's, taken
in this one invocation. The issue's targets: an incremental sync over 1,000 tables at most 2.0x the same over 20,
over 10,000 at most 5x, and a first sync of 1,000 tables no slower than the baseline.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.run import BASELINE, child, timed
from benchmarks.workloads import CLI, fresh_server, mixed_tables, more_oltp, remove_work, source_env

READER_SERVER_ID = 4250


def _sync(env: dict[str, str], *flags: str) -> tuple[float, str]:
    """A sync's wall seconds, and the line of `sync -v` that says where its time went (empty without -v)."""
    done = timed(env, CLI, "sync", *flags)
    if done["code"] != 0:
        raise SystemExit(f"sync failed:\n{done['out']}{done['err']}")
    split = [line for line in done["out"].splitlines() if "where the time went: " in line]
    return float(done["seconds"]), split[-1].split("where the time went: ", 1)[1] if split else ""


def measure(tables: int, rows_per_table: int, changes: int, work: str) -> dict[str, float]:
    """One table count's figures: the first sync, the baseline's capture of the same binlog, the incremental sync."""
    server = fresh_server()
    began = time.monotonic()
    mixed_tables(server, tables, rows_per_table, 0)
    print(f"{tables} tables of {rows_per_table} rows generated in {time.monotonic() - began:.0f} s", flush=True)
    env = {
        **source_env(server, READER_SERVER_ID),
        "CDC_LAKEHOUSE": tempfile.mkdtemp(prefix=f"lake-{tables}-", dir=work),
        "DAGSTER_HOME": tempfile.mkdtemp(prefix=f"dh-{tables}-", dir=work),
    }
    began = time.monotonic()  # the baseline's whole process, as the sync's: like with like
    child(BASELINE.format(server_id=READER_SERVER_ID), {**env, "OUT_DIR": tempfile.mkdtemp(dir=work)})
    baseline = time.monotonic() - began
    first, _ = _sync(env)
    began = time.monotonic()
    more_oltp(server, tables, changes)
    print(f"{changes} single-row transactions over {tables} tables written in {time.monotonic() - began:.0f} s", flush=True)
    incremental, split = _sync(env, "-v")  # -v: the same sync, which also says where its time went
    verified = timed(env, CLI, "verify")
    if verified["code"] != 0:
        raise SystemExit(f"verify failed after the syncs of {tables} tables:\n{verified['out']}{verified['err']}")
    figures = {"first": first, "baseline": baseline, "incremental": incremental}
    print(
        f"  {tables} tables: first sync {first:.1f} s (baseline capture {figures['baseline']:.1f} s), "
        f"incremental sync of {changes} changes {incremental:.1f} s; verify: equal\n"
        f"    where the incremental sync's time went: {split}",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default="20,200,1000", help="comma-separated table counts, smallest first")
    parser.add_argument("--rows-per-table", type=int, default=100)
    parser.add_argument("--changes", type=int, default=8_000)
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.tables.split(","))
    work = tempfile.mkdtemp(prefix="cdc-bench-tables-")
    kept_for = None
    try:
        results = {n: measure(n, args.rows_per_table, args.changes, work) for n in counts}
    except BaseException:
        kept_for = "a run failed"
        raise
    finally:
        remove_work(work, kept_for)
    smallest = results[counts[0]]
    print()
    print(f"| tables | first sync (s) | baseline capture (s) | first / baseline | incremental sync, {args.changes} changes (s) | incremental / {counts[0]} tables |")
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        print(
            f"| {n:,} | {r['first']:.1f} | {r['baseline']:.1f} | {r['first'] / r['baseline']:.2f} | "
            f"{r['incremental']:.1f} | {r['incremental'] / smallest['incremental']:.2f}x |"
        )
    print(f"\nmachine: {os.cpu_count()} cores; each figure one run")


if __name__ == "__main__":
    main()
