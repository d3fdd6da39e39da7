"""The continuous mode with its Spark master on a standalone cluster, beside Arrow, in one invocation.

    .venv/bin/python -m benchmarks.continuous_cluster [--rate 1000] [--seconds 60] [--workers 2] [--warm-up-seconds 10]

Each engine runs benchmarks.continuous (workload (c)'s writer and probe, one `cdc-lakehouse run` process, a server
and a lakehouse of its own, every table verified at the end) for one window at `--rate` changes/s, in turn:
- Arrow: `CDC_SPARK_MASTER=local[2]`, whose default `CDC_SPARK_MIN_ROWS` keeps every cycle in the run's process;
- cluster: `CDC_SPARK_MASTER` on a standalone cluster (`--workers` one-core workers from the pyspark wheel), whose
  default `CDC_SPARK_MIN_ROWS` (0) sends every cycle to Spark.
Before the window, each engine's run takes in `--warm-up-seconds` of writes at the same rate from its start (the
cluster's run begins its session at its start, spark_resources.session.start_session_early): its worst latency is
printed as the start-up's, and the window measures the steady state a long-running mode is in.
The Spark runs write Spark's event log; from it each Spark cycle's jobs are counted (a cycle is a run of jobs
described `cdc-lakehouse: change logs` followed by those of `cdc-lakehouse: current state`, see
spark_resources.engine.spark_phase), to show whether a cycle costs a job per table (the workload writes 21 tables).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.spark_phases import event_log_conf
from benchmarks.workloads import BENCH_DIR, remove_work
from cdc_assets.local_spark import cluster as spark_cluster

_WARM = re.compile(r"warm-up: .* max ([0-9.]+) s")
_ROW = re.compile(r"^\| [0-9,]+ \| ([0-9,]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|")


def cycles(events_dir: Path) -> list[int]:
    """Jobs per Spark cycle of the continuous mode, in the order run, from its event log under `events_dir` (the
    applications' names sort by their start; the first is the `sync` that loads the tables before the window)."""
    found: list[int] = []
    logs = sorted(p for p in events_dir.rglob("*") if p.is_file() and not p.name.startswith((".", "appstatus")))
    for path in logs[1:]:
        previous = None
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            if event.get("Event") != "SparkListenerJobStart":
                continue
            described = (event.get("Properties") or {}).get("spark.job.description", "")
            if described == "cdc-lakehouse: change logs" and previous != described:
                found.append(0)
            if found:
                found[-1] += 1
            previous = described or previous
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--warm-up-seconds",
        type=float,
        default=10,
        help="written before the window, for both engines: the window is a run past its start (0: the window starts "
        "with the run, its first cycles waiting for the driver JVM and the executors)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-continuous-cluster-"))
    state = BENCH_DIR / "continuous-cluster-spark"
    print(f"load average at start: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    cluster = spark_cluster.start(state, workers=args.workers)
    rows: dict[str, tuple[str, ...]] = {}
    jobs: dict[str, list[int]] = {}
    warm_max: dict[str, str] = {}
    failed = None
    try:
        engines = {
            "Arrow (local[2]: every cycle in the run's process)": {"CDC_SPARK_MASTER": "local[2]"},
            f"cluster of {args.workers} workers (every cycle on Spark)": {"CDC_SPARK_MASTER": cluster.master},
        }
        for n, (name, extra) in enumerate(engines.items()):
            events = work / f"events-{n}"
            env = {**os.environ, **extra, "CDC_SPARK_CONF": json.dumps(event_log_conf(events))}
            env.pop("CDC_SPARK_MIN_ROWS", None)
            command = [sys.executable, "-m", "benchmarks.continuous", "--rates", str(args.rate)]
            command += ["--warm-up-seconds", str(args.warm_up_seconds)]
            done = subprocess.run(
                [*command, "--seconds", str(args.seconds)], env=env, capture_output=True, text=True, timeout=3600
            )
            if done.returncode != 0:
                raise SystemExit(f"{name}: benchmarks.continuous failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            print(f"{name}:\n{done.stdout.strip()}", flush=True)
            found = next((m for line in done.stdout.splitlines() if (m := _ROW.match(line))), None)
            if found is None:
                raise SystemExit(f"{name}: no latency row in benchmarks.continuous's output")
            rows[name] = found.groups()
            warm = next((m for line in done.stdout.splitlines() if (m := _WARM.search(line))), None)
            warm_max[name] = warm[1] if warm else "-"
            jobs[name] = cycles(events)
    except BaseException as exc:
        failed = f"the benchmark failed ({type(exc).__name__})"
        raise
    finally:
        spark_cluster.stop(state)
        remove_work(work, failed)
    print(
        f"\ncontinuous mode at {args.rate:,} changes/s over 21 tables, one window of {args.seconds:.0f} s per engine, "
        f"after a warm-up of {args.warm_up_seconds:.0f} s from the run's start"
    )
    print(
        "| engine | warm-up max latency (s) | written/s | p50 (s) | p95 (s) | max (s) | Spark cycles | "
        "Spark jobs per cycle (median, max) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (rate, p50, p95, top) in rows.items():
        counts = sorted(jobs[name])
        per_cycle = f"{counts[len(counts) // 2]}, {counts[-1]}" if counts else "-"
        print(f"| {name} | {warm_max[name]} | {rate} | {p50} | {p95} | {top} | {len(counts)} | {per_cycle} |")
    print(f"\nload average at the end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
