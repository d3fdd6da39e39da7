"""A TableMapEvent with FULL row metadata: the table's columns as `ColumnSpec`s, its key, and how each
column's values are laid out in row images.

The reading of the optional metadata (signedness, charsets, names, ENUM/SET members, primary key) follows
python-mysql-replication 1.0.17, so a column gets the same `ColumnSpec` either way (checked by
`test_binlog_decoder`), and raw batches written before and after this reader agree, but where it is wrong:
- MySQL 9's VECTOR is beyond it (it stops at the map of such a table): here a VECTOR holds its place among the
  character columns, as the server writes them (`test_mysql_only_types`).
- It decodes ENUM/SET members as UTF-8 (a latin1 'é' became '', and rows holding it landed wrong); the server writes
  them in their column's charset, and they are decoded in it here (`test_odd_tables`).
- It names MariaDB's UCA-14.0.0 collations utf8 whatever their charset (a ucs2 one too); here they are their
  charset's (core/mysql_charsets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pymysqlreplication.constants.CHARSET import charset_by_id
from pymysqlreplication.row_event import find_charset

from cdc_assets.core.errors import CdcUserError, TableUserError
from cdc_assets.core.mysql_charsets import mariadb_uca1400_charset, python_codec
from cdc_assets.core.mysql_types import PRINTED_BINARY_TYPES, TEXT_TYPES, ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape

# Binlog column type codes (MySQL's enum_field_types).
DECIMAL, TINY, SHORT, LONG, FLOAT, DOUBLE, NULL, TIMESTAMP, LONGLONG, INT24 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT = 10, 11, 12, 13, 14, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
VECTOR = 242  # MySQL 9: float32s, stored as a blob with a 4-byte length
JSON, NEWDECIMAL, ENUM, SET = 245, 246, 247, 248
TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = 249, 250, 251, 252, 253, 254, 255

KIND: dict[int, str] = {
    TINY: "tinyint", SHORT: "smallint", INT24: "mediumint", LONG: "int", LONGLONG: "bigint",
    DECIMAL: "decimal", NEWDECIMAL: "decimal", FLOAT: "float", DOUBLE: "double", BIT: "bit",
    DATE: "date", NEWDATE: "date", DATETIME: "datetime", DATETIME2: "datetime",
    TIMESTAMP: "timestamp", TIMESTAMP2: "timestamp", TIME: "time", TIME2: "time", YEAR: "year",
    VARCHAR: "varchar", VAR_STRING: "varchar", STRING: "char", ENUM: "enum", SET: "set",
    TINY_BLOB: "text", MEDIUM_BLOB: "text", LONG_BLOB: "text", BLOB: "text", JSON: "json", GEOMETRY: "geometry",
    VECTOR: "vector",
}  # fmt: skip
_BINARY_KIND = {"varchar": "varbinary", "char": "binary", "text": "blob"}
_NUMERIC = frozenset({TINY, SHORT, INT24, LONG, LONGLONG, NEWDECIMAL, FLOAT, DOUBLE, YEAR})
_CHARACTER = frozenset({STRING, VAR_STRING, VARCHAR, BLOB})  # and GEOMETRY on MariaDB, VECTOR on MySQL
_ONE_BYTE_META = frozenset({FLOAT, DOUBLE, TIMESTAMP2, DATETIME2, TIME2, BLOB, GEOMETRY, JSON, VECTOR})

# Optional metadata field types (MySQL's Table_map_log_event::Optional_metadata_field_type).
SIGNEDNESS, DEFAULT_CHARSET, COLUMN_CHARSET, COLUMN_NAME = 1, 2, 3, 4
SET_STR_VALUE, ENUM_STR_VALUE, SIMPLE_PRIMARY_KEY = 5, 6, 8
ENUM_AND_SET_DEFAULT_CHARSET, ENUM_AND_SET_COLUMN_CHARSET = 10, 11


@dataclass(frozen=True, slots=True)
class ColumnLayout:
    """How one column's value is stored in a row image."""

    type: int  # binlog type code; ENUM and SET stand for themselves, not for STRING
    size: int = 0  # bytes of the length prefix (strings, blobs), or of the value (ENUM, SET, BIT)
    codec: str | None = None  # Python codec of a text column; None for binary and non-text columns


