"""Whole source tables read fast, for verify, the equality check and snapshots.

PyMySQL turns every value of a result into a Python object through several calls (about 5 µs a row of six
columns). Here the query goes through PyMySQL's connection, but its rows are taken apart straight from the
packets into one list of raw values per column, and Arrow parses each column at once from the text the
server sends (its own printing of each type). The route stays independent of the binlog's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from pymysql.constants import COMMAND

from cdc_assets.core.mysql_types import (
    INTEGER_TYPES,
    ColumnSpec,
    arrow_schema,
    arrow_type,
    column_from_information_schema,
    decode_column,
    encode_sql_value,
    vector_array,
)
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.core.system_versioning import ROW_END, versioned_columns
from cdc_assets.source.wire import MAX_PACKET_PAYLOAD, read_payload

_NULL, _TWO_BYTES, _THREE_BYTES, _EIGHT_BYTES, _ERROR = 0xFB, 0xFC, 0xFD, 0xFE, 0xFF
# Dates MySQL allows that are no date (zero, or a zero month or day): NULL, as the binlog's side has them.
_NO_DATE = r"^(0000|\d{4}-00|\d{4}-\d{2}-00)"
_READ_BYTES = 1 << 20  # read from the socket at a time, at most
_GATHER_BYTES = 1 << 22  # a column's bytes in a window up to which they are gathered at once (numpy's index)


def query_columns(conn: pymysql.Connection, sql: str) -> list[pa.BinaryArray]:
    """The result of one SELECT as one binary array per column of the raw values (the server's text, null for
    NULL)."""
    chunks = list(query_chunks(conn, sql, rows_per_chunk=None))
    return chunks[0]


def query_chunks(conn: pymysql.Connection, sql: str, rows_per_chunk: int | None) -> Iterator[list[pa.BinaryArray]]:
    """The result of one SELECT in chunks of about `rows_per_chunk` rows (all at once for None), each as one
    binary array per column of the raw values; at least one chunk. Read it to the end: the connection is busy
    until then."""
    conn._execute_command(COMMAND.COM_QUERY, sql)
    width = conn._read_packet().read_length_encoded_integer()  # PyMySQL raises the server's error here
    for _ in range(width):  # column definitions: the caller knows the columns
        conn._read_packet()
    conn._read_packet()  # the EOF after them (PyMySQL does not ask for CLIENT_DEPRECATE_EOF)
    rows = _RowPackets(conn._rfile, width)  # the rows straight from the socket's buffer
    while True:
        parts: list[list[pa.Array]] = [[] for _ in range(width)]
        count = 0
        while not rows.ended and (rows_per_chunk is None or count < rows_per_chunk):
            window = rows.next_window(None if rows_per_chunk is None else rows_per_chunk - count)
            if window:  # none at the end of the rows
                for part, array in zip(parts, window, strict=True):
                    part.append(array)
                count += len(window[0])
        yield [_joined(p) for p in parts]
        if rows.ended:
            return


def _joined(parts: list[pa.Array]) -> pa.Array:
    """One column's windows as one array; a single window as it is (a copy of a huge value costs its size)."""
    if len(parts) == 1:
        return parts[0]
    return pa.concat_arrays(parts) if parts else pa.array([], pa.binary())


