"""`cdc-lakehouse repair` beside `cdc-lakehouse snapshot`: a large table that drifted in a few rows made equal again.

    .venv/bin/python -m benchmarks.repair [--sizes 1000000,10000000] [--drift 2]

For each size, a table of N rows (as workload (b) makes it) is loaded by `snapshot`, then its current state is
changed behind the pipeline's back in a few rows (one deleted, some changed, one added that the source lacks), as a
partition emptied without row events or a tool writing to the Delta table would leave it. `repair TABLE` makes it
equal (the table's first repair: every data file's digest texts written). Then it drifts again in other rows, and
on two copies of that lakehouse, each as a whole process in one invocation: `repair TABLE` again (the digests of the
data files neither the first repair's apply nor the drift wrote again are kept from the first) and `snapshot TABLE`
(the whole table read again); each command is followed by `verify` (not timed). The ratios are a repair's seconds
over the snapshot's. Beside them, what any repair must read on the source, timed alone in this process: its digests
of every key range (cut as a repair cuts them) and the `COUNT(*)` of the check after its apply.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.large_table import SCHEMA, _cli, _table_env, make_table
from benchmarks.run import timed
from benchmarks.workloads import CLI, fresh_server
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.lake.layout import CURRENT
from cdc_assets.source import server as source
from cdc_assets.source.rows import count_source_rows, source_shapes
from cdc_assets.verification import digests

READER_SERVER_ID = 4244


def _drift(lakehouse: Path, table: str, rows: int, changed: int, shift: int = 0) -> None:
    """A few rows of the current state changed behind the pipeline's back: key `1 + shift` deleted, `changed` rows
    across the key range given another note, and one row the source lacks added."""
    current = DeltaTable(str(lakehouse / CURRENT / TableRef(SCHEMA, table).path))
    current.delete(f"id = {1 + shift}")
    keys = ", ".join(str(1 + shift + (rows - 1) * (i + 1) // (changed + 1)) for i in range(changed))
    current.update(predicate=f"id IN ({keys})", updates={"note": "'drifted'"})
    schema = pa.schema(current.schema().to_arrow())
    extra = {f.name: [None] for f in schema} | {"id": [rows + 10 + shift], "account": [1], "_cdc_seq": [0]}
    write_deltalake(current, pa.table(extra).cast(schema), mode="append")


def _run(env: dict[str, str], lakehouse: Path, home: Path, *command: str) -> tuple[float, float, str, str]:
    """A command timed as a whole process on `lakehouse`, then `verify` (not timed): seconds, peak RSS, its
    output and verify's last line."""
    run_env = {**env, "CDC_LAKEHOUSE": str(lakehouse), "DAGSTER_HOME": str(home)}
    done = timed(run_env, CLI, *command)
    if done["code"] != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done['out']}{done['err']}")
    verdict = _cli(run_env, "verify").strip().splitlines()[-1]
    return done["seconds"], done["peak_mb"], done["out"], verdict


def _source_reads(env: dict[str, str], lakehouse: Path, table: str) -> tuple[float, float]:
    """Seconds of the source's digests of every key range of the table and of its `COUNT(*)`, each timed alone: the
    two reads of every source row a repair and the check after its apply make."""
    url, ref = MySQLUrl.parse(env["CDC_MYSQL_URL"]), TableRef.parse(table)
    current = DeltaTable(str(lakehouse / CURRENT / ref.path))
    conn = source.connect(url)
    try:
        shape = source_shapes(conn, [ref])[ref]
        assert shape is not None
        ranges = digests.ranges_by_file_statistics(current, shape.primary_key[0])
        assert ranges is not None
        began = time.monotonic()
        digests.source_digests(url, shape, ranges)
        digested = time.monotonic() - began
        began = time.monotonic()
        count_source_rows(conn, ref)
        return digested, time.monotonic() - began
    finally:
        conn.close()


def _kept(out: str) -> str:
    """How many of the table's data files' digests the repair found kept, from its report."""
    found = re.search(r"(\d+) of (\d+) data files' digests kept", out)
    return f"{found.group(1)} of {found.group(2)}" if found else "-"


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
        table, name = f"t_{size}", f"{SCHEMA}.t_{size}"
        make_table(server, table, size)
        table_env = _table_env(env, work, table)
        _cli(table_env, "snapshot")
        _drift(work / table, table, size, args.drift)
        first = _run(table_env, work / table, work / f"{table}-dh", "repair", name)
        print(f"{table}: first repair {first[0]:.1f} s, peak {first[1]:.0f} MB; verify: {first[3]}", flush=True)
        _drift(work / table, table, size, args.drift, shift=1)
        copy = work / f"{table}-snapshot"
        shutil.copytree(work / table, copy)
        again = _run(table_env, work / table, work / f"{table}-dh", "repair", name)
        print(f"{table}: repair again {again[0]:.1f} s, peak {again[1]:.0f} MB, {_kept(again[2])} files' digests kept; verify: {again[3]}", flush=True)
        reads = _source_reads(table_env, work / table, name)
        print(f"{table}: the source's digests alone {reads[0]:.1f} s, its COUNT(*) alone {reads[1]:.1f} s", flush=True)
        snapshot = _run(table_env, copy, work / f"{table}-snapshot-dh", "snapshot", name)
        print(f"{table}: snapshot {snapshot[0]:.1f} s, peak {snapshot[1]:.0f} MB; verify: {snapshot[3]}", flush=True)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(work / table, ignore_errors=True)
        lines.append(
            f"| {size:,} | {args.drift + 2} | {first[0]:.1f} | {again[0]:.1f} | {_kept(again[2])} | {first[1]:,.0f} | {again[1]:,.0f} "
            f"| {snapshot[0]:.1f} | {snapshot[1]:,.0f} | {first[0] / snapshot[0]:.2f} | {again[0] / snapshot[0]:.2f} "
            f"| {reads[0]:.1f} + {reads[1]:.1f} | {again[3]} |"
        )
    print("\n| table rows | rows drifted | first repair (s) | repair again (s) | data files' digests kept | first repair peak RSS (MB) | repair again peak RSS (MB) "
          "| snapshot (s) | snapshot peak RSS (MB) | first repair / snapshot | repair again / snapshot "
          "| the source's digests + COUNT(*) alone (s) | verify after repair |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