@dataclass(frozen=True)
class TableMap:
    table_id: int
    shape: TableShape  # the table's columns and key as the event states them
    layouts: tuple[ColumnLayout, ...]

    @property
    def table(self) -> TableRef:
        return self.shape.table

    @property
    def columns(self) -> tuple[ColumnSpec, ...]:
        return self.shape.columns


class _Reader:
    """A cursor over the bytes of an event body."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def take(self, n: int) -> bytes:
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def packed_int(self) -> int:
        """A length-encoded integer (1, 3, 4 or 9 bytes)."""
        first = self.byte()
        if first < 251:
            return first
        size = {252: 2, 253: 3, 254: 8}.get(first)
        if size is None:
            raise ValueError(f"bad length-encoded integer 0x{first:02x}")
        return int.from_bytes(self.take(size), "little")

    def packed_ints_until(self, end: int) -> list[int]:
        values = []
        while self.pos < end:
            values.append(self.packed_int())
        return values

    def packed_string(self) -> bytes:
        return self.take(self.packed_int())


def _column_metadata(reader: _Reader, types: list[int]) -> tuple[list[int], list[int]]:
    """Per column: its type (ENUM/SET resolved from STRING) and its metadata number (see ColumnLayout)."""
    resolved, meta = [], []
    for code in types:
        value = 0
        if code == VARCHAR:
            value = int.from_bytes(reader.take(2), "little")
        elif code in _ONE_BYTE_META:
            value = reader.byte()
        elif code in (VAR_STRING, STRING):
            real, low = reader.byte(), reader.byte()
            if real in (ENUM, SET):
                code, value = real, low
            else:  # max length in bytes; its top bits hide in the real-type byte
                value = ((((real << 8) | low) >> 4) & 0x300 ^ 0x300) + low
        elif code in (NEWDECIMAL, BIT):
            value = reader.byte() << 8 | reader.byte()  # NEWDECIMAL: precision, scale; BIT: bits, bytes
        resolved.append(code)
        meta.append(value)
    return resolved, meta


def _flags(data: bytes, count: int) -> list[bool]:
    """`count` flags packed most significant bit first."""
    return [bool(data[i // 8] & (0x80 >> (i % 8))) for i in range(count)]


@dataclass
class _Optional:
    unsigned: list[bool]
    charsets: list[int] | None = None
    enum_set_charsets: list[int] | None = None
    names: list[str] | None = None
    set_members: list[list[bytes]] | None = None  # as the server stores them: in the column's charset
    enum_members: list[list[bytes]] | None = None
    primary_key: list[int] | None = None


def _charsets(default: int | None, exceptions: dict[int, int], count: int) -> list[int]:
    return [exceptions.get(i, default) for i in range(count)]  # type: ignore[misc]


def _members(reader: _Reader, end: int) -> list[list[bytes]]:
    result = []
    while reader.pos < end:
        result.append([reader.packed_string() for _ in range(reader.packed_int())])
    return result


def _member_texts(column: str, charset_id: int | None, encoding: str | None, raw: list[bytes]) -> tuple[str, ...]:
    """An ENUM's or SET's members as the server returns them over a utf8mb4 connection (source/rows.py): the table
    map carries them in the column's charset, decoded here as the column's text values are; a binary one's as their
    bytes, which the server sends as they are. A member with no such text quarantines the table (capture/event_loop)
    rather than give its rows a member they do not hold."""
    if encoding is None:
        raise TableUserError(
            f"Column {column!r} is an ENUM/SET of collation number {charset_id}, whose charset cdc-lakehouse does not "
            "know: report it."
        )
    codec = "utf-8" if encoding == "binary" else python_codec(encoding)
    if codec is None:
        raise TableUserError(
            f"Column {column!r} is an ENUM/SET in the {encoding} charset, which cdc-lakehouse cannot decode: report it."
        )
    try:
        return tuple(member.decode(codec) for member in raw)
    except UnicodeDecodeError as exc:
        if encoding == "binary":
            raise TableUserError(
                f"Column {column!r} is an ENUM/SET in the binary charset with a member that is not UTF-8 "
                f"({exc.object!r}): the server sends its bytes as they are, and no text the lakehouse holds equals "
                "them; give the column a text charset."
            ) from None
        raise TableUserError(
            f"Column {column!r} is an ENUM/SET in the {encoding} charset with a member that is no {encoding} text "
            f"({exc.object!r}): report it."
        ) from None


def _is_character(code: int, mariadb: bool) -> bool:
    """Whether the server gives a column of this binlog type an entry in DEFAULT_CHARSET / COLUMN_CHARSET (its
    `is_character_type`): those entries are by position among such columns, so one counted wrongly gives every later
    column its neighbour's charset. MariaDB counts GEOMETRY (a blob underneath); MySQL 9 counts VECTOR (binary)."""
    return code in _CHARACTER or code == (GEOMETRY if mariadb else VECTOR)


