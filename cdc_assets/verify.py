"""Row-for-row comparison of current-state tables with the source.

The source side is read with SQL and typed from the server's own text of each value (source_rows), a route
independent of the binlog decoding, then both sides are compared as Arrow tables of the Delta types.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pymysql

from cdc_assets.current_state import read_current, sorted_by_key
from cdc_assets.lakehouse import Lakehouse, TableRef
from cdc_assets.mysql_types import (
    ColumnSpec,
    arrow_schema,
    column_from_information_schema,
)
from cdc_assets.source_rows import query_chunks, query_columns, source_column
from cdc_assets.state import known_tables

if TYPE_CHECKING:
    from cdc_assets.consistency import ConsistentComparison
    from cdc_assets.resources import BinlogResource

MAX_KEYS_SHOWN = 20


@dataclass
class TableDiff:
    """How a current-state table differs from its source table (empty lists: identical)."""

    table: TableRef
    source_rows: int = 0
    lakehouse_rows: int = 0
    missing: list[tuple] = field(default_factory=list)  # keys in the source, not in the lakehouse
    extra: list[tuple] = field(default_factory=list)  # keys in the lakehouse, not in the source
    different: list[tuple] = field(default_factory=list)  # keys whose values differ
    schema_problem: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different or self.schema_problem)

    def describe(self) -> str:
        if self.ok:
            return f"{self.table}: {self.source_rows} rows match"
        if self.schema_problem:
            return f"{self.table}: {self.schema_problem}"
        parts = []
        for label, keys in (("missing", self.missing), ("extra", self.extra), ("different", self.different)):
            if keys:
                shown = ", ".join(_key_text(k) for k in keys[:MAX_KEYS_SHOWN])
                more = f" (+{len(keys) - MAX_KEYS_SHOWN} more)" if len(keys) > MAX_KEYS_SHOWN else ""
                parts.append(f"{len(keys)} {label}: {shown}{more}")
        return f"{self.table}: source {self.source_rows} rows, lakehouse {self.lakehouse_rows} rows; " + "; ".join(
            parts
        )


def _key_text(key: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in key) + ")" if len(key) != 1 else repr(key[0])


def source_table_schema(conn: pymysql.Connection, table: TableRef) -> tuple[list[ColumnSpec], list[str]]:
    """Today's columns and primary key of a source table (empty columns: the table does not exist)."""
    return source_table_schemas(conn, [table])[table]


def source_table_schemas(
    conn: pymysql.Connection, tables: list[TableRef]
) -> dict[TableRef, tuple[list[ColumnSpec], list[str]]]:
    """`source_table_schema` of many tables, in two queries for all of them (information_schema is slow to ask)."""
    found: dict[TableRef, tuple[list[ColumnSpec], list[str]]] = {t: ([], []) for t in tables}
    schemas = sorted({t.schema for t in tables})
    if not schemas:
        return found
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
    return found


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
        cur.execute(f"SELECT COUNT(*) FROM {quote_identifier(table.schema)}.{quote_identifier(table.table)}")
        return int(cur.fetchone()[0])


def quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def select_expression(col: ColumnSpec) -> str:
    # FLOAT prints with 6 significant digits; as a DOUBLE it carries its exact value.
    return f"({quote_identifier(col.name)} + 0e0)" if col.type == "float" else quote_identifier(col.name)


def _select_all(table: TableRef, columns: list[ColumnSpec], order_by: Sequence[str] = ()) -> str:
    select = ", ".join(select_expression(c) for c in columns)
    order = f" ORDER BY {', '.join(quote_identifier(k) for k in order_by)}" if order_by else ""
    return f"SELECT {select} FROM {quote_identifier(table.schema)}.{quote_identifier(table.table)}{order}"


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


