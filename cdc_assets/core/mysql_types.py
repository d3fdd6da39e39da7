"""MySQL column types, their Delta (Arrow) types, and one canonical text form of every value.

Raw batches carry each row image as a list of canonical texts, one per column; the column's
`ColumnSpec` (in the batch manifest) says how to turn the texts into the Delta type (docs/lakehouse.md: Types (MySQL → Delta)).
Values reach the canonical form by two independent routes, from the binlog
(`encode_binlog_value`) and from a SQL result (`encode_sql_value`), so `verify` compares the
lakehouse with the source without trusting the capture path.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INTEGER_TYPES = ("tinyint", "smallint", "mediumint", "int", "bigint")
# The signed mapping of docs/lakehouse.md's type table; unsigned takes the next wider signed type.
_SIGNED_INT: dict[str, pa.DataType] = {
    "tinyint": pa.int8(),
    "smallint": pa.int16(),
    "mediumint": pa.int32(),
    "int": pa.int32(),
    "bigint": pa.int64(),
}
_UNSIGNED_INT: dict[str, pa.DataType] = {
    "tinyint": pa.int16(),
    "smallint": pa.int32(),
    "mediumint": pa.int64(),
    "int": pa.int64(),
    "bigint": pa.decimal128(20, 0),
}
TEXT_TYPES = ("char", "varchar", "text", "enum", "set", "json")
BINARY_TYPES = ("binary", "varbinary", "blob", "geometry")
# MariaDB's data type plugins: stored as fixed binary (so the binlog says BINARY(n)), kept as the text SELECT prints
PRINTED_BINARY_TYPES = {"uuid": 16, "inet6": 16, "inet4": 4}
# MySQL 9's VECTOR: float32s. Its canonical text is the base64 of their little-endian bytes, as the server stores them
# and sends them (as binary, over the text protocol too), so a value is exact on every route.
VECTOR_TYPE = pa.list_(pa.float32())
VECTOR_ELEMENT_BYTES = 4
MAX_DELTA_DECIMAL_PRECISION = 38
BIT64_WRAP = 1 << 64
GEOMETRY_SRID_BYTES = 4


@dataclass(frozen=True)
class ColumnSpec:
    """A source column as the pipeline needs it: enough to map and decode its values."""

    name: str
    type: str  # one of INTEGER_TYPES, decimal, float, double, bit, date, datetime, timestamp, time,
    # year, TEXT_TYPES, BINARY_TYPES or vector
    unsigned: bool = False
    precision: int | None = None  # decimal
    scale: int | None = None  # decimal
    fsp: int = 0  # fractional seconds digits of time, datetime, timestamp
    charset: str | None = None
    members: tuple[str, ...] = field(default_factory=tuple)  # enum and set members, in order
    # the declared length, where the DDL or the binlog gives it: BINARY(n) (the binlog drops trailing 0x00 bytes,
    # which the value has) and VARBINARY(n) in bytes, CHAR(n) and VARCHAR(n) in characters, BIT(n) in bits (what a
    # MODIFY to the type cuts a value to)
    length: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: it deep-copies every value
        d["members"] = list(self.members)
        # zero is kept for precision and scale: DECIMAL(5,0) has a scale, and 0 is not "unknown"
        keep = ("name", "type", "precision", "scale")
        return {k: v for k, v in d.items() if (v is not None and k in keep) or v not in (None, False, [], 0)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> ColumnSpec:
        return ColumnSpec(**{**d, "members": tuple(d.get("members", ()))})


def arrow_type(col: ColumnSpec) -> pa.DataType:
    """The Delta type of a MySQL column (docs/lakehouse.md: Types (MySQL → Delta))."""
    t = col.type
    if t in _SIGNED_INT:
        return _UNSIGNED_INT[t] if col.unsigned else _SIGNED_INT[t]
    if t == "decimal":
        assert col.precision is not None and col.scale is not None, col
        if col.precision > MAX_DELTA_DECIMAL_PRECISION:
            return pa.string()
        return pa.decimal128(col.precision, col.scale)
    if t == "float":
        return pa.float32()
    if t == "double":
        return pa.float64()
    if t == "bit":
        return pa.int64()
    if t == "date":
        return pa.date32()
    if t == "datetime":
        return pa.timestamp("us")
    if t == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if t == "year":
        return pa.int16()
    if t == "time" or t in TEXT_TYPES or t in PRINTED_BINARY_TYPES:
        return pa.string()
    if t in BINARY_TYPES:
        return pa.binary()
    if t == "vector":
        return VECTOR_TYPE
    raise ValueError(f"unsupported MySQL type {t!r} for column {col.name!r}")


def printed_binary(kind: str, value: bytes) -> str:
    """A MariaDB UUID, INET6 or INET4 value (its stored bytes) as the server prints it."""
    if kind == "uuid":
        text = value.hex()
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    if kind == "inet4":
        return ".".join(str(b) for b in value)
    return _inet6_text(value)


def _inet6_text(value: bytes) -> str:
    """INET6 as MariaDB prints it (RFC 5952; an IPv4-mapped or IPv4-compatible address ends in dotted quad)."""
    words = [int.from_bytes(value[i : i + 2], "big") for i in range(0, 16, 2)]
    tail: list[str] = []
    if words[:5] == [0] * 5 and words[5] in (0, 0xFFFF) and (words[5] or words[6]):
        tail, words = [".".join(str(b) for b in value[12:])], words[:6]
    best, run = (0, -1), (0, -1)  # the longest run of two or more zero words (start, end)
    for i, word in enumerate(words):
        if word:
            continue
        run = (run[0], i) if run[1] == i - 1 and run[1] >= 0 else (i, i)
        if run[1] - run[0] > best[1] - best[0]:
            best = run
    parts = [f"{w:x}" for w in words]
    if best[1] - best[0] >= 1:
        left, right = parts[: best[0]], parts[best[1] + 1 :]
        return ":".join(left) + "::" + ":".join(right + tail)
    return ":".join(parts + tail)


def vector_array(values: list[bytes | None]) -> pa.Array:
    """VECTOR values (each its float32s in little-endian bytes, as stored) as lists of float32, exactly."""
    lengths = np.fromiter((0 if v is None else len(v) // VECTOR_ELEMENT_BYTES for v in values), np.int32, len(values))
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    floats = np.frombuffer(b"".join(v for v in values if v), "<f4")
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(floats, pa.float32()), type=VECTOR_TYPE, mask=mask)


# -- canonical text ------------------------------------------------------------------------------------


def format_time(value: dt.timedelta, fsp: int) -> str:
    """TIME as MySQL prints it: `-12:30:00`, `838:59:59.500000` (fsp digits)."""
    micros = value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    seconds, frac = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}"
    if fsp > 0:
        text += "." + f"{frac:06d}"[:fsp]
    return text


def _format_datetime(value: dt.datetime) -> str:
    return value.isoformat(sep=" ", timespec="microseconds")


def bit_to_long(value: int) -> int:
    """BIT(64) does not fit a signed long: values from 2**63 wrap to two's complement."""
    return value - BIT64_WRAP if value >= BIT64_WRAP // 2 else value


