"""MySQL's binary JSON decoded to the text the server prints for it, and partial JSON updates applied.

MySQL stores a JSON column (and logs it in row images) in its binary format (`sql-common/json_binary.h`);
`SELECT j` prints it through `Json_wrapper::to_string` (`sql-common/json_dom.cc`). `json_text` produces that
text from the bytes, byte for byte:

- separators `", "` and `": "`, object members in stored order (MySQL keeps keys sorted by length, then bytes);
- strings escaped as `double_quote` does: `\\"`, `\\\\`, `\\b \\f \\n \\r \\t`, other bytes below 0x20 as `\\u00xx`;
- integers in full, doubles as `my_gcvt(MY_GCVT_ARG_DOUBLE, 34)` formats them (shortest digits; `1e308`,
  `1e-16`, `0.0001`) with `.0` added where that shows neither a point nor an exponent;
- MySQL's opaque values: DECIMAL exactly as stored (`1.50`), DATE `"2024-01-02"`, TIME `"-838:59:59.000000"`,
  DATETIME and TIMESTAMP `"2024-01-02 03:04:05.500000"` (always six fraction digits), a VAR_STRING as a plain
  string, every other type (binary strings, BIT, BLOB) `"base64:typeNN:..."` in MySQL's base64, which breaks
  its lines every 76 characters (printed as `\\n`).

A PARTIAL_UPDATE_ROWS event (binlog_row_value_options=PARTIAL_JSON) logs a changed JSON column as a list of
diffs (operation, path, value) against the before-image's document; `apply_diffs` applies them as the server's
`apply_json_diff` does and `json_text` of the result is the document the server now holds.

Plain functions over bytes; no other decoder is used (python-mysql-replication's stays a test oracle).
"""

from __future__ import annotations

import base64
import json
import re
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple, Union

from cdc_assets.capture.binlog.packed import decimal_reader, decimal_size, time_text
from cdc_assets.core.mysql_conversions import JSON_ESCAPES, JSON_NEEDS_ESCAPE, json_double_text
from cdc_assets.core.mysql_conversions import json_quoted as quoted

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0x00, 0x01, 0x02, 0x03
LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING, OPAQUE = (
    0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0F,
)  # fmt: skip
_LITERALS = {0: "null", 1: "true", 2: "false"}
_INLINED_SMALL = frozenset({LITERAL, INT16, UINT16})
_INLINED_LARGE = frozenset({LITERAL, INT16, UINT16, INT32, UINT32})

# Opaque values' field types (MySQL's enum_field_types) that print as something other than base64.
_TIMESTAMP, _DATE, _TIME, _DATETIME, _NEWDECIMAL, _VAR_STRING = 7, 10, 11, 12, 246, 253

# Diff operations of a PARTIAL_UPDATE_ROWS event (enum_json_diff_operation).
REPLACE, INSERT, REMOVE = 0, 1, 2
_OPERATIONS = {REPLACE: "REPLACE", INSERT: "INSERT", REMOVE: "REMOVE"}

_u16 = struct.Struct("<H").unpack_from
_i16 = struct.Struct("<h").unpack_from
_u32 = struct.Struct("<I").unpack_from
_i32 = struct.Struct("<i").unpack_from
_u64 = struct.Struct("<Q").unpack_from
_i64 = struct.Struct("<q").unpack_from
_f64 = struct.Struct("<d").unpack_from


# Object keys repeat from document to document (a table's documents share their shape): their printed form is
# kept, up to a bound.
_quoted_keys: dict[bytes, str] = {}
_MAX_QUOTED_KEYS = 10_000


class InvalidJson(ValueError):
    """Bytes that are not MySQL binary JSON, or a partial update that does not apply to its document."""


def double_text(value: float) -> str:
    """A JSON double as MySQL prints it (core/mysql_conversions.json_double_text); where Python's `repr` writes the
    same 'f' form (from 1e-4 up to 1e15, and zero) it is taken as it is, which is most doubles and several times
    faster."""
    if 1e-4 <= abs(value) < 1e15 or value == 0:
        return repr(value)
    return json_double_text(value)


def _variable_length(buf: bytes, pos: int) -> tuple[int, int]:
    """(length, position after it) of a length of up to five bytes, seven bits each, low bits first."""
    length = shift = 0
    for i in range(5):
        byte = buf[pos + i]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length, pos + i + 1
        shift += 7
    raise InvalidJson("a binary JSON length runs past five bytes")


