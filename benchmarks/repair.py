"""`cdc-lakehouse repair` beside `cdc-lakehouse snapshot`: a large table that drifted in a few rows made equal again.

    .venv/bin/python -m benchmarks.repair [--sizes 1000000,10000000] [--drift 4]

For each size, a table of N rows (as workload (b) makes it) is loaded by `snapshot`, then its current state is
changed behind the pipeline's back in a few rows (one deleted, some changed, one added that the source lacks), as a
partition emptied without row events or a tool writing to the Delta table would leave it. Then, each as a whole
process on the same drifted lakehouse copied twice, in one invocation: `repair TABLE` (only the rows that differ are
read again and written) and `snapshot TABLE` (the whole table read again), each followed by `verify` (not timed).
The ratio is repair's seconds over snapshot's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.large_table import SCHEMA, _cli, _table_env, make_table
from benchmarks.run import timed
from benchmarks.workloads import CLI, fresh_server
from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CURRENT

READER_SERVER_ID = 4244


def _drift(lakehouse: Path, table: str, rows: int, changed: int) -> None:
    """A few rows of the current state changed behind the pipeline's back: the first one deleted, `changed` rows
    across the key range given another note, and one row the source lacks added."""
    current = DeltaTable(str(lakehouse / CURRENT / TableRef(SCHEMA, table).path))
    current.delete("id = 1")
    keys = ", ".join(str(1 + (rows - 1) * (i + 1) // (changed + 1)) for i in range(changed))
    current.update(predicate=f"id IN ({keys})", updates={"note": "'drifted'"})
    schema = pa.schema(current.schema().to_arrow())
    extra = {f.name: [None] for f in schema} | {"id": [rows + 10], "account": [1], "_cdc_seq": [0]}
    write_deltalake(current, pa.table(extra).cast(schema), mode="append")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--drift", type=int, default=2, help="rows changed (besides one deleted and one added)")
    args = parser.parse_args()
    server = fresh_server()
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-repair-"))
    env = {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_SERVER_ID": str(READER_SERVER_ID),
        "CDC_SPARK_MASTER": os.environ.get("CDC_SPARK_MASTER", "local[2]"),
    }
    lines = []
    for size in [int(s) for s in args.sizes.split(",")]:
        table = f"t_{size}"
        make_table(server, table, size)
        table_env = _table_env(env, work, table)
        _cli(table_env, "snapshot")
        _drift(work / table, table, size, args.drift)
        measured = {}
        for command in ("repair", "snapshot"):
            copy = work / f"{table}-{command}"
            shutil.copytree(work / table, copy)
            run_env = {**table_env, "CDC_LAKEHOUSE": str(copy), "DAGSTER_HOME": str(work / f"{table}-{command}-dh")}
            done = timed(run_env, CLI, command, f"{SCHEMA}.{table}")
            if done["code"] != 0:
                raise SystemExit(f"{command} failed:\n{done['out']}{done['err']}")
            verdict = _cli(run_env, "verify").strip().splitlines()[-1]
            measured[command] = (done["seconds"], done["peak_mb"], verdict)
            print(f"{table}: {command} {done['seconds']:.1f} s, peak {done['peak_mb']:.0f} MB; verify: {verdict}", flush=True)
            shutil.rmtree(copy, ignore_errors=True)
        repair, snapshot = measured["repair"], measured["snapshot"]
        lines.append(
            f"| {size:,} | {args.drift + 2} | {repair[0]:.1f} | {repair[1]:,.0f} | {snapshot[0]:.1f} | {snapshot[1]:,.0f} "
            f"| {repair[0] / snapshot[0]:.2f} | {repair[2]} |"
        )
    print("\n| table rows | rows drifted | repair (s) | repair peak RSS (MB) | snapshot (s) | snapshot peak RSS (MB) "
          "| repair / snapshot | verify after repair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
