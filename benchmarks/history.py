"""The current-state apply run of workload (a) with SCD2 history off and on (CDC_HISTORY_TABLES).

    .venv/bin/python -m benchmarks.history [--runs 3] [--tables 200] [--rows-per-table 1000] [--oltp 50000]
                                     [--more-oltp 10000]
    .venv/bin/python -m benchmarks.history --seed-rows 1000000 [--runs 3]

Workload (a) is captured once and taken into the change logs once per run, in a fresh lakehouse; then the
apply run (`stages.current.run.apply_pending` on Arrow, as `sync` runs it for this workload) is timed in a process of
its own, once with no history and once with every table's history kept. Then `--more-oltp` more transactions
are written and each lakehouse takes them in: the later, incremental apply, where history closes versions in
tables that already hold some. Figures are medians of `--runs`.

`--seed-rows N` measures instead what a snapshot adds when CDC_HISTORY_TABLES selects its table
(`stages.history.run.seed_history`), with no source: a current-state table of N rows (5 columns: BIGINT key, INT,
DECIMAL(12,2), VARCHAR, DATETIME) is written in a process of its own, then seeded into an empty history in
another (time, and peak RSS above the process's RSS before the seed), then the table is rewritten with 1% of its
rows changed and 1% gone and seeded again, as a re-snapshot would (the join against N open versions).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from benchmarks.run import READER_SERVER_ID, child
from benchmarks.workloads import BENCH_DIR, SCHEMA, fresh_server, generated, more_oltp, workload_options
from cdc_assets.local_source import server as local_server

PREPARE = (
    "import os\n"
    "from cdc_assets.capture.run import capture\n"
    "from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter\n"
    "from cdc_assets.lake.store import Lakehouse\n"
    "from cdc_assets.stages.changes.run import process_new_batches\n"
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
    "from cdc_assets.stages.current.run import apply_pending\n"
    "from spark_resources.engine import Transforms\n"
    "history = TableSelection(('{schema}.*',) if {history} else ())\n"
    "lakehouse = Lakehouse(os.environ['OUT_DIR'], history=history)\n"
    "began = time.monotonic()\n"
    "report = apply_pending(lakehouse, lambda n: Transforms(None))\n"
    "out = {{'seconds': time.monotonic() - began, 'changes': sum(r.changes_in for r in report.applied)}}\n"
)


SEED_SETUP = (
    "import datetime as dt, os, resource, time\n"
    "import pyarrow as pa, pyarrow.compute as pc\n"
    "from decimal import Decimal\n"
    "from deltalake import write_deltalake\n"
    "from cdc_assets.core.mysql_types import ColumnSpec\n"
    "from cdc_assets.core.names import TableRef\n"
    "from cdc_assets.core.settings import TableSelection\n"
    "from cdc_assets.core.shapes import TableShape\n"
    "from cdc_assets.stages.current.rows import current_configuration, current_schema\n"
    "from cdc_assets.lake.layout import CURRENT\n"
    "from cdc_assets.lake.store import Lakehouse\n"
    "from cdc_assets.stages.history.run import seed_history\n"
    "ref = TableRef('bench', 'orders')\n"
    "shape = TableShape(ref, (ColumnSpec('id', 'bigint'), ColumnSpec('customer', 'int'),\n"
    "    ColumnSpec('amount', 'decimal', precision=12, scale=2), ColumnSpec('status', 'varchar'),\n"
    "    ColumnSpec('created', 'datetime')), ('id',))\n"
    "lakehouse = Lakehouse(os.environ['OUT_DIR'], history=TableSelection(('bench.*',)))\n"
)
SEED_WRITE = SEED_SETUP + (
    "n, seq, changed = {rows}, {seq}, {changed}\n"
    "ids = pa.array(range(n), pa.int64())\n"
    "if changed:\n"
    "    ids = ids.filter(pc.not_equal(pc.bit_wise_and(ids, 127), 1))  # ~1% of the rows gone\n"
    "m, keys = len(ids), ids.to_pylist()\n"
    "bump = pc.cast(pc.equal(pc.bit_wise_and(ids, 127), 2), pa.int64()) if changed else pa.array([0] * m, pa.int64())\n"
    "rows = pa.table({{\n"
    "    'id': ids, 'customer': pc.cast(pc.add(pc.bit_wise_and(ids, 4095), pc.cast(bump, pa.int64())), pa.int32()),\n"
    "    'amount': pa.array([Decimal(i % 100000) / 100 for i in keys], pa.decimal128(12, 2)),\n"
    "    'status': pa.array([('shipped', 'paid', 'new', 'returned')[i % 4] for i in keys]),\n"
    "    'created': pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(seconds=i) for i in keys], pa.timestamp('us')),\n"
    "    '_cdc_seq': pa.array([seq] * m, pa.int64()),\n"
    "    '_cdc_commit_ts': pa.array([dt.datetime(2026, 11, 25, tzinfo=dt.UTC)] * m, pa.timestamp('us', 'UTC')),\n"
    "}}).cast(current_schema(shape))\n"
    "write_deltalake(lakehouse.table_uri(CURRENT, ref), rows, mode='overwrite',\n"
    "    configuration=current_configuration(rows.schema))\n"
    "out = {{'rows': m}}\n"
)
SEED_RUN = SEED_SETUP + (
    "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
    "began = time.monotonic()\n"
    "outcome = seed_history(lakehouse, shape, {seq}, dt.datetime.now(dt.UTC))\n"
    "out = {{'seconds': time.monotonic() - began, 'before_mb': before, 'outcome': outcome}}\n"
)


def _measure_seed(rows: int, runs: int) -> None:
    env = dict(os.environ)
    figures: dict[str, list[tuple[float, float]]] = {"first": [], "again": []}
    for i in range(runs):
        lakehouse = tempfile.mkdtemp(prefix="cdc-bench-seed-")
        run_env = {**env, "OUT_DIR": lakehouse}
        try:
            for name, seq, changed in (("first", 1000, False), ("again", 2000, True)):
                child(SEED_WRITE.format(rows=rows, seq=seq, changed=changed), run_env)
                result = child(SEED_RUN.format(seq=seq), run_env)
                grew = result["peak_mb"] - result["before_mb"]
                figures[name].append((result["seconds"], grew))
                print(f"  run {i + 1} {name}: {result['seconds']:.2f} s, peak +{grew:.0f} MB: {result['outcome']}", flush=True)
        finally:
            shutil.rmtree(lakehouse, ignore_errors=True)
    print(f"\nmedians of {runs} runs, a {rows:,}-row table")
    print("| seed | seconds | peak RSS added, MB |")
    print("|---|---|---|")
    for name, label in (("first", "first snapshot, empty history"), ("again", "re-snapshot, 1% changed, 1% gone")):
        seconds = statistics.median(s for s, _ in figures[name])
        grew = statistics.median(g for _, g in figures[name])
        print(f"| {label} | {seconds:.2f} | {grew:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_options(parser)
    parser.add_argument("--seed-rows", type=int, default=0, help="measure a snapshot's history seed of this many rows")
    parser.add_argument("--more-oltp", type=int, default=10_000, help="transactions the incremental apply takes in")
    args = parser.parse_args()
    if args.seed_rows:
        _measure_seed(args.seed_rows, args.runs)
        return

    server = fresh_server()
    try:
        _measure(args, server)
    finally:
        local_server.stop(BENCH_DIR)


def _measure(args: argparse.Namespace, server: local_server.LocalServer) -> None:
    workload = generated(server, args)
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