@lru_cache(maxsize=256)
def _decimal(precision: int, scale: int) -> Callable[[bytes, int], tuple[str, int]]:
    return decimal_reader(precision, scale)


def _packed_datetime_text(packed: int, field_type: int) -> str:
    """A DATE, DATETIME or TIMESTAMP of binary JSON (TIME_to_longlong_datetime_packed) as my_TIME_to_str(6)."""
    packed = -packed if packed < 0 else packed  # the sign of a date is not printed
    fraction, ymdhms = packed % (1 << 24), packed >> 24
    ymd, hms = ymdhms >> 17, ymdhms % (1 << 17)
    year, month, day = (ymd >> 5) // 13, (ymd >> 5) % 13, ymd % (1 << 5)
    date = f"{year:04d}-{month:02d}-{day:02d}"
    if field_type == _DATE:
        return date
    return f"{date} {hms >> 12:02d}:{hms >> 6 & 0x3F:02d}:{hms & 0x3F:02d}.{fraction:06d}"


def _mysql_base64(data: bytes) -> str:
    """MySQL's base64_encode: a newline after every 76 characters, none at the end."""
    text = base64.b64encode(data).decode("ascii")
    if len(text) <= 76:
        return text
    return "\n".join(text[i : i + 76] for i in range(0, len(text), 76))


def opaque_text(field_type: int, data: bytes) -> str:
    """An opaque value (a MySQL value of another SQL type kept inside JSON) as the server prints it."""
    if field_type == _NEWDECIMAL:  # precision, scale, then the binary DECIMAL
        if len(data) < 2 or not data[1] <= data[0] or decimal_size(data[0], data[1]) != len(data) - 2:
            raise InvalidJson(f"a binary JSON DECIMAL of {len(data)} bytes does not match its precision and scale")
        return _decimal(data[0], data[1])(data, 2)[0]
    if field_type in (_DATE, _DATETIME, _TIMESTAMP, _TIME):
        if len(data) < 8:
            raise InvalidJson(f"a binary JSON date or time of type {field_type} has {len(data)} bytes, not 8")
        packed = _i64(data)[0]
        if field_type != _TIME:
            return f'"{_packed_datetime_text(packed, field_type)}"'
        magnitude = -packed if packed < 0 else packed
        return f'"{time_text(packed < 0, magnitude >> 24, magnitude % (1 << 24), 6)}"'
    if field_type == _VAR_STRING:  # a string kept as opaque prints as the string
        return quoted(data.decode("utf-8", "surrogateescape"))
    return quoted(f"base64:type{field_type}:{_mysql_base64(data)}")


def _data(buf: bytes, start: int, length: int) -> bytes:
    if start + length > len(buf):
        raise InvalidJson(f"a binary JSON value of {length} bytes runs past the document's end")
    return buf[start : start + length]


def _scalar_text(buf: bytes, kind: int, pos: int) -> str:
    """The text of a scalar stored at `pos` (past its type byte)."""
    if kind == STRING:
        length, start = _variable_length(buf, pos)
        return quoted(_data(buf, start, length).decode("utf-8", "surrogateescape"))
    if kind == INT16:
        return str(_i16(buf, pos)[0])
    if kind == INT32:
        return str(_i32(buf, pos)[0])
    if kind == INT64:
        return str(_i64(buf, pos)[0])
    if kind == UINT16:
        return str(_u16(buf, pos)[0])
    if kind == UINT32:
        return str(_u32(buf, pos)[0])
    if kind == UINT64:
        return str(_u64(buf, pos)[0])
    if kind == DOUBLE:
        return double_text(_f64(buf, pos)[0])
    if kind == LITERAL:
        literal = _LITERALS.get(buf[pos])
        if literal is None:
            raise InvalidJson(f"unknown binary JSON literal {buf[pos]}")
        return literal
    if kind == OPAQUE:
        field_type = buf[pos]
        length, start = _variable_length(buf, pos + 1)
        return opaque_text(field_type, _data(buf, start, length))
    raise InvalidJson(f"unknown binary JSON type {kind:#04x}")


