"""The current-state apply run of workload (a) with SCD2 history off and on (CDC_HISTORY_TABLES).

    .venv/bin/python -m benchmarks.history [--runs 3] [--tables 200] [--rows-per-table 1000] [--oltp 50000]
                                     [--more-oltp 10000]

Workload (a) is captured once and taken into the change logs once per run, in a fresh lakehouse; then the
apply run (`stages.current.apply_pending` on Arrow, as `sync` runs it for this workload) is timed in a process of
its own, once with no history and once with every table's history kept. Then `--more-oltp` more transactions
are written and each lakehouse takes them in: the later, incremental apply, where history closes versions in
tables that already hold some. Figures are medians of `--runs`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from benchmarks.run import READER_SERVER_ID, child
from benchmarks.workloads import BENCH_DIR, SCHEMA, fresh_server, mixed_tables, more_oltp
from cdc_assets.local_source import server as local_server

PREPARE = (
    "import os\n"
    "from cdc_assets.capture.run import capture\n"
    "from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter\n"
    "from cdc_assets.lake.store import Lakehouse\n"
    "from cdc_assets.stages.changes import process_new_batches\n"
    "from spark_resources.engine import Transforms\n"
    "settings = SourceSettings(MySQLUrl.parse(os.environ['CDC_MYSQL_URL']), {server_id}, TableFilter(('{schema}.*',)))\n"
    "lakehouse = Lakehouse(os.environ['OUT_DIR'])\n"
    "report = capture(settings, lakehouse)\n"
    "process_new_batches(lakehouse, lambda n: Transforms(None))\n"
    "out = {{'rows': report.rows}}\n"
)
APPLY = (
    "import os, time\n"
    "from cdc_assets.core.settings import TableSelection\n"
    "from cdc_assets.lake.store import Lakehouse\n"
    "from cdc_assets.stages.current import apply_pending\n"
    "from spark_resources.engine import Transforms\n"
    "history = TableSelection(('{schema}.*',) if {history} else ())\n"
    "lakehouse = Lakehouse(os.environ['OUT_DIR'], history=history)\n"
    "began = time.monotonic()\n"
    "report = apply_pending(lakehouse, lambda n: Transforms(None))\n"
    "out = {{'seconds': time.monotonic() - began, 'changes': sum(r.changes_in for r in report.applied)}}\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows-per-table", type=int, default=1_000)
    parser.add_argument("--oltp", type=int, default=50_000)
    parser.add_argument("--more-oltp", type=int, default=10_000, help="transactions the incremental apply takes in")
    args = parser.parse_args()

    server = fresh_server()
    try:
        _measure(args, server)
    finally:
        local_server.stop(BENCH_DIR)


def _measure(args: argparse.Namespace, server: local_server.LocalServer) -> None:
    workload = mixed_tables(server, args.tables, args.rows_per_table, args.oltp)
    print(f"workload (a): {workload.row_changes} row changes across {workload.tables} tables", flush=True)
    env = {**os.environ, "CDC_MYSQL_URL": server.reader_url()}
    lakehouses = {
        (i, h): tempfile.mkdtemp(prefix="cdc-bench-history-") for i in range(args.runs) for h in (False, True)
    }
    first: dict[bool, list[float]] = {False: [], True: []}
    later: dict[bool, list[float]] = {False: [], True: []}
    try:
        for (i, history), lakehouse in lakehouses.items():
            first[history].append(_apply(env, lakehouse, history, f"run {i + 1}, from empty"))
        # every lakehouse has taken in workload (a); one more round of transactions for all of them to take in
        more_oltp(server, args.tables, args.more_oltp)
        print(f"{args.more_oltp} more single-row transactions written", flush=True)
        for (i, history), lakehouse in lakehouses.items():
            later[history].append(_apply(env, lakehouse, history, f"run {i + 1}, incremental"))
    finally:
        for lakehouse in lakehouses.values():
            shutil.rmtree(lakehouse, ignore_errors=True)
    print(f"\nmedians of {args.runs} runs, workload (a), {workload.row_changes} row changes")
    print("| figure | history off | history on | ratio |")
    print("|---|---|---|---|")
    for label, seconds in (
        (
            "apply run of every table from empty current-state (and history) tables, s",
            first,
        ),
        (f"a later apply run of {args.more_oltp} more transactions onto those tables, s", later),
    ):
        off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"| {label} | {off:.2f} | {on:.2f} | {on / off:.2f} |")


def _apply(env: dict[str, str], lakehouse: str, history: bool, what: str) -> float:
    """Capture what is new into `lakehouse` and take it into the change logs, then time the apply run in a
    process of its own."""
    prepared = child(PREPARE.format(server_id=READER_SERVER_ID, schema=SCHEMA), {**env, "OUT_DIR": lakehouse})
    began = time.monotonic()
    result = child(APPLY.format(schema=SCHEMA, history=history), {**env, "OUT_DIR": lakehouse})
    print(
        f"  {what}, history {'on ' if history else 'off'}: {result['changes']} of {prepared['rows']} changes "
        f"applied in {result['seconds']:.2f} s (process {time.monotonic() - began:.1f} s, peak {result['peak_mb']:.0f} MB)",
        flush=True,
    )
    return float(result["seconds"])


if __name__ == "__main__":
    main()
