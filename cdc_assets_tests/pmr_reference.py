"""The reference for the binlog decoder: python-mysql-replication's BinLogStreamReader and the canonical texts
of its values, as capture produced them before `cdc_assets.capture.binlog` (see test_binlog_decoder)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.json_binary import parse_json
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent

from cdc_assets.core.mysql_charsets import MYSQL_LATIN1
from cdc_assets.core.mysql_types import TEXT_TYPES, ColumnSpec, bit_to_long, encode_python_value
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl

_original_charset_to_encoding = RowsEvent.charset_to_encoding


def _charset_to_encoding(name: str) -> str:
    # Columns arrive named by their Python encoding already: MySQL's latin1 as "cp1252".
    return MYSQL_LATIN1 if name in ("latin1", "cp1252") else _original_charset_to_encoding(name)


RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)  # type: ignore[method-assign]


_EPOCH = dt.datetime(1970, 1, 1)
_YEAR_ZERO_FROM_BINLOG = 1900  # python-mysql-replication adds 1900 to the stored byte; YEAR 0000 is byte 0


def _negative_time_fraction_fixed(value: dt.timedelta) -> dt.timedelta:
    """python-mysql-replication 1.0.17 decodes a negative TIME2 with fraction f as fraction 1 - f
    (`-12:30:00.01` arrives as `-12:30:00.99`): put the fraction back."""
    micros = value // dt.timedelta(microseconds=1)
    if micros >= 0:
        return value
    whole, fraction = divmod(-micros, 1_000_000)
    if fraction == 0:
        return value
    return -dt.timedelta(microseconds=whole * 1_000_000 + (1_000_000 - fraction))


def _plain_json(value: Any) -> Any:
    """python-mysql-replication's decoding of a JSON document as plain JSON values (its keys and strings are bytes)."""
    if isinstance(value, dict):
        return {_plain_json(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_json(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    return value


def pmr_json_value(document: bytes) -> Any:
    """A MySQL binary JSON document as python-mysql-replication's `parse_json` decodes it, in plain JSON values;
    raises where that decoder does (a TIME of 24 hours or more: ValueError)."""
    return _plain_json(parse_json(document[0], document[1:]))


def _pmr_json_text(value: Any) -> str:
    """A JSON column's value as python-mysql-replication hands it over, as text: MariaDB's is text already; a
    MySQL document is the decoded values written out (its opaque values its own way, not the server's)."""
    if isinstance(value, str | bytes):
        return value.decode() if isinstance(value, bytes) else value

    def default(item: Any) -> Any:
        if isinstance(item, Decimal):
            return float(item)
        if isinstance(item, dt.date | dt.datetime | dt.time):
            return item.isoformat()
        raise TypeError(f"not JSON serialisable: {type(item)}")

    return json.dumps(_plain_json(value), default=default, ensure_ascii=False)


def encode_binlog_value(col: ColumnSpec, value: Any, none_source: str | None = None) -> str | None:
    """Canonical text of a value as python-mysql-replication decodes it from a row image."""
    if value is None:
        if col.type == "set" and none_source == "empty set":
            return ""
        return None
    if col.type == "time":
        value = _negative_time_fraction_fixed(value)
    elif col.type == "year" and value == _YEAR_ZERO_FROM_BINLOG:
        value = 0
    elif col.type == "timestamp" and value == _EPOCH:
        return None  # the zero TIMESTAMP (MySQL's smallest real one is 1970-01-01 00:00:01 UTC)
    elif col.type == "binary" and col.length:
        value = value.encode("latin-1") if isinstance(value, str) else value
        value = value.ljust(col.length, b"\0")  # the row image stores BINARY(n) without its trailing zeros
    if col.type == "json":
        return _pmr_json_text(value)
    if col.type == "bit":
        return str(bit_to_long(int(value, 2) if isinstance(value, str) else int(value)))
    if col.type == "set":
        members = value if isinstance(value, set | frozenset) else set(str(value).split(","))
        return ",".join(m for m in col.members if m in members) if col.members else ",".join(sorted(members))
    return encode_python_value(col, value)


# python-mysql-replication's FIELD_TYPE codes (pymysqlreplication.constants.FIELD_TYPE).
_BINLOG_TYPES: dict[int, str] = {
    1: "tinyint", 2: "smallint", 9: "mediumint", 3: "int", 8: "bigint",
    0: "decimal", 246: "decimal", 4: "float", 5: "double", 16: "bit",
    10: "date", 14: "date", 12: "datetime", 18: "datetime", 7: "timestamp", 17: "timestamp",
    11: "time", 19: "time", 13: "year", 15: "varchar", 253: "varchar", 254: "char",
    247: "enum", 248: "set", 249: "text", 250: "text", 251: "text", 252: "text",
    245: "json", 255: "geometry",
}  # fmt: skip
_BINARY_OF = {"varchar": "varbinary", "char": "binary", "text": "blob"}


def column_from_binlog(column: Any) -> ColumnSpec:
    """ColumnSpec of a python-mysql-replication `Column` from a TableMapEvent with FULL metadata."""
    kind = _BINLOG_TYPES.get(column.type)
    if kind is None:
        raise ValueError(f"unsupported binlog column type {column.type} for {column.name!r}")
    charset = getattr(column, "character_set_name", None)
    if kind in _BINARY_OF and charset == "binary":
        kind = _BINARY_OF[kind]
    members = tuple(getattr(column, "enum_values", None) or getattr(column, "set_values", None) or ())
    return ColumnSpec(
        name=column.name,
        type=kind,
        unsigned=bool(getattr(column, "unsigned", False)),
        precision=getattr(column, "precision", None) if kind == "decimal" else None,
        scale=getattr(column, "decimals", None) if kind == "decimal" else None,
        fsp=int(getattr(column, "fsp", 0) or 0) if kind in ("time", "datetime", "timestamp") else 0,
        charset=charset if kind in TEXT_TYPES else None,
        members=members if kind in ("enum", "set") else (),
        length=getattr(column, "max_length", None) if kind == "binary" else None,
    )


Change = tuple[str, list[str | None] | None, list[str | None] | None]


def reference_events(
    url: MySQLUrl, server_id: int, start: BinlogPosition, end: BinlogPosition, only_tables: list[str] | None = None
) -> list[tuple]:
    """Table maps as (`map`, schema, table, columns, key) and row changes as (op, before, after), from `start`
    to `end` in one binlog file, through python-mysql-replication; of the tables named `only_tables` alone when
    given (it reads no further than the name of another table's map: one it cannot read, with a VECTOR, is passed
    by)."""
    stream = BinLogStreamReader(
        connection_settings=url.connection_settings(),
        server_id=server_id,
        resume_stream=True,
        log_file=start.log_file,
        log_pos=start.log_pos,
        blocking=False,
        only_events=[TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        only_tables=only_tables,
    )
    found: list[tuple] = []
    columns: dict[int, tuple[ColumnSpec, ...]] = {}
    try:
        for event in stream:
            if stream.log_file != end.log_file or event.packet.log_pos > end.log_pos:
                break
            if isinstance(event, TableMapEvent):
                specs = tuple(column_from_binlog(c) for c in event.columns)
                columns[event.table_id] = specs
                pk = event.table_obj.primary_key
                key = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
                found.append(("map", event.schema, event.table, specs, key))
                continue
            specs = columns[event.table_id]

            def image(values: dict[str, Any], none_sources: dict[str, str], specs=specs) -> list[str | None]:
                return [encode_binlog_value(c, values.get(c.name), none_sources.get(c.name)) for c in specs]

            for row in event.rows:
                if isinstance(event, WriteRowsEvent):
                    found.append(("insert", None, image(row["values"], row["none_sources"])))
                elif isinstance(event, DeleteRowsEvent):
                    found.append(("delete", image(row["values"], row["none_sources"]), None))
                else:
                    before = image(row["before_values"], row["before_none_sources"])
                    found.append(("update", before, image(row["after_values"], row["after_none_sources"])))
    finally:
        stream.close()
    return found