def _optional_metadata(reader: _Reader, end: int, types: list[int], mariadb: bool) -> _Optional:
    numeric = [t in _NUMERIC for t in types]
    character = [_is_character(t, mariadb) for t in types]
    enum_or_set = [t in (ENUM, SET) for t in types]
    meta = _Optional(unsigned=[False] * len(types))
    while reader.pos < end:
        field_type = reader.byte()
        length = reader.packed_int()
        field_end = reader.pos + length
        if field_type == SIGNEDNESS:
            flags = iter(_flags(reader.take(length), sum(numeric)))
            meta.unsigned = [next(flags) if is_numeric else False for is_numeric in numeric]
        elif field_type in (DEFAULT_CHARSET, ENUM_AND_SET_DEFAULT_CHARSET):
            default = reader.packed_int()
            pairs = reader.packed_ints_until(field_end)
            wanted = character if field_type == DEFAULT_CHARSET else enum_or_set
            ids = _charsets(default, dict(zip(pairs[::2], pairs[1::2], strict=True)), sum(wanted))
            if field_type == DEFAULT_CHARSET:
                meta.charsets = ids
            else:
                meta.enum_set_charsets = ids
        elif field_type == COLUMN_CHARSET:
            meta.charsets = reader.packed_ints_until(field_end)
        elif field_type == ENUM_AND_SET_COLUMN_CHARSET:
            meta.enum_set_charsets = reader.packed_ints_until(field_end)
        elif field_type == COLUMN_NAME:
            meta.names = []
            while reader.pos < field_end:
                meta.names.append(reader.packed_string().decode())
        elif field_type == SET_STR_VALUE:
            meta.set_members = _members(reader, field_end)
        elif field_type == ENUM_STR_VALUE:
            meta.enum_members = _members(reader, field_end)
        elif field_type == SIMPLE_PRIMARY_KEY:
            meta.primary_key = reader.packed_ints_until(field_end)
        reader.pos = field_end  # skips what is not needed (geometry types, prefixed keys, visibility)
    return meta


def table_map_table(body: bytes, post_header_length: int = 8) -> tuple[int, TableRef]:
    """The binlog table id and the table a TableMapEvent maps, read without its columns: the map of a table capture
    leaves out is read no further, so nothing in it (a column type or metadata the reader does not know) can stop
    capture."""
    return int.from_bytes(body[:6], "little"), _table_name(_Reader(body, post_header_length))


def _table_name(reader: _Reader) -> TableRef:
    schema = reader.take(reader.byte()).decode()
    reader.pos += 1
    name = reader.take(reader.byte()).decode()
    reader.pos += 1
    return TableRef(schema, name)


def parse_table_map(body: bytes, mariadb: bool, post_header_length: int = 8) -> TableMap:
    """The table, its columns and key from a TableMapEvent's body."""
    table_id = int.from_bytes(body[:6], "little")
    reader = _Reader(body, post_header_length)
    table = _table_name(reader)
    count = reader.packed_int()
    raw_types = list(reader.take(count))
    meta_end = reader.packed_int()
    meta_end += reader.pos
    types, meta = _column_metadata(reader, raw_types)
    reader.pos = meta_end + (count + 7) // 8  # then nullability, which row images carry anyway
    optional = _optional_metadata(reader, len(body), types, mariadb)
    if optional.names is None or len(optional.names) != count:
        raise CdcUserError(
            f"The binlog does not name the columns of {table} (binlog_row_metadata was not FULL when the event "
            "was written): set binlog_row_metadata=FULL on the source; events written before cannot be read."
        )
    columns, layouts = _columns(types, meta, optional, "mariadb" if mariadb else "mysql")
    key = tuple(optional.names[i] for i in optional.primary_key or ())
    return TableMap(table_id, TableShape(table, tuple(columns), key), tuple(layouts))