def encode_python_value(col: ColumnSpec, value: Any) -> str:
    """Canonical text of a non-NULL value already in its natural Python type."""
    t = col.type
    if t in INTEGER_TYPES or t == "year":
        return str(int(value))
    if t == "decimal":
        return format(Decimal(value), "f")
    if t in ("float", "double"):
        return repr(float(value))
    if t in ("datetime", "timestamp"):
        return _format_datetime(value)
    if t == "date":
        return value.isoformat()
    if t == "time":
        return format_time(value, col.fsp)
    if t in BINARY_TYPES or t == "vector":
        if isinstance(value, str):  # the binlog decoder returns '' for an empty BLOB
            value = value.encode("latin-1")
        if t == "geometry":  # MySQL stores a 4-byte SRID before the WKB; the lakehouse keeps plain WKB
            value = value[GEOMETRY_SRID_BYTES:]
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, bytes):  # text in a charset the decoder did not know (a JSON document is UTF-8)
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def encode_sql_value(col: ColumnSpec, value: Any) -> str | None:
    """Canonical text of a value as PyMySQL returns it from `SELECT` (session time_zone UTC)."""
    if value is None:
        return None
    if col.type == "bit":
        return str(bit_to_long(int.from_bytes(value, "big") if isinstance(value, bytes) else int(value)))
    if col.type == "set":
        return value if isinstance(value, str) else ",".join(sorted(value))
    if col.type == "time" and isinstance(value, str):
        return value
    if col.type in ("date", "datetime", "timestamp") and isinstance(value, str):
        return None  # PyMySQL returns zero and partly-zero dates ('0000-00-00') as text; the binlog has NULL
    return encode_python_value(col, value)


# -- canonical text to Arrow ------------------------------------------------------------------------------


def base64_decoded(texts: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """Each base64 text decoded, read from the Arrow buffer as it is: no Python str of a value (a LONGBLOB's
    text is a third larger than the value)."""
    decoded: list[bytes | None] = []
    for chunk in texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]:
        n = len(chunk)
        if not n:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)[chunk.offset : chunk.offset + n + 1].tolist()
        data = memoryview(chunk.buffers()[2] or b"")
        valid = chunk.is_valid().to_numpy(zero_copy_only=False).tolist() if chunk.null_count else [True] * n
        decode = base64.b64decode
        decoded.extend(decode(data[offsets[i] : offsets[i + 1]]) if valid[i] else None for i in range(n))
    return decoded


def binary_array(values: list[bytes | None]) -> pa.Array:
    """A binary array of `values`; a single value is not copied (it may be hundreds of megabytes)."""
    if len(values) == 1 and values[0] is not None:
        offsets = np.array([0, len(values[0])], np.int32)
        return pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(values[0])])
    return pa.array(values, type=pa.binary())


