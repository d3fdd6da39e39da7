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


def sorted_by_key(rows: pa.Table, key: list[str] | tuple[str, ...]) -> pa.Table:
    """Rows in primary-key order, in one Arrow batch, so the files written from them hold disjoint key ranges
    (delta-rs deals separate batches out to its writers in turn: their files would interleave). A keyless table's
    "key" is every column: a list column (a VECTOR) among them is ordered by its elements' bytes."""
    if not key or not rows.num_rows:
        return rows.combine_chunks()
    if any(pa.types.is_list(rows.schema.field(k).type) for k in key):
        order = pc.sort_indices(with_lists_as_bytes(rows.select(list(key))), [(k, "ascending") for k in key])
        return rows.take(order).combine_chunks()
    return rows.sort_by([(k, "ascending") for k in key]).combine_chunks()


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
