"""Spark as the data plane, on a real standalone cluster (a master and workers from the pyspark wheel, on this
machine): the run's memory as tables grow, snapshot throughput by workers, and workload (a) beside Arrow.

    .venv/bin/python -m benchmarks.spark_cluster [--sizes 2000000,20000000] [--changes 10000] [--oltp 50000]

1. Run-process memory. For each size, a table of N rows (`id BIGINT` key and five columns, made outside the
   binlog) is loaded by `cdc-lakehouse snapshot` on the cluster engine, then takes `--changes` changes (the
   recent pattern of workload (b)) and is brought up to date by `cdc-lakehouse sync` (its checks included).
   Sampled from /proc every 0.2 s: the peak RSS of the `cdc-lakehouse` process itself (the run process), of
   the driver JVM it starts, and of the cluster (master, workers, executors and their Python workers). Rows
   never passing through the run process shows as the largest table's run-process peak staying within 1.2x
   the smallest's.
2. Snapshot throughput of the largest table: the single-process snapshot (the Arrow engine, in the run's
   process) beside the cluster engine with 1 and with 2 workers (one core each).
3. Workload (a) (`benchmarks.run`: 250k changes over 200 tables), `sync` from an empty lakehouse on the Arrow
   engine beside the cluster engine (every stage on Spark), each then checked by `verify`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.large_table import SCHEMA, make_table, write_changes
from benchmarks.memory import Watched, watch
from benchmarks.workloads import BENCH_DIR, CLI, fresh_server, mixed_tables
from benchmarks.workloads import SCHEMA as WORKLOAD_A_SCHEMA
from cdc_assets.local_spark import cluster as spark_cluster

READER_SERVER_ID = 4244
NO_SPARK = str(10**15)  # CDC_SPARK_MIN_ROWS that keeps every run on Arrow


def cluster_pids(state_dir: Path) -> list[int]:
    return [int(p) for p in (state_dir / "pids").read_text().split()]


def _run(env: dict[str, str], state_dir: Path | None, *args: str) -> Watched:
    done = watch([CLI, *args], env, beside=cluster_pids(state_dir) if state_dir else ())
    if done.code != 0:
        raise SystemExit(f"cdc-lakehouse {' '.join(args)} failed:\n{done.out[-2000:]}{done.err[-3000:]}")
    return done


def _env(base: dict[str, str], work: Path, name: str, tables: str, master: str, min_rows: str | None = None) -> dict[str, str]:
    env = {
        **base,
        "CDC_TABLES": tables,
        "CDC_LAKEHOUSE": str(work / name),
        "DAGSTER_HOME": str(work / f"{name}-dh"),
        "CDC_SPARK_MASTER": master,
    }
    env.pop("CDC_SPARK_MIN_ROWS", None)
    if min_rows is not None:
        env["CDC_SPARK_MIN_ROWS"] = min_rows
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000000,20000000")
    parser.add_argument("--changes", type=int, default=10_000)
    parser.add_argument("--oltp", type=int, default=50_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    largest = f"recent_{sizes[-1]}"

    server = fresh_server(BENCH_DIR / "cluster-source")
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
    for size in sizes:
        began = time.monotonic()
        make_table(server, f"recent_{size}", size)
        print(f"table of {size:,} rows made in {time.monotonic() - began:.0f} s", flush=True)
    workload = mixed_tables(server, 200, 1_000, args.oltp)
    print(f"workload (a): {workload.row_changes} row changes over {workload.tables} tables", flush=True)
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-cluster-"))
    base = {**os.environ, "CDC_MYSQL_URL": server.reader_url(), "CDC_SERVER_ID": str(READER_SERVER_ID)}
    state = BENCH_DIR / "cluster-spark"

    # 2. (first part) the single-process snapshot of the largest table, on Arrow in the run's process
    single = _run(_env(base, work, "single", f"{SCHEMA}.{largest}", "local[2]", NO_SPARK), None, "snapshot")
    print(f"single-process snapshot of {sizes[-1]:,} rows: {single.seconds:.1f} s, peak {single.run_process_mb:.0f} MB", flush=True)

    cluster = spark_cluster.start(state, workers=2)
    try:
        # 1. memory: snapshot, then changes and a sync, each size on the cluster engine with 2 workers
        memory: dict[int, tuple[Watched, Watched]] = {}
        for size in sizes:
            table = f"recent_{size}"
            env = _env(base, work, table, f"{SCHEMA}.{table}", cluster.master)
            snapshot = _run(env, state, "snapshot")
            write_changes(server, table, size, args.changes, "recent", seed=size)
            sync = _run(env, state, "sync")
            memory[size] = (snapshot, sync)
            print(
                f"{size:,} rows on the cluster: snapshot {snapshot.seconds:.1f} s, sync {sync.seconds:.1f} s; run process "
                f"peak {max(snapshot.run_process_mb, sync.run_process_mb):.0f} MB (snapshot {snapshot.run_process_mb:.0f}, "
                f"sync {sync.run_process_mb:.0f}), driver JVM "
                f"{max(snapshot.children_mb, sync.children_mb):.0f} MB, cluster {max(snapshot.beside_mb, sync.beside_mb):.0f} MB",
                flush=True,
            )
            shutil.rmtree(work / table, ignore_errors=True)
        # 3. workload (a) on the cluster engine, and on Arrow beside it
        e2e = {}
        for name, master, min_rows in (("arrow", "local[2]", None), ("cluster", cluster.master, None)):
            env = _env(base, work, f"a-{name}", f"{WORKLOAD_A_SCHEMA}.*", master, min_rows)
            sync = _run(env, state if name == "cluster" else None, "sync")
            verify = _run(env, state if name == "cluster" else None, "verify")
            e2e[name] = (sync, verify)
            print(f"workload (a) on {name}: sync {sync.seconds:.1f} s, verify {verify.seconds:.1f} s: {verify.out.strip().splitlines()[-1]}", flush=True)
    finally:
        spark_cluster.stop(state)

    # 2. (the rest) the cluster engine's snapshot of the largest table with one worker
    time.sleep(3)
    one = spark_cluster.start(state, workers=1)
    try:
        env = _env(base, work, "one-worker", f"{SCHEMA}.{largest}", one.master)
        with server.admin_connection() as conn, conn.cursor() as cur:  # the same rows as the other snapshots
            cur.execute(f"SELECT COUNT(*) FROM {SCHEMA}.{largest}")
            rows_now = cur.fetchone()[0]
        one_worker = _run(env, state, "snapshot")
    finally:
        spark_cluster.stop(state)
    two_workers = memory[sizes[-1]][0]

    print("\n1. run-process memory on the cluster engine (2 workers): snapshot, then 10k changes and a sync")
    print("| table rows | snapshot (s) | sync (s) | run process peak RSS (MB) | ratio to the smallest | target | driver JVM peak (MB) | cluster JVMs and Python workers peak (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    smallest = max(memory[sizes[0]][0].run_process_mb, memory[sizes[0]][1].run_process_mb)
    for size in sizes:
        snapshot, sync = memory[size]
        peak = max(snapshot.run_process_mb, sync.run_process_mb)
        print(
            f"| {size:,} | {snapshot.seconds:.1f} | {sync.seconds:.1f} | {peak:,.0f} | {peak / smallest:.2f} | "
            f"{'≤ 1.2' if size != sizes[0] else ''} | {max(snapshot.children_mb, sync.children_mb):,.0f} | "
            f"{max(snapshot.beside_mb, sync.beside_mb):,.0f} |"
        )
    print(f"\n2. snapshot throughput, {sizes[-1]:,} rows (the one-worker run read {rows_now:,} rows after the changes)")
    print("| engine | seconds | rows/s | ratio to the single process |")
    print("|---|---|---|---|")
    for name, done, rows in (
        ("single process (Arrow, in the run's process)", single, sizes[-1]),
        ("cluster, 1 worker", one_worker, rows_now),
        ("cluster, 2 workers", two_workers, sizes[-1]),
    ):
        rate = rows / done.seconds
        print(f"| {name} | {done.seconds:.1f} | {rate:,.0f} | {rate / (sizes[-1] / single.seconds):.2f} |")
    print(f"\n3. workload (a), {workload.row_changes} row changes over {workload.tables} tables, `sync` from an empty lakehouse")
    print("| engine | sync (s) | run process peak (MB) | driver JVM peak (MB) | cluster peak (MB) | verify (s) | verify says | ratio to Arrow |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("arrow", "cluster"):
        sync, verify = e2e[name]
        print(
            f"| {name} | {sync.seconds:.1f} | {sync.run_process_mb:,.0f} | {sync.children_mb:,.0f} | {sync.beside_mb:,.0f} | "
            f"{verify.seconds:.1f} | {verify.out.strip().splitlines()[-1]} | {sync.seconds / e2e['arrow'][0].seconds:.2f} |"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
