"""Order-independent checksums of rows, and the bytes of a row's key for bucketing: the same on both sides of a
comparison whenever the rows and their Arrow types are."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import list_bytes

CHECKSUM_MODULUS = 1 << 64
EMPTY_CHECKSUM = f"{0:016x}"
HASH_SLICE_ROWS = 20_000  # rows hashed at once
HASH_BLOCK_BYTES = 1 << 20  # bytes of text hashed at once: bounds the temporaries (about 50 bytes per byte)
_NULL_WORD = np.uint64(0x9E3779B97F4A7C15)  # what a NULL cell contributes before its column's mixing


def cell_bytes(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A column's values as bytes: text and binary as they are, everything else as Arrow prints it."""
    if pa.types.is_binary(values.type):
        return values
    if pa.types.is_list(values.type):  # a VECTOR: its float32s' bytes, exact
        return list_bytes(values)
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


def _words(values: pa.Array) -> np.ndarray | None:
    """A fixed-width column's values as uint64 words, one row per line (integers, dates, times, timestamps,
    decimals: each value has one representation); None for the other types."""
    t = values.type
    exact = pa.types.is_integer(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t)
    if not exact or pa.types.is_interval(t) or t.bit_width % 8:
        return None
    width = t.bit_width // 8
    raw = np.frombuffer(values.buffers()[1], np.uint8)[values.offset * width : (values.offset + len(values)) * width]
    if width <= 8:
        return raw.view(f"<u{width}").astype(np.uint64).reshape(-1, 1)
    return raw.view("<u8").reshape(-1, width // 8)


def _text_hashes(values: pa.BinaryArray, seed: np.uint64) -> np.ndarray:
    """A 64-bit hash of each value's bytes: each byte mixed with its position and the seed, the mixes added
    up per value and mixed again with the value's length. A few numpy passes over the bytes, HASH_BLOCK_BYTES
    of them at a time (the passes take 8 bytes per byte: a 60 MB value hashed at once took gigabytes)."""
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset : values.offset + n + 1].astype(np.int64)
    buffer = values.buffers()[2]
    data = np.frombuffer(buffer, np.uint8) if buffer is not None else np.zeros(0, np.uint8)
    sums = np.empty(n, np.uint64)
    start = 0
    while start < n:  # runs of values of at most HASH_BLOCK_BYTES bytes in all; a longer value on its own
        end = int(np.searchsorted(offsets, offsets[start] + HASH_BLOCK_BYTES, side="right")) - 1
        end = min(max(end, start + 1), n)
        if end == start + 1 and offsets[end] - offsets[start] > HASH_BLOCK_BYTES:
            sums[start] = _long_byte_sum(data[offsets[start] : offsets[end]], seed)
        else:
            sums[start:end] = _byte_sums(data, offsets[start : end + 1], seed)
        start = end
    return _mix(sums ^ _mix(np.diff(offsets).astype(np.uint64) ^ seed))


def _byte_sums(data: np.ndarray, offsets: np.ndarray, seed: np.uint64) -> np.ndarray:
    """The sum of each value's mixed bytes (wrapping), for the values between `offsets`."""
    first = offsets[0]
    chunk = data[first : offsets[-1]].astype(np.uint64)
    positions = np.arange(chunk.size, dtype=np.uint64) - np.repeat((offsets[:-1] - first).astype(np.uint64), np.diff(offsets))
    running = np.concatenate([np.zeros(1, np.uint64), np.cumsum(_mix((positions << np.uint64(8)) ^ chunk ^ seed), dtype=np.uint64)])
    ends = offsets - first
    return running[ends[1:]] - running[ends[:-1]]


def _long_byte_sum(value: np.ndarray, seed: np.uint64) -> np.uint64:
    """`_byte_sums` of one value longer than HASH_BLOCK_BYTES, a block at a time."""
    total = np.uint64(0)
    for begin in range(0, value.size, HASH_BLOCK_BYTES):
        chunk = value[begin : begin + HASH_BLOCK_BYTES].astype(np.uint64)
        positions = np.arange(begin, begin + chunk.size, dtype=np.uint64)
        total += np.sum(_mix((positions << np.uint64(8)) ^ chunk ^ seed), dtype=np.uint64)
    return total


def _column_hashes(values: pa.Array, seed: np.uint64) -> np.ndarray:
    """Each cell's 64-bit hash, from its column's seed and its value; NULL apart from every value."""
    words = _words(values)
    if words is not None:
        hashes = np.full(len(values), seed, np.uint64)
        for i in range(words.shape[1]):
            hashes = _mix(hashes ^ words[:, i] ^ np.uint64(i))
    else:
        text = cell_bytes(values)
        hashes = _text_hashes(text.fill_null(b"") if text.null_count else text, seed)
    if values.null_count:
        hashes = np.where(values.is_null().to_numpy(zero_copy_only=False), _mix(np.uint64(seed) ^ _NULL_WORD), hashes)
    return hashes


def _hash_sum_of(rows: pa.Table, seeds: list[np.uint64]) -> int:
    """Sum of the rows' hashes: each row's cell hashes added up and mixed, so which cells share a row counts."""
    cells = np.zeros(rows.num_rows, np.uint64)
    for column, seed in zip(rows.columns, seeds, strict=True):
        cells += _column_hashes(column.combine_chunks(), seed)
    return int(np.sum(_mix(cells), dtype=np.uint64))


def row_hash_sum(rows: pa.Table) -> int:
    """Sum of 64-bit row hashes mod 2**64: independent of row order, duplicates count (keyless tables), and the
    column types are part of every row's hash (1 and '1' differ). Sums of disjoint parts add up to the whole's.
    A checksum to report and compare, not a proof: the row-for-row comparison is that."""
    if not rows.num_rows:
        return 0
    seeds = []
    for i, field in enumerate(rows.schema):  # each column's seed: its place and its type
        digest = hashlib.blake2b(f"{i}:{field.type}".encode(), digest_size=8).digest()
        seeds.append(np.uint64(int.from_bytes(digest, "big")))
    total = 0
    with np.errstate(over="ignore"):
        for start in range(0, rows.num_rows, HASH_SLICE_ROWS):
            total += _hash_sum_of(rows.slice(start, HASH_SLICE_ROWS), seeds)
    return total % CHECKSUM_MODULUS


def checksum_text(total: int) -> str:
    return f"{total % CHECKSUM_MODULUS:016x}"


def content_checksum(rows: pa.Table) -> str:
    """`row_hash_sum` as hex."""
    return checksum_text(row_hash_sum(rows))
