"""Tables too large to hold in memory, compared bucket by bucket.

The equality check and `verify` compare a current-state table with its source row for row. Read whole, a
10M-row table takes gigabytes on each side. Here each side is streamed once (the source in chunks inside its
consistent snapshot, the Delta table batch by batch); every row goes to the bucket its key falls in, spilled to
local Arrow files; then each pair of buckets is compared as a small table is. A key lands in the same bucket on both
sides, so the buckets' differences are the table's, and the order-independent checksums of the buckets add up
to the table's: the result is the one the whole tables in memory would give.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from cdc_assets.capture.spool import SpoolDirectory
from cdc_assets.core.arrow import release_unused_memory
from cdc_assets.core.names import TableRef
from cdc_assets.verification.compare import TableDiff, compare_tables
from cdc_assets.verification.row_hashes import CHECKSUM_MODULUS, row_bytes, row_hash_sum

LARGE_TABLE_ROWS = 500_000  # a table with more rows than this on either side is compared in buckets
BUCKET_ROWS = 200_000  # rows aimed at per bucket: about what each side holds in memory at once
STREAM_ROWS = 50_000  # rows read at once from either side before they are split into buckets
_SPILL_OPTIONS = ipc.IpcWriteOptions(compression="lz4")  # Arrow files: no encoding to undo, lz4 to spare the disk


def bucket_count(rows: int) -> int:
    return max(1, -(-rows // BUCKET_ROWS))


def key_buckets(rows: pa.Table, key_names: list[str], buckets: int) -> np.ndarray:
    """Each row's bucket: an integer key's value, or the CRC-32 of the key's bytes, modulo `buckets`.

    Depends only on the key's values and Arrow types, which are the same on both sides once aligned."""
    if buckets == 1:
        return np.zeros(rows.num_rows, np.int64)
    if len(key_names) == 1:  # decided by the type alone: a value must not move with the chunk it comes in
        column = rows.column(key_names[0])
        if pa.types.is_integer(column.type):  # NULL (a keyless table's) in bucket 0 on both sides
            return np.remainder(column.fill_null(0).to_numpy(), buckets).astype(np.int64)
    keys = row_bytes(rows, key_names).to_pylist()
    return np.fromiter((zlib.crc32(k) % buckets for k in keys), np.int64, len(keys))


class BucketSpill:
    """One side's rows, split by key into buckets, each a local Arrow file."""

    def __init__(self, directory: Path, side: str, key_names: list[str], buckets: int) -> None:
        self.directory, self.side, self.key_names, self.buckets = directory, side, key_names, buckets
        self.rows = 0
        self.hash_sum = 0  # row_hash_sum of the rows added
        self._writers: dict[int, ipc.RecordBatchFileWriter] = {}

    def _path(self, bucket: int) -> Path:
        return self.directory / f"{self.side}-{bucket:05d}.arrow"

    def add(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        self.rows += rows.num_rows
        self.hash_sum = (self.hash_sum + row_hash_sum(rows)) % CHECKSUM_MODULUS
        ids = key_buckets(rows, self.key_names, self.buckets)
        grouped = rows.take(pa.array(np.argsort(ids, kind="stable")))
        start = 0
        for bucket, count in enumerate(np.bincount(ids, minlength=self.buckets).tolist()):
            if count:
                if bucket not in self._writers:
                    self._writers[bucket] = ipc.new_file(self._path(bucket), rows.schema, options=_SPILL_OPTIONS)
                self._writers[bucket].write_table(grouped.slice(start, count))
            start += count
        release_unused_memory()  # the chunk's rows and their sorted copy are written: Arrow's pool keeps their pages

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()

    def read(self, bucket: int, schema: pa.Schema) -> pa.Table:
        if bucket not in self._writers:
            return schema.empty_table()
        with ipc.open_file(self._path(bucket)) as spilled:
            return spilled.read_all()


@dataclass
class BucketedResult:
    source_rows: int  # every row read from the source
    lakehouse_rows: int
    compared_rows: int  # the source rows `keep` kept
    source_hash_sum: int  # `row_hash_sum` of the kept rows of either side
    lakehouse_hash_sum: int
    diff: TableDiff  # over the kept rows


def hash_sum_streamed(chunks: Iterable[pa.Table], keep: Callable[[pa.Table], pa.Table]) -> tuple[int, int, int]:
    """Rows read, rows `keep` kept, and `row_hash_sum` of those, over chunks of one side."""
    read = kept = total = 0
    for chunk in chunks:
        read += chunk.num_rows
        rows = keep(chunk)
        kept += rows.num_rows
        total = (total + row_hash_sum(rows)) % CHECKSUM_MODULUS
    return read, kept, total


def compare_in_buckets(
    table: TableRef,
    schema: pa.Schema,
    source_chunks: Iterable[pa.Table],
    lake_chunks: Iterable[pa.Table],
    key: list[str],
    buckets: int,
    keep: Callable[[pa.Table], pa.Table] = lambda rows: rows,
) -> BucketedResult:
    """The two sides (chunks of `schema`, the lake's already aligned to it) compared as `compare_tables` would
    compare them whole; `keep` picks the rows to compare from every chunk of either side (in-flight keys out)."""
    key_names = key or schema.names
    with_spool = SpoolDirectory()
    try:
        source = BucketSpill(with_spool.path, "source", key_names, buckets)
        lake = BucketSpill(with_spool.path, "lake", key_names, buckets)

        def spill(chunks: Iterable[pa.Table], side: BucketSpill) -> int:
            read = 0
            try:
                for chunk in chunks:
                    read += chunk.num_rows
                    side.add(keep(chunk))
            finally:
                side.close()
            return read

        # The lakehouse side is read on a thread (delta-rs works outside the GIL) while this one reads the source.
        with ThreadPoolExecutor(1, thread_name_prefix="cdc-lake") as pool:
            lake_read = pool.submit(spill, lake_chunks, lake)
            source_read = spill(source_chunks, source)
            lake_rows = lake_read.result()
        diff = TableDiff(table, source.rows, lake.rows)
        for bucket in range(buckets):
            part = compare_tables(table, source.read(bucket, schema), lake.read(bucket, schema), key)
            diff.missing += part.missing
            diff.extra += part.extra
            diff.different += part.different
        for keys in (diff.missing, diff.extra, diff.different):
            keys.sort(key=repr)
        return BucketedResult(source_read, lake_rows, source.rows, source.hash_sum, lake.hash_sum, diff)
    finally:
        with_spool.remove()
