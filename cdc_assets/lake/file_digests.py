"""Each current-state data file's digest rows, kept beside the lakehouse: a key and a CRC-32 per row.

A repair digests a large table's key ranges on both sides (verification/digests.py). On the lakehouse's side that
means writing every row's text and its CRC-32, the larger part of a repair's time, though a Delta data file never
changes once written: an update writes a new file under a new name and removes the old one from the table. So the
key and CRC-32 of each row of a file are kept once computed, named after the file (its path, size and
modification time in the Delta log) and after how its texts are written (the table's columns and their types), and
a later repair reads only the files written since. An object named after a file the table no longer holds, or after
columns it no longer has, is never read again; the repair that finds it removes it.

Under `_state/file_digests/<schema>/<table>/<name>.parquet`: a CRC-32 of a row's text is kept only while the file
holding the row is part of the table, and a rewrite that removes rows from storage (`forget`) or a table dropped
removes its table's objects with them.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import FILE_DIGESTS_STATE
from cdc_assets.lake.store import MissingObject, ObjectStore

FILE_DIGEST_SCHEMAS = (pa.schema([("key", pa.int64()), ("crc", pa.uint32())]), pa.schema([("key", pa.uint64()), ("crc", pa.uint32())]))


def _folder(table: TableRef) -> str:
    return f"{FILE_DIGESTS_STATE}/{table.path}"


def load_file_digests(store: ObjectStore, table: TableRef, name: str) -> pa.Table | None:
    """The digest rows kept under `name` (None: not kept)."""
    try:
        data = store.get(f"{_folder(table)}/{name}.parquet")
    except MissingObject:
        return None
    rows = pq.read_table(io.BytesIO(data))
    if rows.schema not in FILE_DIGEST_SCHEMAS:
        return None  # written otherwise: computed again
    return rows


def save_file_digests(store: ObjectStore, table: TableRef, name: str, rows: pa.Table) -> None:
    """Keep a file's digest rows (`key`, `crc`) under `name`: written whole or not at all."""
    sink = io.BytesIO()
    pq.write_table(rows, sink, compression="zstd")
    store.put(f"{_folder(table)}/{name}.parquet", sink.getvalue())


def keep_only_file_digests(store: ObjectStore, table: TableRef, names: set[str]) -> int:
    """Remove the table's kept digest rows not under `names` (files the table no longer holds, or texts written
    for other columns); returns how many were removed."""
    removed = 0
    for key in store.list_keys(_folder(table)):
        if key.rsplit("/", 1)[-1].removesuffix(".parquet") not in names:
            store.delete(key)
            removed += 1
    return removed


def remove_file_digests(store: ObjectStore, table: TableRef) -> None:
    """Remove every digest row kept for the table (its rows removed from storage, or the table dropped)."""
    store.delete_table(_folder(table))
