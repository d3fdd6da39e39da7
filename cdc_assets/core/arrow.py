"""Small Arrow helpers shared by the stages."""

from __future__ import annotations

import pyarrow as pa


def runs(rows: pa.Table, columns: list[str]) -> list[tuple[tuple, int, int]]:
    """(values, offset, length) of each run of equal values of `columns` in rows sorted by them: one table's
    part of a many-table result is then a slice, not a filter per table."""
    values = list(zip(*(rows.column(c).to_pylist() for c in columns), strict=True)) if rows.num_rows else []
    found: list[tuple[tuple, int, int]] = []
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or values[end] != values[start]:
            found.append((values[start], start, end - start))
            start = end
    return found


def sorted_by_key(rows: pa.Table, key: list[str] | tuple[str, ...]) -> pa.Table:
    """Rows in primary-key order, in one Arrow batch, so the files written from them hold disjoint key ranges
    (delta-rs deals separate batches out to its writers in turn: their files would interleave)."""
    ordered = rows.sort_by([(k, "ascending") for k in key]) if key and rows.num_rows else rows
    return ordered.combine_chunks()
