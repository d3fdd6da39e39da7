"""Small Arrow helpers shared by the stages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


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


def release_unused_memory() -> None:
    """Give the system back the memory Arrow's allocator (mimalloc) keeps of what was freed, for reuse: after a step
    that held a huge value, its peak would otherwise stay for the rest of the process, and the next step's come on
    top of it. Microseconds: called after each batch, append, table step and comparison. (glibc's `malloc_trim`
    would give back a little more, but walks the whole heap: tenths of a second for a large one.)"""
    pa.default_memory_pool().release_unused()


def where(rows: pa.Table, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
    """`rows.filter(mask)` (a NULL drops its row), without a copy when the rows kept are one stretch (every row,
    none, or those after a schema change): a filter copies every value it keeps, and one may be hundreds of
    megabytes."""
    kept = pc.indices_nonzero(pc.fill_null(mask, False)).to_numpy()
    if not len(kept):
        return rows.schema.empty_table()  # not a slice: that would hold every buffer of `rows`
    first, count = int(kept[0]), len(kept)
    if int(kept[-1]) - first + 1 == count:
        return rows.slice(first, count)
    return rows.filter(mask)


def whole(values: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (`combine_chunks` copies even that one)."""
    if values.num_chunks == 1:
        return values.chunk(0)
    return values.combine_chunks() if values.num_chunks else pa.array([], values.type)


def sorted_rows(rows: pa.Table, sort_keys: str | list[tuple[str, str]]) -> pa.Table:
    """`rows.sort_by(sort_keys)`, without the copy when the rows are in that order already (the common case in the
    stages, whose rows come in seq order): a take copies every value, and one may be hundreds of megabytes."""
    keys = [(sort_keys, "ascending")] if isinstance(sort_keys, str) else sort_keys
    if rows.num_rows < 2:
        return rows
    order = pc.sort_indices(rows.select([name for name, _ in keys]), keys).to_numpy()
    return rows if (order[1:] > order[:-1]).all() else rows.take(order)


def sorted_by_key(rows: pa.Table, key: list[str] | tuple[str, ...]) -> pa.Table:
    """Rows in primary-key order, in one Arrow batch, so the files written from them hold disjoint key ranges
    (delta-rs deals separate batches out to its writers in turn: their files would interleave). A keyless table's
    "key" is every column: a list column (a VECTOR) among them is ordered by its elements' bytes."""
    if not key or not rows.num_rows:
        return rows.combine_chunks()
    keys = rows.select(list(key))
    if any(pa.types.is_list(rows.schema.field(k).type) for k in key):
        keys = with_lists_as_bytes(keys)
    order = pc.sort_indices(keys, [(k, "ascending") for k in key]).to_numpy()
    if (order[1:] > order[:-1]).all():  # in order already: no copy (of a table whose rows may be huge)
        return rows.combine_chunks()
    return rows.take(order).combine_chunks()


# A VECTOR is a list of float32s. Arrow neither sorts, groups nor joins by a list, and a Python list is no dict key:
# where a row's values are compared whole (keyless tables), a list stands in as the bytes of its elements, which are
# the list, exactly.


def list_bytes(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each list of numbers as the little-endian bytes of its elements (NULL stays NULL)."""
    dtype = np.dtype(values.type.value_type.to_pandas_dtype()).newbyteorder("<")
    return pa.array([None if v is None else np.asarray(v, dtype).tobytes() for v in values.to_pylist()], pa.binary())


def with_lists_as_bytes(rows: pa.Table) -> pa.Table:
    """The rows with each list column as `list_bytes`, for sorting and grouping."""
    for i, field in enumerate(rows.schema):
        if pa.types.is_list(field.type):
            rows = rows.set_column(i, field.name, list_bytes(rows.column(i)))
    return rows


def lists_from_bytes(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`with_lists_as_bytes` undone for the list columns `schema` names."""
    for field in schema:
        if pa.types.is_list(field.type) and field.name in rows.column_names:
            dtype = np.dtype(field.type.value_type.to_pandas_dtype()).newbyteorder("<")
            values = [None if v is None else np.frombuffer(v, dtype).tolist() for v in rows.column(field.name).to_pylist()]
            rows = rows.set_column(rows.column_names.index(field.name), field.name, pa.array(values, field.type))
    return rows


def hashable(values: tuple) -> tuple:
    """A row's values as a dict key: lists (VECTORs) as tuples."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)