class _RowPackets:
    """Row packets of a text-protocol result, parsed a buffer at a time with numpy.

    Walking the packets is one Python step per row (each packet's header says where the next begins); taking
    the rows apart into columns is vectorized over all rows of the buffer, column by column."""

    def __init__(self, rfile: io.BufferedReader, width: int) -> None:
        self.rfile, self.width = rfile, width
        self.tail = b""  # bytes read past the last complete packet
        self.ended = False

    def _more(self) -> None:
        tail = self.tail
        if len(tail) >= 4:  # the rest of a packet whose length is known, read at once (not a buffer at a time,
            # which copied a packet of N MB N times)
            more = self.rfile.read(4 + (tail[0] | tail[1] << 8 | tail[2] << 16) - len(tail))
        else:
            more = self.rfile.read1(_READ_BYTES)  # blocks only while nothing is buffered: a packet is incomplete
        if not more:
            raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
        self.tail = tail + more if tail else more

    def _complete_packet(self) -> bool:
        tail = self.tail
        return len(tail) >= 4 and len(tail) >= 4 + (tail[0] | tail[1] << 8 | tail[2] << 16)

    def next_window(self, most: int | None) -> list[pa.Array]:
        """The complete row packets at hand (reading more only when none is), at most `most`, as one array per
        column; an empty list once the end of the rows is reached instead."""
        while not self._complete_packet():
            self._more()
        data, starts, pos = self.tail, [], 0
        end, left = len(data) - 4, most if most is not None else len(data)
        append = starts.append
        while pos <= end and left:  # the hot loop of a large read: one step per row, kept to a few operations
            length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            after = pos + 4 + length
            if after > end + 4:
                break
            if length >= MAX_PACKET_PAYLOAD or (length and data[pos + 4] >= _EIGHT_BYTES):
                first = data[pos + 4]
                if first == _EIGHT_BYTES and length < 9:  # EOF: the end of the rows
                    self.ended = True
                    pos = after
                    break
                if first == _ERROR:  # an error after some rows (a killed query, a lost lock)
                    pymysql.err.raise_mysql_exception(data[pos + 4 : after])
                if length == MAX_PACKET_PAYLOAD:  # a row of 16 MB or more, in several packets: on its own
                    if starts:
                        break
                    self.tail = data[pos:]
                    return self._long_row()
            append(pos + 4)
            pos = after
            left -= 1
        self.tail = data[pos:]
        if not starts:
            return []
        return _columns(np.frombuffer(data, np.uint8), np.array(starts, np.int64), self.width)

    def _long_row(self) -> list[pa.Array]:
        def read(n: int) -> bytes:
            """`n` bytes: what is buffered here first, then straight from the socket's reader."""
            head, self.tail = self.tail[:n], self.tail[n:]
            if len(head) == n:
                return head
            rest = self.rfile.read(n - len(head))
            if len(rest) < n - len(head):
                raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
            return head + rest if head else rest

        payload = read_payload(read)
        return _columns(np.frombuffer(payload, np.uint8), np.zeros(1, np.int64), self.width)


def _columns(data: np.ndarray, starts: np.ndarray, width: int) -> list[pa.Array]:
    """Rows in the text protocol (each a length-encoded string per column) starting at `starts`, as one binary
    array per column."""
    arrays = []
    at = starts
    for _ in range(width):
        first = data[at].astype(np.int64)
        null = first == _NULL
        length = np.where(first < _NULL, first, 0)
        header = np.ones(len(at), np.int64)
        for marker, size in ((_TWO_BYTES, 2), (_THREE_BYTES, 3), (_EIGHT_BYTES, 8)):
            rows = np.flatnonzero(first == marker)
            if rows.size:
                where = at[rows]
                value = np.zeros(rows.size, np.int64)
                for i in range(min(size, 4)):  # a value within one packet is shorter than 2**32
                    value |= data[where + 1 + i].astype(np.int64) << (8 * i)
                length[rows] = value
                header[rows] = 1 + size
        begin = at + header
        offsets = np.zeros(len(at) + 1, np.int64)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        if not total:
            values = np.zeros(0, np.uint8)
        elif len(at) == 1:  # one row (a long one, on its own): its bytes where they are
            values = data[int(begin[0]) : int(begin[0]) + total]
        elif total > _GATHER_BYTES:  # a gather's index takes 16 bytes per byte: values copied one by one
            values = np.concatenate([data[b : b + n] for b, n in zip(begin.tolist(), length.tolist(), strict=True)])
        else:
            values = data[np.repeat(begin - offsets[:-1], length) + np.arange(total)]
        nulls = int(null.sum())
        validity = pa.array(~null).buffers()[1] if nulls else None
        buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)]
        arrays.append(pa.Array.from_buffers(pa.binary(), len(at), buffers, null_count=nulls))
        at = begin + length
    return arrays


