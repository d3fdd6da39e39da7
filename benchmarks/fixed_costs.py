"""What a sync costs beyond its work: a sync with nothing to do beside `python -c 'import dagster'`, and a small
sync (20k row changes over 25 tables, from an empty lakehouse) beside the tutorial baseline's capture of the same
binlog.

    .venv/bin/python -m benchmarks.fixed_costs [--runs 5] [--tables 25] [--rows-per-table 400] [--oltp 10000]
        [--compare-with CHECKOUT]

`--compare-with CHECKOUT` also times the small sync and the no-op sync of another checkout of the project (its
`cdc_assets` put first on PYTHONPATH, the same interpreter and packages), alternated with this one's in the same
invocation, so both see the same machine load.

Every figure is the median of `--runs` runs, each a process of its own timed by a parent of its own (wall time,
interpreter start-up included, as a user sees it), except the baseline's loop, which the baseline times itself
after its imports (the issue's reference); its whole process is timed from outside too. The small sync runs on a fresh lakehouse and Dagster home each
time; the no-op syncs run on the lakehouse the last of them left, with nothing new in the binlog.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks.run import BASELINE, child, timed
from benchmarks.workloads import CLI, fresh_server, generated, remove_work, source_env, workload_options

READER_SERVER_ID = 4246


# `cdc-lakehouse` as another checkout's own console script would start it (its `run`, or `main` before there was one):
# the installed script names this checkout's entry point, which another checkout may not have.
OTHER_CLI = "import sys\nfrom cdc_assets import cli\nsys.exit(getattr(cli, 'run', cli.main)())"


def _sync(env: dict[str, str], other: bool = False) -> dict:
    done = timed(env, sys.executable, "-c", OTHER_CLI, "sync") if other else timed(env, CLI, "sync")
    if done["code"] != 0:
        raise SystemExit(f"sync failed:\n{done['out']}{done['err']}")
    printed = [line for line in done["out"].splitlines() if line.startswith("sync succeeded in ")]
    return {**done, "printed": printed[-1] if printed else "?"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_options(parser, runs=5, tables=25, rows_per_table=400, oltp=10_000)
    parser.add_argument("--compare-with", metavar="CHECKOUT", help="another checkout whose syncs are timed alternately")
    args = parser.parse_args()

    server = fresh_server()
    workload = generated(server, args, "small sync")
    env = source_env(server, READER_SERVER_ID)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    other_env = None
    if args.compare_with:
        other = os.path.abspath(args.compare_with)
        other_env = {**env, "PYTHONPATH": os.pathsep.join([other, *filter(None, [os.environ.get("PYTHONPATH")])])}
    work = tempfile.mkdtemp(prefix="cdc-bench-fixed-")  # every sync's lakehouse and Dagster home, removed at the end
    runs: dict[str, list[float]] = {
        "baseline": [], "baseline_process": [], "sync": [], "noop": [], "import": [], "other_sync": [], "other_noop": []
    }
    other_sync_env: dict[str, str] = {}
    for i in range(args.runs):
        out = tempfile.mkdtemp(prefix="cdc-bench-fixed-baseline-", dir=work)
        began = time.monotonic()
        baseline = child(BASELINE.format(server_id=READER_SERVER_ID), {**env, "OUT_DIR": out})
        runs["baseline_process"].append(time.monotonic() - began)  # its process as a whole, as the sync is timed
        runs["baseline"].append(baseline["seconds"])
        sync_env = {
            **env,
            "CDC_LAKEHOUSE": tempfile.mkdtemp(prefix="cdc-bench-fixed-lake-", dir=work),
            "DAGSTER_HOME": tempfile.mkdtemp(prefix="cdc-bench-fixed-dh-", dir=work),
        }
        sync = _sync(sync_env)
        runs["sync"].append(sync["seconds"])
        compared = ""
        if other_env is not None:
            other_sync_env = {
                **other_env,
                "CDC_LAKEHOUSE": tempfile.mkdtemp(prefix="cdc-bench-fixed-lake-", dir=work),
                "DAGSTER_HOME": tempfile.mkdtemp(prefix="cdc-bench-fixed-dh-", dir=work),
            }
            other_sync = _sync(other_sync_env, other=True)
            runs["other_sync"].append(other_sync["seconds"])
            compared = f"; {args.compare_with}'s sync {other_sync['seconds']:.2f} s"
        print(
            f"  run {i + 1}: baseline capture {baseline['rows']} rows in {baseline['seconds']:.2f} s "
            f"({runs['baseline_process'][-1]:.2f} s its whole process); "
            f"sync {sync['seconds']:.2f} s ({sync['printed']}){compared}",
            flush=True,
        )
    for i in range(args.runs):
        noop = _sync(sync_env)
        imported = timed(env, sys.executable, "-c", "import dagster")
        runs["noop"].append(noop["seconds"])
        runs["import"].append(imported["seconds"])
        compared = ""
        if other_env is not None:
            other_noop = _sync(other_sync_env, other=True)
            runs["other_noop"].append(other_noop["seconds"])
            compared = f"; {args.compare_with}'s no-op sync {other_noop['seconds']:.2f} s"
        print(
            f"  run {i + 1}: no-op sync {noop['seconds']:.2f} s ({noop['printed']}); "
            f"python -c 'import dagster' {imported['seconds']:.2f} s{compared}",
            flush=True,
        )

    def median(name: str) -> float:
        return statistics.median(runs[name])

    rows = [
        ("a sync with nothing to do (s)", "python -c 'import dagster'", median("import"), median("noop")),
        (
            f"a small sync from an empty lakehouse: {workload.row_changes} row changes, {workload.tables} tables (s)",
            "tutorial baseline capture (its loop, timed inside its process)",
            median("baseline"),
            median("sync"),
        ),
        (
            "the same small sync (s)",
            "tutorial baseline capture as a whole process (interpreter and imports included, as the sync)",
            median("baseline_process"),
            median("sync"),
        ),
    ]
    if other_env is not None:
        rows += [
            (f"{args.compare_with}: a sync with nothing to do (s)", "python -c 'import dagster'", median("import"), median("other_noop")),
            (
                f"{args.compare_with}: the small sync (s)",
                "tutorial baseline capture (its loop, timed inside its process)",
                median("baseline"),
                median("other_sync"),
            ),
        ]
    print()
    print("| figure | reference | reference (s) | cdc-lakehouse (s) | ratio |")
    print("|---|---|---|---|---|")
    for figure, reference, base, ours in rows:
        print(f"| {figure} | {reference} | {base:.2f} | {ours:.2f} | {ours / base:.2f} |")
    remove_work(work)


if __name__ == "__main__":
    main()
