"""The order-independent row checksum (no server)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from cdc_assets.row_hashes import CHECKSUM_MODULUS, _hash_sum_of, row_bytes, row_hash_sum


def test_sums_of_parts_add_up_to_the_whole_whatever_the_slicing() -> None:
    rows = pa.table({"id": np.arange(50_000), "s": [f"x{i}" if i % 9 else None for i in range(50_000)]})
    parts = (row_hash_sum(rows.slice(0, 12_345)) + row_hash_sum(rows.slice(12_345))) % CHECKSUM_MODULUS
    assert parts == row_hash_sum(rows)
    assert row_hash_sum(rows.slice(7)) == row_hash_sum(pa.Table.from_pylist(rows.slice(7).to_pylist(), rows.schema))


def test_distinct_rows_hash_apart() -> None:
    """Short rows that differ by one byte, by order of bytes, or by length: no two share a hash."""
    values = [chr(65 + i % 26) * (i % 5) + str(i % 300) for i in range(20_000)]
    rows = row_bytes(pa.table({"v": values, "n": [i % 7 for i in range(20_000)]})).combine_chunks()
    hashes = {_hash_sum_of(rows.slice(i, 1), np.uint64(1)) for i in range(len(rows))}
    assert len(hashes) == len(set(rows.to_pylist()))
    assert row_hash_sum(pa.table({"v": ["ab"]})) != row_hash_sum(pa.table({"v": ["ba"]}))
    assert row_hash_sum(pa.table({"v": ["a", "b"]})) != row_hash_sum(pa.table({"v": ["ab", ""]}))