def decode_column(col: ColumnSpec, texts: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Arrow array of the column's Delta type from canonical texts (vectorised where Arrow can)."""
    target = arrow_type(col)
    if pa.types.is_binary(target) or col.type == "vector":
        values = base64_decoded(texts)
        return vector_array(values) if col.type == "vector" else binary_array(values)
    if pa.types.is_string(target):
        return texts.cast(pa.string())
    if pa.types.is_timestamp(target) and target.tz is not None:
        return pc.cast(pc.cast(texts, pa.timestamp("us")), target)
    return pc.cast(texts, target)


def encode_column(col: ColumnSpec, values: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """Canonical texts of a column's typed values (its Delta type): what `decode_column` turns back into the same
    values. For rows that come from elsewhere than the binlog (a repair's, read from the source) and must travel
    as raw-batch images."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if col.type == "vector":
        return [None if v is None else base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
                for v in values.to_pylist()]  # fmt: skip
    target = values.type
    if pa.types.is_binary(target):
        return [None if v is None else base64.b64encode(v).decode("ascii") for v in values.to_pylist()]
    if pa.types.is_floating(target):  # repr is exact both ways; Arrow's text of a float is not always
        return [None if v is None else repr(v) for v in values.to_pylist()]
    if pa.types.is_timestamp(target) and target.tz is not None:  # decode_column reads naive UTC text
        values = pc.cast(values, pa.timestamp("us"))
    return pc.cast(values, pa.string()).to_pylist()


def decode_image(columns: list[ColumnSpec], images: pa.Array | pa.ChunkedArray) -> pa.StructArray:
    """Typed struct array from a list<string> array of row images (one list element per column)."""
    if isinstance(images, pa.ChunkedArray):  # one chunk as it is: combining copies even that one
        images = images.chunk(0) if images.num_chunks == 1 else images.combine_chunks() if images.num_chunks else pa.array([], images.type)
    width = pc.list_value_length(images)
    expected = len(columns)
    bad = pc.and_(pc.is_valid(images), pc.not_equal(width, expected))
    if pc.any(bad).as_py():
        raise ValueError(f"row image width differs from the table's {expected} columns")
    arrays = []
    for i, col in enumerate(columns):
        texts = pc.list_element(images, i) if len(images) else pa.array([], pa.string())
        arrays.append(decode_column(col, texts))
    return pa.StructArray.from_arrays(
        arrays, fields=[pa.field(c.name, arrow_type(c)) for c in columns], mask=pc.is_null(images)
    )


def arrow_schema(columns: list[ColumnSpec]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c)) for c in columns])


# -- where column specs come from ------------------------------------------------------------------------

_SCHEMA_TYPES = {
    "tinytext": "text", "mediumtext": "text", "longtext": "text",
    "tinyblob": "blob", "mediumblob": "blob", "longblob": "blob",
    "point": "geometry", "linestring": "geometry", "polygon": "geometry", "multipoint": "geometry",
    "multilinestring": "geometry", "multipolygon": "geometry", "geometrycollection": "geometry",
    "geomcollection": "geometry",  # MySQL 8's information_schema name for GEOMETRYCOLLECTION
    "numeric": "decimal", "real": "double", "integer": "int", "bool": "tinyint", "boolean": "tinyint",
}  # fmt: skip


def _members(column_type: str) -> tuple[str, ...]:
    inside = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    members, current, quoted, i = [], "", False, 0
    while i < len(inside):
        ch = inside[i]
        if ch == "'":
            if quoted and i + 1 < len(inside) and inside[i + 1] == "'":
                current += "'"
                i += 1
            else:
                quoted = not quoted
        elif ch == "," and not quoted:
            members.append(current)
            current = ""
        else:
            current += ch
        i += 1
    members.append(current)
    return tuple(members)


def column_from_information_schema(row: dict[str, Any]) -> ColumnSpec:
    """ColumnSpec of an `information_schema.COLUMNS` row (used by verify: today's source schema)."""
    data_type = str(row["DATA_TYPE"]).lower()
    column_type = str(row["COLUMN_TYPE"]).lower()
    kind = _SCHEMA_TYPES.get(data_type, data_type)
    return ColumnSpec(
        name=row["COLUMN_NAME"],
        type=kind,
        unsigned="unsigned" in column_type,
        precision=int(row["NUMERIC_PRECISION"]) if kind == "decimal" else None,
        scale=int(row["NUMERIC_SCALE"]) if kind == "decimal" else None,
        fsp=int(row["DATETIME_PRECISION"] or 0) if kind in ("time", "datetime", "timestamp") else 0,
        charset=row.get("CHARACTER_SET_NAME") if kind in TEXT_TYPES else None,
        members=_members(str(row["COLUMN_TYPE"])) if kind in ("enum", "set") else (),
        length=int(row["CHARACTER_OCTET_LENGTH"]) if kind == "binary" and row.get("CHARACTER_OCTET_LENGTH")
        else int(row["NUMERIC_PRECISION"]) if kind == "bit" and row.get("NUMERIC_PRECISION") else None,  # BIT(n)
    )
