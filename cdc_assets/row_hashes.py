"""Order-independent checksums of rows, and the bytes of a row they hash: the same on both sides of a comparison
whenever the rows and their Arrow types are."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CHECKSUM_MODULUS = 1 << 64
EMPTY_CHECKSUM = f"{0:016x}"
HASH_SLICE_ROWS = 20_000


def cell_bytes(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A column's values as bytes, for hashing: text and binary as they are, everything else as Arrow prints it."""
    if pa.types.is_binary(values.type):
        return values
    return pc.cast(values if pa.types.is_string(values.type) else pc.cast(values, pa.string()), pa.binary())


def row_bytes(rows: pa.Table, columns: list[str] | None = None) -> pa.ChunkedArray:
    """Each row's cells (of `columns`, default all) as bytes joined by a unit separator, NULL as a zero byte."""
    names = columns if columns is not None else rows.column_names
    cells = [cell_bytes(rows.column(n)) for n in names]
    return pc.binary_join_element_wise(*cells, b"\x1f", null_handling="replace", null_replacement=b"\x00")


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64s (wrapping arithmetic): every input bit moves every output bit."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def _hash_sum_of(rows: pa.BinaryArray, seed: np.uint64) -> int:
    """Sum of the 64-bit hashes of each row's bytes: each byte mixed with its position and the seed, the mixes
    added up per row and mixed again with the row's length. Vectorized: a few numpy passes over the bytes."""
    n = len(rows)
    offsets = np.frombuffer(rows.buffers()[1], np.int32)[rows.offset : rows.offset + n + 1].astype(np.int64)
    data = np.frombuffer(rows.buffers()[2], np.uint8) if rows.buffers()[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    first = offsets[0]
    data = data[first : offsets[-1]].astype(np.uint64)
    positions = np.arange(data.size, dtype=np.uint64) - np.repeat((offsets[:-1] - first).astype(np.uint64), lengths)
    with np.errstate(over="ignore"):
        mixed = _mix((positions << np.uint64(8)) ^ data ^ seed)
        running = np.concatenate([np.zeros(1, np.uint64), np.cumsum(mixed, dtype=np.uint64)])
        ends = (offsets - first).astype(np.int64)
        per_row = running[ends[1:]] - running[ends[:-1]]
        hashes = _mix(per_row ^ _mix(lengths.astype(np.uint64) ^ seed))
        return int(np.sum(hashes, dtype=np.uint64))


def row_hash_sum(rows: pa.Table) -> int:
    """Sum of 64-bit row hashes mod 2**64: independent of row order, duplicates count (keyless tables), and the
    column types are part of every row's hash (1 and '1' differ). Sums of disjoint parts add up to the whole's.
    A checksum to report and compare, not a proof: the row-for-row comparison is that."""
    if not rows.num_rows:
        return 0
    types = hashlib.blake2b(repr(rows.schema.types).encode(), digest_size=8).digest()
    seed = np.uint64(int.from_bytes(types, "big"))
    total = 0
    for chunk in row_bytes(rows).chunks:
        for start in range(0, len(chunk), HASH_SLICE_ROWS):  # bounds the uint64 temporaries (8 per byte)
            total += _hash_sum_of(chunk.slice(start, HASH_SLICE_ROWS), seed)
    return total % CHECKSUM_MODULUS


def checksum_text(total: int) -> str:
    return f"{total % CHECKSUM_MODULUS:016x}"


def content_checksum(rows: pa.Table) -> str:
    """`row_hash_sum` as hex."""
    return checksum_text(row_hash_sum(rows))