def source_column(col: ColumnSpec, binary: pa.BinaryArray) -> pa.Array:
    """Arrow array of the column's Delta type from the server's text of each value (`query_columns`)."""
    t, target = col.type, arrow_type(col)
    if t in ("binary", "varbinary", "blob"):
        return binary
    if t == "vector":  # the server sends a VECTOR's float32s as they are stored
        return vector_array(binary.to_pylist())
    if t in ("bit", "float", "geometry"):  # bytes, a FLOAT printed as the DOUBLE it holds, WKB after an SRID
        raw = binary.to_pylist()
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


# -- whole tables, in the Delta types -------------------------------------------------------------------------


def source_shapes(conn: pymysql.Connection, tables: list[TableRef]) -> dict[TableRef, TableShape | None]:
    """Today's shape of each table in the source (None: the table does not exist), in two queries for all of
    them (information_schema is slow to ask)."""
    found: dict[TableRef, tuple[list[ColumnSpec], list[str]]] = {t: ([], []) for t in tables}
    schemas = sorted({t.schema for t in tables})
    if not schemas:
        return dict.fromkeys(tables)
    marks = ", ".join(["%s"] * len(schemas))
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, "
            "DATETIME_PRECISION, CHARACTER_SET_NAME, CHARACTER_OCTET_LENGTH, COLUMN_KEY FROM information_schema.COLUMNS "
            f"WHERE TABLE_SCHEMA IN ({marks}) ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION",
            schemas,
        )
        for row in cur.fetchall():
            table = TableRef(row["TABLE_SCHEMA"], row["TABLE_NAME"])
            if table in found:
                found[table][0].append(column_from_information_schema(row))
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
            f"WHERE TABLE_SCHEMA IN ({marks}) AND CONSTRAINT_NAME = 'PRIMARY' "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION",
            schemas,
        )
        for row in cur.fetchall():
            table = TableRef(row["TABLE_SCHEMA"], row["TABLE_NAME"])
            if table in found:
                found[table][1].append(row["COLUMN_NAME"])
    return {t: _as_selected(TableShape(t, tuple(columns), tuple(key))) if columns else None for t, (columns, key) in found.items()}


def _as_selected(shape: TableShape) -> TableShape:
    """A table as `SELECT *` shows it: a system-versioned table without its system columns, and its key without
    `row_end` (MariaDB adds it to every key of such a table; core/system_versioning)."""
    versioned = versioned_columns(shape)
    if versioned is not None:
        return versioned.shape
    if ROW_END in shape.primary_key and ROW_END not in {c.name for c in shape.columns}:
        return TableShape(shape.table, shape.columns, tuple(k for k in shape.primary_key if k != ROW_END))
    return shape


def source_row_estimates(conn: pymysql.Connection, tables: list[TableRef]) -> dict[TableRef, int]:
    """The server's estimate of each table's rows (InnoDB's is approximate), in one query: enough to tell a
    table too large to read whole from one that is not."""
    found = dict.fromkeys(tables, 0)
    schemas = sorted({t.schema for t in tables})
    if not schemas:
        return found
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA IN ({', '.join(['%s'] * len(schemas))})",
            schemas,
        )
        for schema, name, rows in cur.fetchall():
            table = TableRef(schema, name)
            if table in found:
                found[table] = int(rows or 0)
    return found


def count_source_rows(conn: pymysql.Connection, table: TableRef) -> int:
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute(f"SELECT COUNT(*) FROM {quoted_table(table)}")
        return int(cur.fetchone()[0])


COUNTS_PER_STATEMENT = 200  # tables counted by one statement of `count_many_source_rows`


