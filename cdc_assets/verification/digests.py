"""Where a large table may differ from its source, found by key range without moving its rows: a digest per range.

A repair of a 10M-row table that drifted in a few rows should not bring 10M rows over the network to find them.
Here the source computes, in one query, the row count and the sum of a CRC-32 of every row's text per key range
(`INTERVAL(key, b1, …, bn)`), and the same is computed from the lakehouse's rows; only the ranges whose digests
differ are looked at row by row (verification/repair.py). The text of a value is one both sides write the same
byte for byte: MySQL's own text of the value (`CAST(… AS CHAR)`, text converted to utf8mb4, bytes as hex), each
prefixed by its length and NULL told apart, so no two rows share a text unless their values are equal.

Only a table keyed by one integer column, with no FLOAT or DOUBLE column (whose text differs between the server
and Python), is digested; any other is compared row by row. A range whose digests differ for any reason (a value
whose text the two sides write differently included) is only compared row by row: a digest never decides that
rows are equal on its own without a difference being possible to miss but by a CRC-32 sum coinciding.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from deltalake import DeltaTable

from cdc_assets.core.column_policy import policy_from_env
from cdc_assets.core.mysql_types import BINARY_TYPES, INTEGER_TYPES, PRINTED_BINARY_TYPES, ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.current_rows import DELETED_COLUMN
from cdc_assets.lake.delta import read_query, read_query_chunks
from cdc_assets.source.rows import quote_identifier
from cdc_assets.stages.current.apply import quote

ROWS_PER_RANGE = 20_000  # rows a range holds, about: what one differing range costs to compare row by row
STREAM_ROWS = 100_000  # lakehouse rows hashed at a time
_UNDIGESTED = ("float", "double")


def digestible(shape: TableShape) -> bool:
    """Whether the table's rows have a text both sides write alike and a key the server can cut into ranges."""
    if len(shape.primary_key) != 1 or policy_from_env().touches(shape):
        return False  # a column policy's values are made in Python (core/column_policy), not on the server
    key = next(c for c in shape.columns if c.name == shape.primary_key[0])
    return key.type in INTEGER_TYPES and not any(c.type in _UNDIGESTED for c in shape.columns)


def _value_sql(col: ColumnSpec) -> str:
    """The column's value as the text of a digest, on the server."""
    name = quote_identifier(col.name)
    if col.type in BINARY_TYPES or col.type == "vector":
        if col.type == "geometry":  # the lakehouse keeps the WKB without MySQL's 4-byte SRID prefix
            return f"HEX(SUBSTRING({name}, 5))"
        return f"HEX({name})"
    if col.type in ("bit", "year"):
        return f"CAST({name} AS SIGNED)"  # BIT(64)'s top bit set: negative, as the lakehouse's long holds it
    if col.type in INTEGER_TYPES or col.type in ("decimal", "date", "datetime", "timestamp", "time"):
        return f"CAST({name} AS CHAR)"
    if col.type in PRINTED_BINARY_TYPES:
        return f"CAST({name} AS CHAR)"
    return f"CONVERT({name} USING utf8mb4)"


def row_text_sql(shape: TableShape) -> str:
    """Each row's digest text, as a SQL expression: every value's byte length, a colon and its text; `-` for NULL."""
    parts = []
    for col in shape.columns:
        value = _value_sql(col)
        parts.append(f"IF({quote_identifier(col.name)} IS NULL, '-', CONCAT(LENGTH({value}), ':', {value}))")
    return "CONCAT(" + ", ".join(parts) + ")"


def _value_texts(col: ColumnSpec, values: pa.Array) -> pa.Array:
    """The column's values as the text of a digest (binary), in the lakehouse's process: as `_value_sql` writes."""
    t = values.type
    if col.type == "vector":
        texts = [None if v is None else np.asarray(v, "<f4").tobytes().hex().upper().encode() for v in values.to_pylist()]
        return pa.array(texts, pa.binary())
    if pa.types.is_binary(t):
        return pa.array([None if v is None else v.hex().upper().encode() for v in values.to_pylist()], pa.binary())
    if pa.types.is_timestamp(t):  # MySQL prints as many fraction digits as the column declares
        whole = pc.cast(pc.floor_temporal(values, unit="second"), pa.timestamp("s", tz=t.tz))
        text = pc.strftime(whole, format="%Y-%m-%d %H:%M:%S")
        if col.fsp:
            micros = np.mod(pc.fill_null(pc.cast(values, pa.int64()), 0).to_numpy(), 1_000_000)
            digits = pc.utf8_slice_codeunits(pc.utf8_lpad(pa.array(micros).cast(pa.string()), 6, "0"), 0, col.fsp)
            text = pc.binary_join_element_wise(text, digits, ".")
        return pc.cast(text, pa.binary())
    if pa.types.is_decimal(t):  # Arrow writes a zero of some scale as 0E-10; MySQL as 0.0000000000
        return pa.array([None if v is None else format(v, "f").encode() for v in values.to_pylist()], pa.binary())
    return pc.cast(pc.cast(values, pa.string()), pa.binary())


