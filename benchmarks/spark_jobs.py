"""How many Spark jobs each stage runs, and how long each phase takes, for a few tables and for many.

    .venv/bin/python -m benchmarks.spark_jobs [--tables 2,20,200] [--rows-per-table 200] [--oltp 2000]
        [--master local[2] | --workers 2] [--tasks-per-core 32,2 | --direct-max-batches 0,4 [--turns 2]]

For each table count, workload (a)'s shape (benchmarks.workloads.mixed_tables: a bulk load, then single-row OLTP
transactions over every table) is written to a fresh MariaDB, captured, and taken through the change-log and
current-state stages on Spark (every stage run pinned to Spark, whatever its size), from an empty lakehouse and
then once more for a second round of transactions (an incremental run). The job counts are Spark's own: the jobs
its status tracker knows of after each phase, less those before it (every job the run submits, from any thread).
A stage whose job count grows with the number of tables pays Spark's fixed cost per job that many times over.

`--workers N` starts a standalone cluster of N one-core workers (cdc_assets.local_spark.cluster) and runs on it.
`--tasks-per-core a,b` measures each table count under each value of spark_resources.transforms.TASKS_PER_CORE in
turn, in the same session (`--turns` times over, alternating): 32 per core on two cores is the 64 tasks a job over
many small items had before task_count; the seconds then compare the tasks' fixed cost within one invocation.
`--direct-max-batches a,b` does the same with cdc_assets.stages.changes.spark_tasks.DIRECT_MAX_BATCHES: 0 makes every
change-log stage run hand its rows through a shuffle by table; 4 lets a run of up to 4 raw batches write from its
read tasks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.workloads import BENCH_DIR, SCHEMA, fresh_server, mixed_tables, more_oltp, remove_work

READER_SERVER_ID = 4444


def jobs_so_far(spark: Any) -> int:
    """Every job the application has run (status tracker: jobs of no job group, which ours all are, are numbered from
    0 as they start; it keeps only the newest thousand, so the highest number counts them)."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1) + 1


def measured(tables: int, rows_per_table: int, oltp: int, spark: Any, work: Path) -> list[tuple[str, int, float]]:
    """(phase, jobs, seconds) of each stage run for `tables` tables."""
    from cdc_assets.capture.run import capture
    from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter
    from cdc_assets.lake.store import Lakehouse
    from cdc_assets.stages.changes.run import process_new_batches
    from cdc_assets.stages.current.run import apply_pending
    from spark_resources.engine import Transforms

    server = fresh_server(BENCH_DIR / f"spark-jobs-{tables}")  # stopped when the benchmark ends (atexit)
    mixed_tables(server, tables, rows_per_table, oltp)
    settings = SourceSettings(MySQLUrl.parse(server.reader_url()), READER_SERVER_ID, TableFilter((f"{SCHEMA}.*",)))
    lakehouse = Lakehouse(str(work / f"lakehouse-{tables}"))
    engine = lambda changes: Transforms(lambda: spark)  # noqa: E731 (every stage run on Spark)
    found = []
    for round_name in ("from empty", "incremental"):
        if round_name == "incremental":
            more_oltp(server, tables, oltp // 2)
        capture(settings, lakehouse)
        for phase, run in (("change logs", process_new_batches), ("current state", apply_pending)):
            before, began = jobs_so_far(spark), time.monotonic()
            run(lakehouse, engine)
            found.append((f"{phase}, {round_name}", jobs_so_far(spark) - before, time.monotonic() - began))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="2,20,200")
    parser.add_argument("--rows-per-table", type=int, default=200)
    parser.add_argument("--oltp", type=int, default=2000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workers", type=int, default=0, help="run on a standalone cluster of this many workers")
    parser.add_argument("--tasks-per-core", default="", help="comma-separated TASKS_PER_CORE values to compare")
    parser.add_argument("--direct-max-batches", default="", help="comma-separated DIRECT_MAX_BATCHES values to compare")
    parser.add_argument("--turns", type=int, default=1)
    args = parser.parse_args()
    import cdc_assets.stages.changes.spark_tasks as change_tasks
    import spark_resources.transforms as transforms
    from cdc_assets.local_spark import cluster as spark_cluster

    # the setting compared (each value measured in turn, in one session), as (module, name, values, label)
    if args.direct_max_batches:
        knob = (change_tasks, "DIRECT_MAX_BATCHES", args.direct_max_batches, "direct up to {} batches")
    else:
        knob = (transforms, "TASKS_PER_CORE", args.tasks_per_core, "{} tasks/core")
    module, name, values, label_of = knob

    print(f"load average at start: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    state = BENCH_DIR / "spark-jobs-cluster"
    if args.workers:
        args.master = spark_cluster.start(state, workers=args.workers).master
    from pyspark.sql import SparkSession

    from spark_resources.session import spark_config

    builder = SparkSession.builder
    for key, value in spark_config(args.master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    counts = [int(n) for n in args.tables.split(",")]
    settings = [int(v) for v in values.split(",") if v] or [getattr(module, name)]
    work = Path(tempfile.mkdtemp(prefix="cdc-spark-jobs-"))
    failed = None
    runs: dict[tuple[int, int], list[list[tuple[str, int, float]]]] = {}
    try:
        for turn in range(args.turns):
            for n in counts:
                for value in settings if turn % 2 == 0 else settings[::-1]:  # the first of a session pays its warm-up
                    setattr(module, name, value)
                    found = measured(n, args.rows_per_table, args.oltp, spark, work / f"{turn}-{value}")
                    runs.setdefault((n, value), []).append(found)
                    print(f"{n} tables, {label_of.format(value)}: {found}", flush=True)
    except BaseException as exc:
        failed = f"the measurement failed ({type(exc).__name__})"
        raise
    finally:
        spark.stop()
        if args.workers:
            spark_cluster.stop(state)
        remove_work(work, failed)
    # each phase's median over the turns
    results = {
        key: [(phase, jobs, statistics.median(r[i][2] for r in found)) for i, (phase, jobs, _) in enumerate(found[0])]
        for key, found in runs.items()
    }
    columns = [(n, value) for n in counts for value in settings]
    label = (lambda n, v: f"{n} tables, {label_of.format(v)}") if len(settings) > 1 else (lambda n, v: f"{n} tables")
    print(f"\nSpark jobs per stage run on {args.master} (workload (a)'s shape, {args.rows_per_table} rows a table, "
          f"{args.oltp} transactions, then {args.oltp // 2} more)")  # fmt: skip
    print("| stage run | " + " | ".join(f"{label(n, c)}: jobs, s" for n, c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for i, (phase, _, _) in enumerate(results[columns[0]]):
        print(f"| {phase} | " + " | ".join(f"{results[k][i][1]}, {results[k][i][2]:.1f}" for k in columns) + " |")
    print(f"load average at the end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