def _by_key(table: pa.Table, key: list[str]) -> dict[tuple, list[tuple]]:
    rows: dict[tuple, list[tuple]] = {}
    names = table.column_names
    key_idx = [names.index(k) for k in key]
    for values in zip(*(table.column(n).to_pylist() for n in names), strict=True) if table.num_rows else []:
        rows.setdefault(tuple(values[i] for i in key_idx), []).append(tuple(values))
    return rows


def compare_tables(table: TableRef, source: pa.Table, lakehouse: pa.Table, key: list[str]) -> TableDiff:
    """Compare two tables with the same columns, keyed by `key` (all columns when there is no key).

    Both sorted by the key and equal as Arrow tables is the common case, proved without a Python value per
    cell; only tables that differ are compared key by key, to say which keys differ."""
    key = key or source.column_names
    diff = TableDiff(table, source.num_rows, lakehouse.num_rows)
    if source.num_rows == lakehouse.num_rows and sorted_by_key(source, key).equals(sorted_by_key(lakehouse, key)):
        return diff
    left, right = _by_key(source, key), _by_key(lakehouse, key)
    diff.missing = sorted((k for k in left if k not in right), key=repr)
    diff.extra = sorted((k for k in right if k not in left), key=repr)
    diff.different = sorted(
        (k for k in left if k in right and sorted(left[k], key=repr) != sorted(right[k], key=repr)), key=repr
    )
    return diff


def verify_table(conn: pymysql.Connection, lakehouse: Lakehouse, table: TableRef) -> TableDiff:
    columns, key = source_table_schema(conn, table)
    current = read_current(lakehouse, table)
    if not columns:
        if current is None or current.num_rows == 0:
            return TableDiff(table)
        return TableDiff(
            table, lakehouse_rows=current.num_rows, schema_problem="the table no longer exists in the source"
        )
    source = read_source_table(conn, table, columns)
    if current is None:
        diff = TableDiff(table, source_rows=source.num_rows)
        if source.num_rows:
            diff.schema_problem = "the lakehouse has no current-state table for it yet (run `cdc-lakehouse sync`)"
        return diff
    aligned = align_current(table, source, current)
    if isinstance(aligned, TableDiff):
        return aligned
    return compare_tables(table, source, aligned, key)


def align_current(table: TableRef, source: pa.Table, current: pa.Table) -> pa.Table | TableDiff:
    """Current-state rows in the source's columns, order and types; or the TableDiff saying why they differ."""
    names = source.column_names
    missing_columns = [n for n in names if n not in current.column_names]
    if missing_columns:
        return TableDiff(table, source.num_rows, current.num_rows, schema_problem=f"columns missing: {missing_columns}")
    current = current.select(names)
    if current.schema != source.schema:
        mismatched = [
            f"{f.name}: source {f.type}, lakehouse {current.schema.field(f.name).type}"
            for f in source.schema
            if current.schema.field(f.name).type != f.type
        ]
        if mismatched:
            return TableDiff(
                table, source.num_rows, current.num_rows, schema_problem="types differ: " + "; ".join(mismatched)
            )
        current = current.cast(source.schema)
    return current


def tables_to_verify(lakehouse: Lakehouse, requested: list[str] | None) -> list[TableRef]:
    if requested:
        return [TableRef.parse(t) for t in requested]
    return [TableRef.parse(name) for name in known_tables(lakehouse.store)]


def verify(conn: pymysql.Connection, lakehouse: Lakehouse, requested: list[str] | None = None) -> list[TableDiff]:
    return [verify_table(conn, lakehouse, t) for t in tables_to_verify(lakehouse, requested)]


def verify_consistent(
    binlog: BinlogResource, lakehouse: Lakehouse, requested: list[str] | None = None
) -> list[ConsistentComparison]:
    """Like `verify`, but at one consistent source snapshot with keys changed in flight left out on both sides,
    so a busy source gives no false differences (each result has `ok` and `describe()` as a TableDiff does)."""
    from cdc_assets.consistency import compare_many  # consistency builds on this module

    return compare_many(binlog, lakehouse, tables_to_verify(lakehouse, requested))