def _row_texts(shape: TableShape, rows: pa.Table) -> pa.Array:
    parts = []
    for col in shape.columns:
        values = rows.column(col.name).combine_chunks()
        texts = _value_texts(col, values)
        lengths = pc.cast(pc.binary_length(texts), pa.string())
        framed = pc.binary_join_element_wise(pc.cast(lengths, pa.binary()), texts, b":")
        parts.append(pc.fill_null(framed, b"-"))
    return pc.binary_join_element_wise(*parts, b"")


def range_bounds(current: DeltaTable, key: str) -> list[int]:
    """The lower bounds of key ranges of about ROWS_PER_RANGE of the lakehouse's rows each (the first is the
    smallest key: keys below it, on the source's side, fall in range 0)."""
    keys = read_query(current, f"SELECT {quote(key)} AS k FROM current ORDER BY k", "current").column("k")
    values = pc.cast(keys, pa.int64()) if not pa.types.is_decimal(keys.type) else keys
    picked = values.take(pa.array(range(0, len(values), ROWS_PER_RANGE))).to_pylist() if len(values) else []
    return [int(v) for v in picked]


Digests = dict[int, tuple[int, int]]  # range number -> (rows, sum of their CRC-32s)


def source_digests(conn: pymysql.Connection, shape: TableShape, bounds: Sequence[int]) -> Digests:
    """The source's digest of each key range, in one query (inside the connection's consistent snapshot)."""
    key = quote_identifier(shape.primary_key[0])
    table = f"{quote_identifier(shape.table.schema)}.{quote_identifier(shape.table.table)}"
    cut = f"INTERVAL({key}, {', '.join(str(b) for b in bounds)})" if bounds else "0"
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT {cut} AS r, COUNT(*), SUM(CRC32({row_text_sql(shape)})) FROM {table} GROUP BY r")
        return {int(r): (int(n), int(s)) for r, n, s in cur.fetchall()}


def _lake_chunks(current: DeltaTable, shape: TableShape) -> Iterator[pa.Table]:
    names = [f.name for f in pa.schema(current.schema().to_arrow())]
    where = f" WHERE {quote(DELETED_COLUMN)} IS NOT TRUE" if DELETED_COLUMN in names else ""
    columns = ", ".join(quote(c) for c in shape.column_names)
    yield from read_query_chunks(current, f"SELECT {columns} FROM current{where}", "current", STREAM_ROWS)


def lake_digests(current: DeltaTable, shape: TableShape, bounds: Sequence[int]) -> Digests:
    """The lakehouse's digest of each key range: as `source_digests`, from its current-state rows."""
    size = len(bounds) + 1
    counts = np.zeros(size, np.int64)
    sums = [0] * size
    for rows in _lake_chunks(current, shape):
        keys = rows.column(shape.primary_key[0])
        if pa.types.is_integer(keys.type):  # INTERVAL: range 0 below the first bound, i from bound i on
            ranges = np.searchsorted(np.asarray(bounds, np.int64), keys.to_numpy(), side="right")
        else:  # BIGINT UNSIGNED (decimal(20,0)): beyond int64
            ranges = np.fromiter((bisect.bisect_right(bounds, int(k)) for k in keys.to_pylist()), np.int64, rows.num_rows)
        crcs = np.fromiter((zlib.crc32(t) for t in _row_texts(shape, rows).to_pylist()), np.float64, rows.num_rows)
        counts += np.bincount(ranges, minlength=size)
        # each range's sum of CRC-32s in a chunk stays far below 2**53: exact in float64
        for r, total in enumerate(np.bincount(ranges, weights=crcs, minlength=size)):
            sums[r] += int(total)
    return {r: (int(counts[r]), sums[r]) for r in range(size) if counts[r]}


def differing_ranges(source: Digests, lake: Digests, bounds: Sequence[int]) -> list[tuple[int | None, int | None]]:
    """The key ranges [low, high) whose digests differ (None: unbounded)."""
    edges: list[int | None] = [None, *bounds, None]
    return [(edges[r], edges[r + 1]) for r in sorted(source.keys() | lake.keys()) if source.get(r) != lake.get(r)]


def keys_in_ranges(
    conn: pymysql.Connection, current: DeltaTable, table: TableRef, key: str, ranges: list[tuple[int | None, int | None]]
) -> set[tuple]:
    """Every key either side holds in the ranges: the rows to compare one by one."""
    if not ranges:
        return set()

    def where(quoted: str) -> str:
        parts = []
        for low, high in ranges:
            bounds = [f"{quoted} >= {low}" if low is not None else "", f"{quoted} < {high}" if high is not None else ""]
            parts.append("(" + (" AND ".join(b for b in bounds if b) or "TRUE") + ")")
        return " OR ".join(parts)

    with conn.cursor(pymysql.cursors.Cursor) as cur:
        q = quote_identifier(key)
        cur.execute(f"SELECT {q} FROM {quote_identifier(table.schema)}.{quote_identifier(table.table)} WHERE {where(q)}")
        found = {(row[0],) for row in cur.fetchall()}
    lake = read_query(current, f"SELECT {quote(key)} AS k FROM current WHERE {where(quote(key))}", "current")
    return found | {(v,) for v in lake.column("k").to_pylist()}
