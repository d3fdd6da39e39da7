"""Whole source tables read fast, for verify, the equality check and snapshots.

PyMySQL turns every value of a result into a Python object through several calls (about 5 µs a row of six
columns). Here the query goes through PyMySQL's connection, but its rows are taken apart straight from the
packets into one list of raw values per column, and Arrow parses each column at once from the text the
server sends (its own printing of each type). The route stays independent of the binlog's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from pymysql.constants import COMMAND

from cdc_assets.binlog.protocol import read_payload
from cdc_assets.mysql_types import INTEGER_TYPES, ColumnSpec, arrow_type, decode_column, encode_sql_value

_NULL, _TWO_BYTES, _THREE_BYTES, _EIGHT_BYTES, _ERROR = 0xFB, 0xFC, 0xFD, 0xFE, 0xFF
# Dates MySQL allows that are no date (zero, or a zero month or day): NULL, as the binlog's side has them.
_NO_DATE = r"^(0000|\d{4}-00|\d{4}-\d{2}-00)"


def query_columns(conn: pymysql.Connection, sql: str) -> list[list[bytes | None]]:
    """The result of one SELECT as one list per column of the raw values (the server's text, None for NULL)."""
    chunks = list(query_chunks(conn, sql, rows_per_chunk=None))
    return chunks[0]


def query_chunks(
    conn: pymysql.Connection, sql: str, rows_per_chunk: int | None
) -> Iterator[list[list[bytes | None]]]:
    """The result of one SELECT in chunks of `rows_per_chunk` rows (all at once for None), each as one list per
    column of the raw values; at least one chunk. Read it to the end: the connection is busy until then."""
    conn._execute_command(COMMAND.COM_QUERY, sql)
    width = conn._read_packet().read_length_encoded_integer()  # PyMySQL raises the server's error here
    for _ in range(width):  # column definitions: the caller knows the columns
        conn._read_packet()
    conn._read_packet()  # the EOF after them (PyMySQL does not ask for CLIENT_DEPRECATE_EOF)
    read = conn._rfile.read  # the rows straight from the socket's buffer: a header and a payload each
    while True:
        columns, done = _read_rows(read, width, rows_per_chunk)
        yield columns
        if done:
            return


def _read_rows(read: Callable[[int], bytes], width: int, limit: int | None) -> tuple[list[list[bytes | None]], bool]:
    """Up to `limit` rows as lists per column, and whether the result ended."""
    columns: list[list[bytes | None]] = [[] for _ in range(width)]
    appends = [c.append for c in columns]
    count = 0
    while limit is None or count < limit:
        data = read_payload(read)
        if data[0] == _EIGHT_BYTES and len(data) < 9:  # EOF: the end of the rows
            return columns, True
        if data[0] == _ERROR:  # an error after some rows (a killed query, a lost lock)
            pymysql.err.raise_mysql_exception(data)
        count += 1
        pos = 0
        for append in appends:
            first = data[pos]
            if first < _NULL:
                start = pos + 1
                pos = start + first
            elif first == _NULL:
                append(None)
                pos += 1
                continue
            else:
                size = 2 if first == _TWO_BYTES else 3 if first == _THREE_BYTES else 8
                start = pos + 1 + size
                pos = start + int.from_bytes(data[pos + 1 : start], "little")
            append(data[start:pos])
    return columns, False


def source_column(col: ColumnSpec, raw: list[bytes | None]) -> pa.Array:
    """Arrow array of the column's Delta type from the server's text of each value (`query_columns`)."""
    t, target = col.type, arrow_type(col)
    binary = pa.array(raw, pa.binary())
    if t in ("binary", "varbinary", "blob"):
        return binary
    if t in ("bit", "float", "geometry"):  # bytes, a FLOAT printed as the DOUBLE it holds, WKB after an SRID
        return decode_column(col, pa.array([encode_sql_value(col, _python_value(col, v)) for v in raw], pa.string()))
    text = binary.cast(pa.string())  # the connection's charset is utf8mb4
    if pa.types.is_string(target):  # text, ENUM, SET (members in definition order), JSON, TIME, DECIMAL(>38)
        return text
    if t in ("date", "datetime", "timestamp"):
        text = pc.if_else(pc.match_substring_regex(text, _NO_DATE), pa.scalar(None, pa.string()), text)
        try:
            naive = pc.cast(text, pa.date32() if t == "date" else pa.timestamp("us"))
        except pa.ArrowInvalid:  # a date MySQL allows and no calendar has (ALLOW_INVALID_DATES): NULL
            naive = pa.array([_date_or_none(t, v) for v in text.to_pylist()], pa.date32() if t == "date" else pa.timestamp("us"))
        return naive.cast(target)
    if t in INTEGER_TYPES or t in ("year", "decimal", "double"):
        return pc.cast(text, target)
    raise ValueError(f"no reading of source values of type {t!r} (column {col.name!r})")


def _python_value(col: ColumnSpec, value: bytes | None) -> object:
    if value is None or col.type != "float":
        return value
    return float(value)


def _date_or_none(kind: str, text: str | None) -> object:
    import datetime as dt

    if text is None:
        return None
    try:
        return dt.date.fromisoformat(text) if kind == "date" else dt.datetime.fromisoformat(text)
    except ValueError:
        return None