def count_many_source_rows(conn: pymysql.Connection, tables: Sequence[TableRef]) -> dict[TableRef, int]:
    """Each table's row count, a statement for up to COUNTS_PER_STATEMENT tables (`SELECT (SELECT COUNT(*) FROM a),
    (SELECT COUNT(*) FROM b), …`): inside a consistent snapshot every subquery reads that snapshot, as
    `count_source_rows` does, and a check over many tables costs a few statements, not one per table (issue 45)."""
    counts: dict[TableRef, int] = {}
    for start in range(0, len(tables), COUNTS_PER_STATEMENT):
        chunk = list(tables[start : start + COUNTS_PER_STATEMENT])
        counted = ", ".join(f"(SELECT COUNT(*) FROM {quoted_table(t)})" for t in chunk)
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(f"SELECT {counted}")
            counts |= {table: int(n) for table, n in zip(chunk, cur.fetchone(), strict=True)}
    return counts


def quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def quoted_table(table: TableRef) -> str:
    """`schema`.`table`, each name quoted."""
    return f"{quote_identifier(table.schema)}.{quote_identifier(table.table)}"


def select_expression(col: ColumnSpec) -> str:
    # FLOAT prints with 6 significant digits; as a DOUBLE it carries its exact value.
    return f"({quote_identifier(col.name)} + 0e0)" if col.type == "float" else quote_identifier(col.name)


def _select_all(table: TableRef, columns: list[ColumnSpec], order_by: Sequence[str] = ()) -> str:
    select = ", ".join(select_expression(c) for c in columns)
    order = f" ORDER BY {', '.join(quote_identifier(k) for k in order_by)}" if order_by else ""
    return f"SELECT {select} FROM {quoted_table(table)}{order}"


def _source_rows(columns: list[ColumnSpec], raw: list[pa.BinaryArray]) -> pa.Table:
    arrays = [source_column(col, values) for col, values in zip(columns, raw, strict=True)]
    return pa.Table.from_arrays(arrays, schema=arrow_schema(columns))


def read_source_table(conn: pymysql.Connection, table: TableRef, columns: list[ColumnSpec]) -> pa.Table:
    """The source table's rows in the Delta types."""
    return _source_rows(columns, query_columns(conn, _select_all(table, columns)))


def read_source_chunks(
    conn: pymysql.Connection,
    table: TableRef,
    columns: list[ColumnSpec],
    rows_per_chunk: int,
    order_by: Sequence[str] = (),
) -> Iterator[pa.Table]:
    """The source table's rows in the Delta types, `rows_per_chunk` at a time (for tables too large to hold),
    ordered by the columns `order_by` if any; at least one chunk. Read it to the end: the connection is busy
    until then."""
    for raw in query_chunks(conn, _select_all(table, columns, order_by), rows_per_chunk):
        yield _source_rows(columns, raw)


# -- key ranges, for snapshots read a chunk at a time -----------------------------------------------------------


def key_at_least(conn: pymysql.Connection, key: Sequence[str], values: Sequence[object]) -> str:
    """`(key) >= (values)` in the key's order, spelled out column by column (a row comparison may not use the
    index on every server)."""
    return _key_compare(conn, key, values, ">", ">=")


def key_below(conn: pymysql.Connection, key: Sequence[str], values: Sequence[object]) -> str:
    """`(key) < (values)` in the key's order, spelled out column by column."""
    return _key_compare(conn, key, values, "<", "<")


def _key_compare(conn: pymysql.Connection, key: Sequence[str], values: Sequence[object], strict: str, last: str) -> str:
    names = [quote_identifier(k) for k in key]
    literals = [conn.escape(v) for v in values]
    terms = []
    for n in range(len(names)):
        equal = [f"{names[i]} = {literals[i]}" for i in range(n)]
        op = last if n == len(names) - 1 else strict
        terms.append("(" + " AND ".join([*equal, f"{names[n]} {op} {literals[n]}"]) + ")")
    return "(" + " OR ".join(terms) + ")"


