"""Current-state data files' digest rows, kept beside the lakehouse: per row, its file's name, its key, a CRC-32.

A repair digests a large table's key ranges on both sides (verification/digests.py). On the lakehouse's side that
means writing every row's text and its CRC-32, the larger part of a repair's time, though a Delta data file never
changes once written: an update writes a new file under a new name and removes the old one from the table. So the
key and CRC-32 of each row are kept once computed, under a name made of its file's (path, size and modification
time in the Delta log) and of how its text is written (the table's columns and their types), and a later repair
writes texts only for the files written since. Rows under a name the table no longer has are never read as its.

A table's current state holds thousands of small files, so the rows of many files share one object, of about
OBJECT_ROWS rows: `_state/file_digests/<schema>/<table>/<id>.parquet`. A repair removes an object none of whose files
the table still holds, and writes one holding more rows of removed files than of present ones again without them:
what is kept of removed files stays below what is kept of present ones. A rewrite that removes rows from storage
(`forget`, a policy rewrite) removes the table's objects, and so does a repair that finds such a rewrite committed
while it digested; dropping the table removes them too.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import file_digests_folder
from cdc_assets.lake.store import MissingObject, ObjectStore

OBJECT_ROWS = 1_000_000  # digest rows an object holds, about


def file_digest_schema(key_type: pa.DataType) -> pa.Schema:
    """An object's columns: a file's name once per object (dictionary-encoded), each row's key and CRC-32."""
    return pa.schema([("name", pa.dictionary(pa.int32(), pa.string())), ("key", key_type), ("crc", pa.uint32())])


def _folder(table: TableRef) -> str:
    return file_digests_folder(table.path)


@dataclass
class KeptDigests:
    """What was kept for the files named (their rows went to the loader's `take`), and what to tidy."""

    names: set[str]  # the names whose rows were taken: at most one object's rows per name
    carried: list[pa.Table]  # rows to write again in objects of their own (theirs held mostly removed files' rows)
    stale: list[str]  # objects to remove once those are written


def load_file_digests(
    store: ObjectStore, table: TableRef, names: set[str], key_type: pa.DataType, take: Callable[[pa.Table], None]
) -> KeptDigests:
    """The rows kept under `names`, each object's (name, key, crc) handed to `take` as it is read, never all held at
    once (a 10M-row table's are 160 MB); and what to tidy: objects of no present file, or of mostly removed ones."""
    kept = KeptDigests(set(), [], [])
    schema = file_digest_schema(key_type)
    for key in store.list_keys(_folder(table)):
        try:
            rows = pq.read_table(io.BytesIO(store.get(key)), read_dictionary=["name"])
        except (MissingObject, pa.ArrowInvalid):
            kept.stale.append(key)  # gone meanwhile, or not whole: its files' texts are written again
            continue
        if rows.schema != schema:
            kept.stale.append(key)  # written for another key type
            continue
        names_here = rows.column("name").combine_chunks()
        indices = names_here.indices.to_numpy(zero_copy_only=False)
        dictionary = names_here.dictionary.to_pylist()
        # the names of rows it holds (a dictionary may list a name none of its rows has: never taken as kept)
        held = [name for name, n in zip(dictionary, np.bincount(indices, minlength=len(dictionary)), strict=True) if n]
        fresh = (set(held) & names) - kept.names
        wanted = np.array([name in fresh for name in dictionary], bool)[indices]
        mine = rows if wanted.all() else rows.filter(pa.array(wanted))
        kept.names |= fresh
        if mine.num_rows:
            take(mine)
        if 2 * mine.num_rows < rows.num_rows:
            kept.stale.append(key)
            if mine.num_rows:
                kept.carried.append(mine)
    return kept


class FileDigestWriter:
    """Digest rows (`name`, `key`, `crc`) kept in objects of about OBJECT_ROWS rows as they come, each object
    written whole or not at all."""

    def __init__(self, store: ObjectStore, table: TableRef) -> None:
        self.store, self.table = store, table
        self.pending: list[pa.Table] = []
        self.held = 0

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self.pending.append(rows.cast(file_digest_schema(rows.schema.field("key").type)))
            self.held += rows.num_rows
        if self.held >= OBJECT_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        sink = io.BytesIO()
        pq.write_table(pa.concat_tables(self.pending).unify_dictionaries().combine_chunks(), sink, compression="zstd")
        self.store.put(f"{_folder(self.table)}/{uuid.uuid4().hex}.parquet", sink.getvalue())
        self.pending, self.held = [], 0


def remove_objects(store: ObjectStore, keys: list[str]) -> None:
    """Remove objects a load found stale, once what they held that is still needed is written elsewhere."""
    for key in keys:
        store.delete(key)


def remove_file_digests(store: ObjectStore, table: TableRef) -> None:
    """Remove every digest row kept for the table (its rows removed from storage, or the table dropped)."""
    for key in store.list_keys(_folder(table)):
        store.delete(key)
