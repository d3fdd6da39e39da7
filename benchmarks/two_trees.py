"""A change's before and after: the same benchmarks run on two revisions of the code, in one invocation.

    .venv/bin/python -m benchmarks.two_trees --before REV [--after HEAD] [--runs 3] [--tables 200]
        [--rows-per-table 1000] [--oltp 50000] [--incremental 10000] [--continuous-seconds 60] [--rate 1000]

Each revision is exported (`git archive`) to a folder of its own, and every run is a whole process whose imports come
from that folder (PYTHONPATH; the virtualenv's packages are shared), the two revisions taking turns so that a drift
of the machine's load falls on both. Three figures (issues 28 and 43: a restructuring must leave them within noise):

- workload (a): generated once on a dedicated MariaDB; each run is `cdc-lakehouse sync` from an empty lakehouse
  (capture, change logs, current state, and the checks comparing every table with the source), as in
  `benchmarks.run`'s end to end;
- workload (a) incremental: once every sync from empty is done, `--incremental` more single-row transactions are
  written; each run's lakehouse (and Dagster home) is brought up to date by one more `cdc-lakehouse sync`, which
  captures and applies only those;
- the continuous mode: each revision's own `benchmarks.continuous` at one rate (`cdc-lakehouse run` hands-off, the
  p95 from commit to current state), a fresh source each.

Ratios are after over before: about 1.0 is the target, below 1 is faster.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.workloads import CLI, fresh_server, generated, more_oltp, remove_work, source_env, workload_options

READER_SERVER_ID = 4343
ROOT = Path(__file__).resolve().parents[1]


def exported(revision: str, into: Path) -> tuple[str, Path]:
    """The revision's tracked files in a folder of their own, and the commit it names."""
    commit = subprocess.run(["git", "rev-parse", "--short", revision], cwd=ROOT, capture_output=True, text=True, check=True)
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", revision], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {revision} failed")
    return commit.stdout.strip(), into


def synced(tree: Path, env: dict[str, str], work: Path) -> float:
    """Wall seconds of `cdc-lakehouse sync` of the lakehouse under `work` (empty when there is none yet), with the
    tree's code."""
    work.mkdir(parents=True, exist_ok=True)
    run_env = {**env, "PYTHONPATH": str(tree), "CDC_LAKEHOUSE": str(work / "lakehouse")}
    began = time.monotonic()
    done = subprocess.run([CLI, "sync"], env=run_env, cwd=work, capture_output=True, text=True, timeout=7200)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"sync with {tree.name} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return seconds


def continuous_p95(tree: Path, seconds: float, rate: int) -> tuple[float, str]:
    """The p95 (s) from commit to current state of the tree's own continuous-mode benchmark at `rate`, and its
    table row."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "benchmarks.continuous", "--rates", str(rate), "--seconds", str(seconds)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"the continuous benchmark with {tree.name} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    row = next((line for line in done.stdout.splitlines() if re.match(rf"\|\s*{rate:,}\s*\|", line)), None)
    if row is None:
        raise SystemExit(f"no figures for {rate} changes/s in:\n{done.stdout[-2000:]}")
    cells = [c.strip() for c in row.strip("|").split("|")]
    return float(cells[3]), row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the revision before the change (a commit, a branch)")
    parser.add_argument("--after", default="HEAD", help="the revision after it (default HEAD)")
    parser.add_argument("--continuous-seconds", type=float, default=60, help="each continuous window (0: skip)")
    parser.add_argument("--rate", type=int, default=1000, help="the continuous window's changes per second")
    parser.add_argument("--incremental", type=int, default=10_000, help="transactions of the incremental sync (0: skip)")
    workload_options(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cdc-two-trees-"))
    failed = None
    try:
        trees = {side: exported(rev, work / side) for side, rev in (("before", args.before), ("after", args.after))}
        server = fresh_server()
        workload = generated(server, args)
        env = source_env(server, READER_SERVER_ID)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for run in range(args.runs):
            for side in ("before", "after") if run % 2 == 0 else ("after", "before"):
                times[side].append(synced(trees[side][1], env, work / f"{side}-{run}"))
                print(f"run {run + 1}, {side} ({trees[side][0]}): sync {times[side][-1]:.1f} s", flush=True)
        increments: dict[str, list[float]] = {"before": [], "after": []}
        if args.incremental > 0:
            more_oltp(server, args.tables, args.incremental)
            for run in range(args.runs):
                for side in ("before", "after") if run % 2 == 0 else ("after", "before"):
                    increments[side].append(synced(trees[side][1], env, work / f"{side}-{run}"))
                    print(f"run {run + 1}, {side}: incremental sync {increments[side][-1]:.1f} s", flush=True)
        p95: dict[str, tuple[float, str]] = {}
        if args.continuous_seconds > 0:
            for side in ("before", "after"):
                p95[side] = continuous_p95(trees[side][1], args.continuous_seconds, args.rate)
                print(f"continuous, {side}: {p95[side][1]}", flush=True)
        before, after = (statistics.median(times[s]) for s in ("before", "after"))
        print(f"\nbefore = {trees['before'][0]} ({args.before}), after = {trees['after'][0]} ({args.after}); "
              f"workload (a): {workload.row_changes} row changes over {workload.tables} tables, median of {args.runs}")  # fmt: skip
        print("| figure | before | after | after / before |")
        print("|---|---|---|---|")
        print(f"| workload (a) `sync` from empty (s) | {before:.1f} | {after:.1f} | {after / before:.2f} |")
        if args.incremental > 0:
            b, a = (statistics.median(increments[s]) for s in ("before", "after"))
            print(f"| workload (a) then {args.incremental:,} transactions: incremental `sync` (s) | {b:.1f} | {a:.1f} | {a / b:.2f} |")
        if p95:
            b, a = p95["before"][0], p95["after"][0]
            print(f"| continuous mode p95 at {args.rate}/s (s) | {b:.2f} | {a:.2f} | {a / b:.2f} |")
    except BaseException as exc:
        failed = f"the comparison failed ({type(exc).__name__})"
        raise
    finally:
        remove_work(work, failed)


if __name__ == "__main__":
    main()
