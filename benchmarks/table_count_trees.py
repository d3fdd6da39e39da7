"""Issue 45: a change's before and after on the incremental sync over many tables, on the same binlog.

    .venv/bin/python -m benchmarks.table_count_trees --before REV [--after HEAD] [--tables 200] [--rounds 4]
        [--rows-per-table 100] [--changes 8000]

`benchmarks.table_count` measures one revision on a fresh server per table count; on this machine the same sync
moves by 30% from one hour to the next, more than most changes to a per-table cost. Here both revisions read one
server's binlog, each as a replica of its own into a lakehouse of its own: `--tables` tables of `--rows-per-table`
rows, a first `cdc-lakehouse sync` of each, then `--rounds` rounds of `--changes` single-row transactions (workload
(a)'s mix) spread over the tables, each followed by an incremental sync of each revision, the two taking turns at
going first. Every sync is a whole process whose imports come from its revision's exported folder (as
`benchmarks.two_trees`); `verify` then finds each lakehouse equal to the source. Ratios are after over before, per
round (the same changes) and of the sums: below 1 is faster.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from benchmarks.table_count import timed_sync
from benchmarks.two_trees import exported
from benchmarks.workloads import CLI, fresh_server, mixed_tables, more_oltp, remove_work, source_env

BEFORE_SERVER_ID, AFTER_SERVER_ID = 4350, 4351


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the revision before the change (a commit, a branch)")
    parser.add_argument("--after", default="HEAD", help="the revision after it (default HEAD)")
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows-per-table", type=int, default=100)
    parser.add_argument("--changes", type=int, default=8_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-table-trees-"))
    kept_for = None
    try:
        trees = [exported(args.before, work / "before"), exported(args.after, work / "after")]
        server = fresh_server()
        mixed_tables(server, args.tables, args.rows_per_table, 0)
        envs = [
            {
                **source_env(server, server_id), "PYTHONPATH": str(tree),
                "CDC_LAKEHOUSE": str(work / f"lake-{server_id}"), "DAGSTER_HOME": tempfile.mkdtemp(dir=work),
            }  # fmt: skip
            for (_, tree), server_id in zip(trees, (BEFORE_SERVER_ID, AFTER_SERVER_ID), strict=True)
        ]
        for env in envs:
            timed_sync(env)
        seconds: list[list[float]] = [[], []]
        for round_ in range(args.rounds):
            more_oltp(server, args.tables, args.changes, seed=round_)
            order = [0, 1] if round_ % 2 == 0 else [1, 0]
            for i in order:
                seconds[i].append(timed_sync(envs[i])[0])
            print(f"  round {round_ + 1}: before {seconds[0][-1]:.1f} s, after {seconds[1][-1]:.1f} s", flush=True)
        for env in envs:
            verified = subprocess.run([CLI, "verify"], env=env, capture_output=True, text=True, timeout=7200)
            if verified.returncode != 0:
                raise SystemExit(f"verify failed:\n{verified.stdout[-2000:]}{verified.stderr[-3000:]}")
    except BaseException:
        kept_for = "a run failed"
        raise
    finally:
        remove_work(work, kept_for)
    (before, _), (after, _) = trees
    print()
    print(f"| round | before ({before}) incremental sync over {args.tables} tables (s) | after ({after}) (s) | after / before |")
    print("|---|---|---|---|")
    for i, (b, a) in enumerate(zip(*seconds, strict=True), start=1):
        print(f"| {i} | {b:.1f} | {a:.1f} | {a / b:.2f} |")
    print(f"| sum | {sum(seconds[0]):.1f} | {sum(seconds[1]):.1f} | {sum(seconds[1]) / sum(seconds[0]):.2f} |")
    print(f"\nmachine: {os.cpu_count()} cores; {args.changes} single-row transactions a round; verify: both equal")


if __name__ == "__main__":
    main()
