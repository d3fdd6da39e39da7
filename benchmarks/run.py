"""`make bench`: workload (a) captured by the tutorial baseline and by cdc-lakehouse, side by side.

    .venv/bin/python -m benchmarks.run [--runs 3] [--tables 200] [--rows-per-table 1000] [--oltp 50000]

Every figure is the median of `--runs` runs on the same binlog, each run in a fresh child process (so
its peak RSS is its own) writing to a fresh directory. Ratios are cdc-lakehouse against the baseline
run in the same invocation: for speeds, above 1 is faster; for end to end, the time of `cdc-lakehouse sync` from
an empty lakehouse (capture, change logs, current state, and the checks that compare every table with the
source) over the baseline's time for capture alone (at most 1.0 is the target). `verify` runs afterwards in a
process of its own, timed apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from benchmarks.workloads import CLI, SCHEMA, fresh_server, generated, remove_work, source_env, workload_options

READER_SERVER_ID = 4242

_PEAK = (
    "import resource, json\n"
    "out['peak_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
    "print('RESULT ' + json.dumps(out))\n"
)
BASELINE = (
    "import os, pathlib\n"
    "from benchmarks.baseline import run_baseline\n"
    "from cdc_assets.core.settings import MySQLUrl\n"
    "url = MySQLUrl.parse(os.environ['CDC_MYSQL_URL'])\n"
    "r = run_baseline(url.connection_settings(), {server_id}, pathlib.Path(os.environ['OUT_DIR']))\n"
    "out = {{'rows': r.row_changes, 'seconds': r.seconds}}\n"
)
CAPTURE = (
    "import os, time\n"
    "from cdc_assets.capture.run import capture\n"
    "from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter\n"
    "from cdc_assets.lake.store import Lakehouse\n"
    "began = time.monotonic()\n"
    "settings = SourceSettings(MySQLUrl.parse(os.environ['CDC_MYSQL_URL']), {server_id}, TableFilter(('{schema}.*',)))\n"
    "report = capture(settings, Lakehouse(os.environ['OUT_DIR']))\n"
    "out = {{'rows': report.rows, 'seconds': time.monotonic() - began, 'batches': len(report.batches)}}\n"
)


def child(code: str, env: dict[str, str], timeout: int = 3600) -> dict:
    """Python `code` run in a process of its own; it leaves its figures in a dict `out`, to which the process's
    peak RSS is added."""
    done = subprocess.run([sys.executable, "-c", code + _PEAK], env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"a benchmark run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.rsplit("RESULT ", 1)[1])


TIMED_COMMAND = (
    "import json, resource, subprocess, sys, time\n"
    "began = time.monotonic()\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print('RESULT ' + json.dumps({'seconds': time.monotonic() - began, 'code': done.returncode,\n"
    "    'out': done.stdout[-3000:], 'err': done.stderr[-3000:],\n"
    "    'peak_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n"
)


def timed(env: dict[str, str], *command: str) -> dict:
    """A command's wall seconds and the peak RSS of its processes, measured by a parent of its own."""
    done = subprocess.run([sys.executable, "-c", TIMED_COMMAND, *command], env=env, capture_output=True, text=True, timeout=7200)
    return json.loads(done.stdout.rsplit("RESULT ", 1)[1])


def _end_to_end(env: dict[str, str]) -> dict:
    """`cdc-lakehouse sync` from an empty lakehouse: capture, change logs, current state and their checks, among
    them `current_matches_source` (every table equal to the source at one consistent point; sync fails
    otherwise). Then `verify`, timed apart, confirms it from a process of its own."""
    sync = timed(env, CLI, "sync")
    verify = timed(env, CLI, "verify")
    if sync["code"] != 0 or verify["code"] != 0:
        raise SystemExit(f"end to end failed:\n{sync['out']}{sync['err']}{verify['out']}{verify['err']}")
    return {
        "seconds": sync["seconds"],
        "verify_seconds": verify["seconds"],
        "peak_mb": sync["peak_mb"],
        "verified": verify["out"].strip().splitlines()[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_options(parser)
    args = parser.parse_args()

    server = fresh_server()
    workload = generated(server, args)
    base_env = source_env(server, READER_SERVER_ID)
    work = tempfile.mkdtemp(prefix="cdc-bench-a-")  # every run's lakehouse and Dagster home, removed at the end
    runs: dict[str, list[dict]] = {"baseline": [], "capture": [], "end_to_end": []}
    for i in range(args.runs):
        for name, code in (("baseline", BASELINE), ("capture", CAPTURE)):
            out = tempfile.mkdtemp(prefix=f"cdc-bench-{name}-", dir=work)
            result = child(code.format(server_id=READER_SERVER_ID, schema=SCHEMA), {**base_env, "OUT_DIR": out})
            runs[name].append(result)
            print(f"  run {i + 1} {name:10s} {result['rows']} rows in {result['seconds']:.1f} s, peak {result['peak_mb']:.0f} MB", flush=True)
        lakehouse = tempfile.mkdtemp(prefix="cdc-bench-e2e-", dir=work)
        result = _end_to_end({**base_env, "CDC_LAKEHOUSE": lakehouse, "DAGSTER_HOME": tempfile.mkdtemp(prefix="cdc-bench-dh-", dir=work)})
        runs["end_to_end"].append(result)
        print(
            f"  run {i + 1} end to end: sync {result['seconds']:.1f} s (peak {result['peak_mb']:.0f} MB), "
            f"verify {result['verify_seconds']:.1f} s ({result['verified']})",
            flush=True,
        )

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    base_rate = median("baseline", "rows") / median("baseline", "seconds")
    ours_rate = median("capture", "rows") / median("capture", "seconds")
    rows = [
        ("capture: row changes/s", f"{base_rate:,.0f}", f"{ours_rate:,.0f}", f"{ours_rate / base_rate:.2f}x", "≥ 3x"),
        (
            "capture: seconds",
            f"{median('baseline', 'seconds'):.1f}",
            f"{median('capture', 'seconds'):.1f}",
            f"{median('capture', 'seconds') / median('baseline', 'seconds'):.2f}",
            "",
        ),
        (
            "capture: peak RSS (MB)",
            f"{median('baseline', 'peak_mb'):.0f}",
            f"{median('capture', 'peak_mb'):.0f}",
            f"{median('capture', 'peak_mb') / median('baseline', 'peak_mb'):.2f}",
            "≤ 300 MB",
        ),
        (
            "end to end: `sync` from an empty lakehouse to current state checked equal to the source (s)",
            f"{median('baseline', 'seconds'):.1f}",
            f"{median('end_to_end', 'seconds'):.1f}",
            f"{median('end_to_end', 'seconds') / median('baseline', 'seconds'):.2f}",
            "≤ 1.0",
        ),
        (
            "end to end and then `verify` in a process of its own (s)",
            f"{median('baseline', 'seconds'):.1f}",
            f"{median('end_to_end', 'seconds') + median('end_to_end', 'verify_seconds'):.1f}",
            f"{(median('end_to_end', 'seconds') + median('end_to_end', 'verify_seconds')) / median('baseline', 'seconds'):.2f}",
            "",
        ),
        (
            "whole pipeline peak RSS, the `sync` process and any JVM it starts (MB)",
            "",
            f"{median('end_to_end', 'peak_mb'):.0f}",
            "",
            "≤ 2,000 MB",
        ),
    ]
    print(f"\nmedians of {args.runs} runs, workload (a), {workload.row_changes} row changes")
    print("| figure | baseline | cdc-lakehouse | ratio | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    remove_work(work)


if __name__ == "__main__":
    main()