def _inlined_text(buf: bytes, kind: int, pos: int) -> str:
    """The text of a literal or integer stored in a value entry itself."""
    if kind == LITERAL:
        literal = _LITERALS.get(buf[pos])
        if literal is None:
            raise InvalidJson(f"unknown binary JSON literal {buf[pos]}")
        return literal
    if kind == INT16:
        return str(_i16(buf, pos)[0])
    if kind == UINT16:
        return str(_u16(buf, pos)[0])
    if kind == INT32:
        return str(_i32(buf, pos)[0])
    return str(_u32(buf, pos)[0])


def _container_text(buf: bytes, kind: int, pos: int) -> str:
    """The text of the object or array of type `kind` stored at `pos` (past its type byte).

    The hot path of capture's JSON columns: strings and inlined integers are read in place, each member's text
    built once and joined."""
    if kind & 1:  # the large format: four-byte counts and offsets, 32-bit integers inlined too
        count, offset_size, read_offset, inlined = _u32(buf, pos)[0], 4, _u32, _INLINED_LARGE
    else:
        count, offset_size, read_offset, inlined = _u16(buf, pos)[0], 2, _u16, _INLINED_SMALL
    entry_size = 1 + offset_size
    is_object = kind <= LARGE_OBJECT
    key_entries = pos + 2 * offset_size
    values = key_entries + count * (offset_size + 2) if is_object else key_entries
    end = len(buf)
    parts = []
    append = parts.append
    for i in range(count):
        entry = values + i * entry_size
        child = buf[entry]
        if child == STRING:
            at = pos + read_offset(buf, entry + 1)[0]
            length = buf[at]
            if length < 0x80:
                at += 1
            else:
                length, at = _variable_length(buf, at)
            if at + length > end:
                raise InvalidJson(f"a binary JSON string of {length} bytes runs past the document's end")
            text = buf[at : at + length].decode("utf-8", "surrogateescape")
            text = f'"{text.translate(JSON_ESCAPES)}"' if JSON_NEEDS_ESCAPE.search(text) else f'"{text}"'  # quoted(), inlined
        elif child == INT16:  # inlined in both formats
            text = str(_i16(buf, entry + 1)[0])
        elif child in inlined:
            text = _inlined_text(buf, child, entry + 1)
        elif child <= LARGE_ARRAY:
            text = _container_text(buf, child, pos + read_offset(buf, entry + 1)[0])
        else:
            text = _scalar_text(buf, child, pos + read_offset(buf, entry + 1)[0])
        if is_object:
            at = key_entries + i * (offset_size + 2)
            key_start = pos + read_offset(buf, at)[0]
            key_end = key_start + _u16(buf, at + offset_size)[0]
            if key_end > end:
                raise InvalidJson("a binary JSON key runs past the document's end")
            raw_key = buf[key_start:key_end]
            key = _quoted_keys.get(raw_key)
            if key is None:
                key = quoted(raw_key.decode("utf-8", "surrogateescape"))
                if len(_quoted_keys) < _MAX_QUOTED_KEYS:
                    _quoted_keys[raw_key] = key
            append(f"{key}: {text}")
        else:
            append(text)
    return ("{" if is_object else "[") + ", ".join(parts) + ("}" if is_object else "]")


def json_text(data: bytes) -> str:
    """A binary JSON document (a JSON column's value) as the server prints it.

    An empty value (what a JSON column added NOT NULL holds in rows that existed before) prints as `null`."""
    if not data:
        return "null"
    return node_text(Encoded(data, data[0], 1))


# -- partial updates ---------------------------------------------------------------------------------------


class Encoded(NamedTuple):
    """A value still in binary form: printed from its bytes, taken apart only where a diff's path goes into it."""

    buf: bytes
    kind: int
    pos: int  # past the type byte


# A document being updated: objects and arrays taken apart along the diffs' paths, scalars as their printed
# text, everything else still encoded.
Node = Union[dict[str, "Node"], list["Node"], str, Encoded]  # noqa: UP007 - a recursive alias needs the string form


def document(data: bytes) -> Node:
    """A binary JSON document as a node `apply_diffs` can change."""
    if not data:
        return "null"
    return Encoded(data, data[0], 1)


