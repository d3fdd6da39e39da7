"""Order-independent checksums of rows, and the bytes of a row they hash: the same on both sides of a comparison
whenever the rows and their Arrow types are."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

CHECKSUM_MODULUS = 1 << 64
EMPTY_CHECKSUM = f"{0:016x}"


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


def row_hash_sum(rows: pa.Table) -> int:
    """Sum of 64-bit row hashes mod 2**64: independent of row order, duplicates count (keyless tables), and the
    column types are part of every row's hash (1 and '1' differ). Sums of disjoint parts add up to the whole's."""
    if not rows.num_rows:
        return 0
    types = hashlib.blake2b(repr(rows.schema.types).encode(), digest_size=32).digest()
    total = sum(
        int.from_bytes(hashlib.blake2b(row, digest_size=8, key=types).digest(), "big")
        for row in row_bytes(rows).to_pylist()
    )
    return total % CHECKSUM_MODULUS


def checksum_text(total: int) -> str:
    return f"{total % CHECKSUM_MODULUS:016x}"


def content_checksum(rows: pa.Table) -> str:
    """`row_hash_sum` as hex."""
    return checksum_text(row_hash_sum(rows))