def key_boundaries(conn: pymysql.Connection, shape: TableShape, chunk_rows: int, rows_estimate: int) -> list[tuple]:
    """Keys that cut the table into chunks of about `chunk_rows` rows in primary-key order (chunk n holds the
    keys from boundary n-1 up to, not including, boundary n).

    Keys are walked: each boundary is the key `chunk_rows` index entries after the one before (any key type,
    composite ones too; one pass over the key's index in all). A single integer key whose values are dense (their
    span at most twice the server's row estimate) is cut into equal ranges of values instead, from two index
    look-ups: sparse keys or a stale estimate (a table just loaded) take the walk."""
    table, key = shape.table, list(shape.primary_key)
    name = quoted_table(table)
    columns = ", ".join(quote_identifier(k) for k in key)
    by_name = {c.name: c for c in shape.columns}
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        if len(key) == 1 and by_name[key[0]].type in INTEGER_TYPES:
            cur.execute(f"SELECT MIN({columns}), MAX({columns}) FROM {name}")
            low, high = cur.fetchone()
            if low is None:
                return []
            span = int(high) - int(low) + 1
            if rows_estimate and span <= 2 * rows_estimate:  # dense keys: equal ranges of values, about equal rows
                parts = -(-rows_estimate // chunk_rows)
                step = max(1, -(-span // parts))
                return [(int(low) + n * step,) for n in range(1, parts) if int(low) + n * step <= int(high)]
        bounds: list[tuple] = []
        while True:
            after = f" WHERE {key_at_least(conn, key, bounds[-1])}" if bounds else ""
            cur.execute(f"SELECT {columns} FROM {name}{after} ORDER BY {columns} LIMIT 1 OFFSET {chunk_rows}")
            row = cur.fetchone()
            if row is None:
                return bounds
            bounds.append(tuple(row))


def key_range_select(conn: pymysql.Connection, shape: TableShape, low: Sequence[object] | None, high: Sequence[object] | None) -> str:
    """The SELECT of the rows whose key is in [low, high) (None: unbounded on that side), in key order."""
    key = list(shape.primary_key)
    terms = ([key_at_least(conn, key, low)] if low is not None else []) + (
        [key_below(conn, key, high)] if high is not None else []
    )
    where = f" WHERE {' AND '.join(terms)}" if terms else ""
    return _select_all(shape.table, list(shape.columns)) + where + f" ORDER BY {', '.join(quote_identifier(k) for k in key)}"


def read_query_rows(conn: pymysql.Connection, columns: list[ColumnSpec], sql: str, rows_per_chunk: int) -> Iterator[pa.Table]:
    """The rows of one SELECT of `columns` (one statement: one consistent read), in the Delta types,
    `rows_per_chunk` at a time."""
    for raw in query_chunks(conn, sql, rows_per_chunk):
        yield _source_rows(columns, raw)


# -- rows by key, for the equality check of the keys an apply changed -------------------------------------------

KEYS_PER_QUERY = 1_000  # keys named in one SELECT: statements stay a few tens of kilobytes


def read_source_rows_with_keys(
    conn: pymysql.Connection, table: TableRef, columns: list[ColumnSpec], key: Sequence[str], keys: pa.Table
) -> pa.Table:
    """The source rows whose primary key (`key`, the columns of `keys`) is one of `keys`' rows, in the Delta
    types: one SELECT per KEYS_PER_QUERY keys, inside the connection's transaction (its consistent snapshot)."""
    names = [quote_identifier(k) for k in key]
    target = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    parts = [arrow_schema(columns).empty_table()]
    for start in range(0, keys.num_rows, KEYS_PER_QUERY):
        chunk = keys.slice(start, KEYS_PER_QUERY)
        values = zip(*(chunk.column(k).to_pylist() for k in key), strict=True)
        literals = [
            conn.escape(v[0]) if len(v) == 1 else "(" + ", ".join(conn.escape(x) for x in v) + ")" for v in values
        ]
        sql = f"{_select_all(table, columns)} WHERE {target} IN ({', '.join(literals)})"
        parts.append(_source_rows(columns, query_columns(conn, sql)))
    return pa.concat_tables(parts)
