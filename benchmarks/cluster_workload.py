"""Workload (a) on Arrow, on a standalone cluster and through a Spark Connect server, side by side in one invocation.

    .venv/bin/python -m benchmarks.cluster_workload [--tables 200] [--rows-per-table 1000] [--oltp 50000]
        [--more 10000] [--workers 2]

Workload (a) (`benchmarks.workloads.mixed_tables`: 250k changes over 200 tables by default) is written to a fresh
MariaDB; each engine's lakehouse takes it with `cdc-lakehouse sync` from empty, then `--more` single-row transactions
later an incremental `sync` (each sync's checks included, which compare every table with the source). The engines:
Arrow in the run's process; every stage on a standalone cluster (`--workers` workers of one core and 1 GB, from the
pyspark wheel); every stage through a Spark Connect server whose master is that cluster. Each engine runs its syncs
in turn on the same binlog, as whole processes; ratios are against Arrow (and Connect against the cluster). Spark's
fixed cost per job is what grows with tables when a stage's job count does (benchmarks.spark_jobs counts them).

The cluster's syncs write Spark's event log, and each is then split into phases (benchmarks.spark_phases): the
driver's start, each stage's wall time, its Spark jobs' count and seconds, and the run process's own time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.memory import watch
from benchmarks.spark_cluster import cluster_pids
from benchmarks.spark_phases import Phase, event_log_conf, phases, print_table
from benchmarks.workloads import BENCH_DIR, CLI, SCHEMA, fresh_server, mixed_tables, more_oltp, remove_work
from cdc_assets.local_source.processes import free_port
from cdc_assets.local_spark import cluster as spark_cluster
from cdc_assets.local_spark import connect_server

READER_SERVER_ID = 4245
NO_SPARK = str(10**15)  # CDC_SPARK_MIN_ROWS that keeps every run on Arrow


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _sync(env: dict[str, str], beside: list[int]) -> float:
    done = watch([CLI, "sync"], env, beside=beside)
    if done.code != 0:
        raise SystemExit(f"sync on {env['CDC_SPARK_MASTER']} failed:\n{done.out[-2000:]}{done.err[-3000:]}")
    return done.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows-per-table", type=int, default=1_000)
    parser.add_argument("--oltp", type=int, default=50_000)
    parser.add_argument("--more", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    server = fresh_server(BENCH_DIR / "cluster-workload-source")
    workload = mixed_tables(server, args.tables, args.rows_per_table, args.oltp)
    print(f"workload (a): {workload.row_changes} row changes over {workload.tables} tables", flush=True)
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-cluster-workload-"))
    state, connect_state = BENCH_DIR / "cluster-workload-spark", BENCH_DIR / "cluster-workload-connect"
    base = {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_SERVER_ID": str(READER_SERVER_ID),
        "CDC_TABLES": f"{SCHEMA}.*",
    }
    base.pop("CDC_SPARK_MIN_ROWS", None)
    failed = None
    events = work / "spark-events"
    found: dict[str, tuple[list[Phase], float]] = {}
    print(f"load average at start: {load()}", flush=True)
    cluster = spark_cluster.start(state, workers=args.workers)
    connect = None
    try:
        port = free_port()
        engines = {
            "arrow": {"CDC_SPARK_MASTER": "local[2]", "CDC_SPARK_MIN_ROWS": NO_SPARK},
            "cluster": {"CDC_SPARK_MASTER": cluster.master, "CDC_SPARK_CONF": json.dumps(event_log_conf(events))},
            "connect": {"CDC_SPARK_MASTER": f"sc://127.0.0.1:{port}"},
        }
        envs = {
            name: {**base, **extra, "CDC_LAKEHOUSE": str(work / name), "DAGSTER_HOME": str(work / f"{name}-dh")}
            for name, extra in engines.items()
        }
        beside = cluster_pids(state)
        seconds: dict[str, dict[str, float]] = {name: {} for name in engines}
        for round_name in ("from empty", "incremental"):
            if round_name == "incremental":
                more_oltp(server, args.tables, args.more)
            for name, env in envs.items():
                # the Connect server is an application of the cluster, holding its cores while it runs: it runs only
                # for its own syncs (a standalone cluster gives an application every free core)
                if name == "connect":
                    connect = connect_server.start(connect_state, port, master=cluster.master)
                known, began = set(os.listdir(events)), time.time()
                seconds[name][round_name] = _sync(env, beside)
                if name == "cluster":
                    found[round_name] = (
                        phases(began, seconds[name][round_name], Path(env["DAGSTER_HOME"]), events, known)[0],
                        seconds[name][round_name],
                    )
                if connect is not None:
                    connect_server.stop(connect)
                    connect = None
                print(f"{round_name}, {name}: sync {seconds[name][round_name]:.1f} s", flush=True)
    except BaseException as exc:
        failed = f"the benchmark failed ({type(exc).__name__})"
        raise
    finally:
        if connect is not None:
            connect_server.stop(connect)
        spark_cluster.stop(state)
        remove_work(work, failed)
    print(f"\nworkload (a): {workload.row_changes} row changes over {workload.tables} tables, then {args.more} more "
          f"transactions; a standalone cluster of {args.workers} one-core workers on this machine")  # fmt: skip
    print("| sync | Arrow (s) | cluster (s) | cluster / Arrow | target | Connect (s) | Connect / cluster | target |")
    print("|---|---|---|---|---|---|---|---|")
    for round_name in ("from empty", "incremental"):
        a, c, k = (seconds[n][round_name] for n in ("arrow", "cluster", "connect"))
        print(f"| {round_name} | {a:.1f} | {c:.1f} | {c / a:.2f} | ≤ 2 | {k:.1f} | {k / c:.2f} | ≤ 1.3 |")
    for round_name, (phase_list, total) in found.items():
        print_table(f"the cluster's sync, {round_name}, by phase", phase_list, total)
    print(f"\nload average at the end: {load()}")


if __name__ == "__main__":
    main()