def with_known_types(table_map: TableMap, known: TableShape | None) -> TableMap:
    """The map with MariaDB's UUID, INET6 and INET4 columns typed as such: the binlog gives them as BINARY(16) and
    BINARY(4), and only the table's definition (its CREATE or ALTER, or a snapshot) tells them apart."""
    if known is None:
        return table_map
    types = {c.name: c.type for c in known.columns if c.type in PRINTED_BINARY_TYPES}
    if not types:
        return table_map
    columns = tuple(
        replace(c, type=types[c.name], length=None)
        if types.get(c.name) and c.type == "binary" and c.length == PRINTED_BINARY_TYPES[types[c.name]]
        else c
        for c in table_map.columns
    )
    if columns == table_map.columns:
        return table_map
    return TableMap(table_map.table_id, replace(table_map.shape, columns=columns), table_map.layouts)


def _encoding(charset_id: int | None, dbms: str) -> str | None:
    """python-mysql-replication's name for the charset of a column's collation number (`utf8` when the binlog has
    none), the charset of a MariaDB UCA-14.0.0 collation (which it does not know), or None: a number no one here
    knows."""
    if charset_id is None:
        return "utf8"
    if charset_by_id(str(charset_id), dbms) is not None:
        return find_charset(str(charset_id), dbms=dbms)[0]
    return mariadb_uca1400_charset(charset_id) if dbms == "mariadb" else None


def _columns(
    types: list[int], meta: list[int], optional: _Optional, dbms: str
) -> tuple[list[ColumnSpec], list[ColumnLayout]]:
    assert optional.names is not None
    charsets = iter(optional.charsets or [])
    enum_set_charsets = iter(optional.enum_set_charsets or [])
    enum_members = iter(optional.enum_members or [])
    set_members = iter(optional.set_members or [])
    columns, layouts = [], []
    for index, code in enumerate(types):
        name, value = optional.names[index], meta[index]
        encoding = None
        members: tuple[str, ...] = ()
        if _is_character(code, dbms == "mariadb"):  # a VECTOR takes its entry (binary) and stays a vector
            encoding = _encoding(next(charsets, None), dbms) or "utf8"  # unknown: utf8, as python-mysql-replication
        elif code in (ENUM, SET):
            charset_id = next(enum_set_charsets, None)
            encoding = _encoding(charset_id, dbms)
            raw = next(enum_members if code == ENUM else set_members, [])
            members = _member_texts(name, charset_id, encoding, raw)
            if code == ENUM:
                members = ("", *members)  # index 0: the error value, '' (a value no member was stored as)
        kind = KIND.get(code)
        if kind is None:
            raise CdcUserError(f"Column {name!r} has binlog type {code}, which the pipeline cannot map: report it.")
        if kind in _BINARY_KIND and encoding == "binary":
            kind = _BINARY_KIND[kind]
        columns.append(
            ColumnSpec(
                name=name,
                type=kind,
                unsigned=optional.unsigned[index],
                precision=value >> 8 if code == NEWDECIMAL else None,
                scale=value & 0xFF if code == NEWDECIMAL else None,
                fsp=value if code in (TIMESTAMP2, DATETIME2, TIME2) else 0,
                charset=encoding if kind in TEXT_TYPES else None,
                members=members,
                length=value if kind == "binary" else None,
            )
        )
        layouts.append(_layout(code, value, kind, encoding))
    return columns, layouts


def _layout(code: int, value: int, kind: str, encoding: str | None) -> ColumnLayout:
    if code in (VARCHAR, VAR_STRING, STRING):
        size = 2 if value > 255 else 1
    elif code in (BLOB, GEOMETRY, JSON, ENUM, SET, VECTOR):
        size = value
    elif code == BIT:
        size = ((value & 0xFF) * 8 + (value >> 8) + 7) // 8
    else:
        size = 0
    codec = python_codec(encoding) if kind in TEXT_TYPES and kind != "json" else None
    return ColumnLayout(code, size, codec)