def _expanded(node: Node) -> Node:
    """An object or array still encoded, taken apart one level (its members stay encoded)."""
    if type(node) is not Encoded or node.kind > LARGE_ARRAY:
        return node
    buf, kind, pos = node
    if kind & 1:
        count, offset_size, read_offset, inlined = _u32(buf, pos)[0], 4, _u32, _INLINED_LARGE
    else:
        count, offset_size, read_offset, inlined = _u16(buf, pos)[0], 2, _u16, _INLINED_SMALL
    entries = pos + 2 * offset_size

    def child(entry: int) -> Node:
        child_kind = buf[entry]
        if child_kind in inlined:
            return _inlined_text(buf, child_kind, entry + 1)
        return Encoded(buf, child_kind, pos + read_offset(buf, entry + 1)[0])

    if kind <= LARGE_OBJECT:
        key_entry = offset_size + 2
        values = entries + count * key_entry
        members: dict[str, Node] = {}
        for i in range(count):
            at = entries + i * key_entry
            key_start = pos + read_offset(buf, at)[0]
            key = _data(buf, key_start, _u16(buf, at + offset_size)[0]).decode("utf-8", "surrogateescape")
            members[key] = child(values + i * (1 + offset_size))
        return members
    return [child(entries + i * (1 + offset_size)) for i in range(count)]


def node_text(node: Node) -> str:
    """The text of a document as `apply_diffs` left it (or as it is stored, for an `Encoded` one)."""
    try:
        return _node_text(node)
    except (IndexError, struct.error) as error:
        raise InvalidJson(f"a binary JSON document is cut short ({error})") from error


def _node_text(node: Node) -> str:
    kind = type(node)
    if kind is Encoded:
        buf, code, pos = node  # type: ignore[misc]
        return _scalar_text(buf, code, pos) if code > LARGE_ARRAY else _container_text(buf, code, pos)
    if kind is str:
        return node  # type: ignore[return-value]
    if kind is dict:
        members = [f"{quoted(key)}: {_node_text(value)}" for key, value in node.items()]  # type: ignore[union-attr]
        return "{" + ", ".join(members) + "}"
    return "[" + ", ".join(_node_text(value) for value in node) + "]"  # type: ignore[union-attr]


Leg = Union[str, tuple[int, bool]]  # noqa: UP007 - a member name, or an array index (counted from the end?)
_IDENTIFIER_END = re.compile(r"[.\[]")
_INDEX = re.compile(r"\[(?:(\d+)|last(?:-(\d+))?)\]")


def parse_path(path: str) -> list[Leg]:
    """The legs of a path as `Json_path::to_string` writes one (`$.a."b c"[3][last-1]`): member names and array
    cells only, which is all a diff's path holds."""
    if not path.startswith("$"):
        raise InvalidJson(f"a partial JSON update's path {path!r} does not start with $")
    legs: list[Leg] = []
    pos = 1
    while pos < len(path):
        if path[pos] == ".":
            if path.startswith('"', pos + 1):
                end = pos + 2
                while path[end] != '"':
                    end += 2 if path[end] == "\\" else 1
                legs.append(_unquoted(path[pos + 1 : end + 1]))
                pos = end + 1
            else:
                found = _IDENTIFIER_END.search(path, pos + 1)
                end = found.start() if found else len(path)
                legs.append(path[pos + 1 : end])
                pos = end
            continue
        cell = _INDEX.match(path, pos)
        if cell is None:
            raise InvalidJson(f"a partial JSON update's path {path!r} has a leg that is no member and no array cell")
        if cell.group(1) is not None:
            legs.append((int(cell.group(1)), False))
        else:
            legs.append((int(cell.group(2) or 0), True))
        pos = cell.end()
    return legs


def _unquoted(text: str) -> str:
    value = json.loads(text)
    if not isinstance(value, str):
        raise InvalidJson(f"a partial JSON update's path has a member name {text} that is no string")
    return value


def _array_position(leg: tuple[int, bool], size: int) -> tuple[int, bool]:
    """(position, within bounds) of an array leg in an array of `size` (Json_array_index)."""
    index, from_end = leg
    if from_end:
        return (size - index - 1, True) if index < size else (0, False)
    return min(index, size), index < size


def _child_slot(container: Node, leg: Leg) -> tuple[dict[str, Node] | list[Node], str | int] | None:
    """The container and key of `leg` inside `container` (already taken apart), or None when it is not there."""
    if isinstance(leg, str):
        if type(container) is dict and leg in container:
            return container, leg
        return None
    if type(container) is list:
        position, within = _array_position(leg, len(container))
        if within:
            return container, position
    return None


def _seek(root: list[Node], legs: list[Leg]) -> tuple[dict[str, Node] | list[Node], str | int] | None:
    """The slot (container and key) holding the value at `legs`, taking objects and arrays apart on the way;
    None when the path does not lead to a value (seek_exact_path: no auto-wrapping)."""
    slot: tuple[dict[str, Node] | list[Node], str | int] | None = (root, 0)
    for leg in legs:
        assert slot is not None
        container, key = slot
        value = _expanded(container[key])  # type: ignore[index]
        container[key] = value  # type: ignore[index]
        slot = _child_slot(value, leg)
        if slot is None:
            return None
    return slot


def _key_order(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8", "surrogateescape")
    return len(encoded), encoded


def apply_diff(doc: Node, operation: int, legs: list[Leg], value: Node | None) -> Node | None:
    """The document after one diff, as the server's `apply_json_diff` makes it; None when the diff is rejected
    (its path is missing, or an INSERT's is taken)."""
    if not legs:
        return None  # the root is never replaced, inserted or removed by a diff
    root: list[Node] = [doc]
    if operation == REPLACE:
        slot = _seek(root, legs)
        if slot is None:
            return None
        container, key = slot
        container[key] = value  # type: ignore[index]
        return root[0]
    parent_slot = _seek(root, legs[:-1])
    if parent_slot is None:
        return None
    holder, parent_key = parent_slot
    parent = _expanded(holder[parent_key])  # type: ignore[index]
    holder[parent_key] = parent  # type: ignore[index]
    last = legs[-1]
    if operation == INSERT:
        if type(parent) is dict and isinstance(last, str):
            if last in parent:
                return None
            parent[last] = value  # type: ignore[assignment]
            members = sorted(parent.items(), key=lambda member: _key_order(member[0]))  # MySQL's key order
            parent.clear()
            parent.update(members)
            return root[0]
        if type(parent) is list and not isinstance(last, str):
            position, _ = _array_position(last, len(parent))
            parent.insert(position, value)  # type: ignore[arg-type]
            return root[0]
        return None
    if operation == REMOVE:
        slot = _child_slot(parent, last)
        if slot is None:
            return None
        container, key = slot
        del container[key]  # type: ignore[arg-type]
        return root[0]
    raise InvalidJson(f"unknown partial JSON operation {operation}")


def _packed_length(buf: bytes, pos: int) -> tuple[int, int]:
    """A length in the server's net_field_length form, and the position after it."""
    first = buf[pos]
    if first < 251:
        return first, pos + 1
    size = {252: 2, 253: 3, 254: 8}.get(first)
    if size is None:
        raise InvalidJson(f"a partial JSON update holds an invalid length marker {first}")
    return int.from_bytes(buf[pos + 1 : pos + 1 + size], "little"), pos + 1 + size


def apply_diffs(doc: Node, diffs: bytes) -> Node:
    """The document after the diffs of one column of a PARTIAL_UPDATE_ROWS after-image (each: an operation
    byte, a path and, but for REMOVE, a binary JSON value, lengths in net_field_length form), applied in turn.

    A rejected diff means the logged before-image is not the document the server changed: that is raised,
    never passed over."""
    pos, end = 0, len(diffs)
    while pos < end:
        operation = diffs[pos]
        if operation not in _OPERATIONS:
            raise InvalidJson(f"unknown partial JSON operation {operation}")
        path_length, pos = _packed_length(diffs, pos + 1)
        path = diffs[pos : pos + path_length].decode("utf-8", "surrogateescape")
        pos += path_length
        value: Node | None = None
        if operation != REMOVE:
            value_length, pos = _packed_length(diffs, pos)
            if value_length == 0 or pos + value_length > end:
                raise InvalidJson(f"the value of a partial JSON {_OPERATIONS[operation]} at {path} is cut short")
            value = document(diffs[pos : pos + value_length])
            pos += value_length
        try:
            changed = apply_diff(doc, operation, parse_path(path), value)
        except (IndexError, struct.error) as error:
            raise InvalidJson(f"the document a partial JSON update changes is cut short ({error})") from error
        if changed is None:
            raise InvalidJson(
                f"a partial JSON {_OPERATIONS[operation]} at {path} does not apply to the document before it"
            )
        doc = changed
    if pos != end:
        raise InvalidJson("a partial JSON update runs past its column's length")
    return doc
