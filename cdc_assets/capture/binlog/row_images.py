"""Row events decoded straight into row images of canonical texts (mysql_types), one reader per column.

A reader takes the event body and an offset and returns the value's canonical text (or None) and the
offset after it. Readers are built once per table map, so decoding a value is one small function call.
The value layouts are the server's (`Field::pack` in MySQL and MariaDB); MySQL's own quirks that
python-mysql-replication passes on (a zero TIMESTAMP, YEAR 0, a BINARY(n) stored without its trailing
zeros, the SRID before a geometry's WKB) are settled here the same way `encode_binlog_value` settles them.
"""

from __future__ import annotations

import base64
import datetime as dt
import struct
from collections.abc import Callable

from cdc_assets.capture.binlog import table_map as t
from cdc_assets.capture.binlog.events import PARTIAL_UPDATE_ROWS, ROW_EVENTS, ROWS_V2
from cdc_assets.capture.binlog.json_binary import InvalidJson, apply_diffs, document, json_text, node_text
from cdc_assets.capture.binlog.packed import decimal_reader, time_text
from cdc_assets.capture.binlog.table_map import ColumnLayout, TableMap
from cdc_assets.core.mysql_types import (
    GEOMETRY_SRID_BYTES,
    PRINTED_BINARY_TYPES,
    TEXT_TYPES,
    ColumnSpec,
    bit_to_long,
    printed_binary,
)
from cdc_assets.core.ops import INSERT, UPDATE

Image = list[str | None]
PARTIAL_JSON_UPDATES = 1  # the after-image's value option of binlog_row_value_options=PARTIAL_JSON
Reader = Callable[[bytes, int], tuple[str | None, int]]

_EPOCH = dt.datetime(1970, 1, 1)
_TIMEF_INT_OFFSET = 0x800000
_TIMEF_OFFSET = 0x800000000000
_FIXED_INTS: dict[tuple[int, bool], tuple[str, int]] = {
    (t.TINY, False): ("<b", 1), (t.TINY, True): ("<B", 1),
    (t.SHORT, False): ("<h", 2), (t.SHORT, True): ("<H", 2),
    (t.LONG, False): ("<i", 4), (t.LONG, True): ("<I", 4),
    (t.LONGLONG, False): ("<q", 8), (t.LONGLONG, True): ("<Q", 8),
}  # fmt: skip


def _int_reader(fmt: str, size: int) -> Reader:
    unpack = struct.Struct(fmt).unpack_from

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return str(unpack(buf, pos)[0]), pos + size

    return read


def _int24_reader(signed: bool) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return str(int.from_bytes(buf[pos : pos + 3], "little", signed=signed)), pos + 3

    return read


def _float_reader(fmt: str, size: int) -> Reader:
    unpack = struct.Struct(fmt).unpack_from

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return repr(unpack(buf, pos)[0]), pos + size

    return read


def _length_prefixed(size: int, view: bool = False) -> Callable[[bytes, int], tuple[bytes, int]]:
    """Reads a value stored as a `size`-byte little-endian length and that many bytes. `view`: a MEDIUM or LONG
    value (3- or 4-byte length, up to 4 GB) comes as a memoryview of the event's bytes, not a copy of them."""
    if size == 1:

        def read(buf: bytes, pos: int) -> tuple[bytes, int]:
            end = pos + 1 + buf[pos]
            return buf[pos + 1 : end], end

    elif size == 2:

        def read(buf: bytes, pos: int) -> tuple[bytes, int]:
            end = pos + 2 + (buf[pos] | buf[pos + 1] << 8)
            return buf[pos + 2 : end], end

    elif view:

        def read(buf: bytes, pos: int) -> tuple[bytes, int]:
            start = pos + size
            end = start + int.from_bytes(buf[pos:start], "little")
            return memoryview(buf)[start:end], end  # type: ignore[return-value]

    else:

        def read(buf: bytes, pos: int) -> tuple[bytes, int]:
            start = pos + size
            end = start + int.from_bytes(buf[pos:start], "little")
            value = buf[start:end]  # bytes even from the bytearray of an event of 16 MB or more (binlog.protocol)
            return (value if type(value) is bytes else bytes(value)), end

    return read


def _text_reader(size: int, codec: str | None) -> Reader:
    raw = _length_prefixed(size, view=True)
    if codec is None:  # a charset Python has no codec for: the bytes as UTF-8, undecodable ones kept
        codec, errors = "utf-8", "surrogateescape"
    else:
        errors = "strict"

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        value, end = raw(buf, pos)
        return str(value, codec, errors), end  # bytes or a view of them: decoded straight into the text

    return read


def _binary_reader(size: int, pad_to: int | None = None, skip: int = 0) -> Reader:
    raw = _length_prefixed(size, view=True)
    b64 = base64.b64encode

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        value, end = raw(buf, pos)
        if pad_to:  # BINARY(n) is stored without its trailing zero bytes
            value = value.ljust(pad_to, b"\0")
        return b64(value[skip:]).decode("ascii"), end

    return read


def _printed_binary_reader(size: int, kind: str) -> Reader:
    """A MariaDB UUID, INET6 or INET4 (fixed binary in the binlog) as the text SELECT prints."""
    raw = _length_prefixed(size)
    width = PRINTED_BINARY_TYPES[kind]

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        value, end = raw(buf, pos)
        return printed_binary(kind, value.ljust(width, b"\0")), end

    return read


def _json_reader(size: int) -> Reader:
    """MySQL's binary JSON, as the server prints it (MariaDB's JSON is a LONGTEXT and never comes here)."""
    raw = _length_prefixed(size)

    def read(buf: bytes, pos: int) -> tuple[str | None, int]:
        value, end = raw(buf, pos)
        return json_text(value), end

    return read


def _fraction_reader(fsp: int) -> tuple[int, Callable[[bytes, int], int]]:
    """(bytes, reader of microseconds) of the fractional seconds of TIME2, DATETIME2 and TIMESTAMP2."""
    size = (fsp + 1) // 2
    scale = 10 ** (6 - fsp)
    odd = fsp % 2

    def micros(buf: bytes, pos: int) -> int:
        if not size:
            return 0
        value = int.from_bytes(buf[pos : pos + size], "big")
        return (value // 10 if odd else value) * scale

    return size, micros


def _valid_datetime(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> bool:
    if year and 1 <= month <= 12 and 1 <= day <= 28 and hour < 24 and minute < 60 and second < 60:
        return True
    try:
        dt.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return False
    return True


def _datetime2_reader(fsp: int) -> Reader:
    """DATETIME2: the texts of its date and of its time of day are kept per column (few distinct dates, at most
    86,400 times), so a value costs two look-ups and one format."""
    frac_size = (fsp + 1) // 2
    size, frac_bits = 5 + frac_size, 8 * frac_size
    frac_scale, odd = 10 ** (6 - fsp), fsp % 2
    from_bytes = int.from_bytes
    dates: dict[int, str] = {}  # by the year-month-day bits; "" for a zero or impossible date
    clocks: dict[int, str] = {}  # by the hour-minute-second bits; "" for an impossible time

    def read(buf: bytes, pos: int) -> tuple[str | None, int]:
        packed = from_bytes(buf[pos : pos + size], "big")
        frac = packed & ((1 << frac_bits) - 1)
        packed >>= frac_bits
        date = dates.get(packed >> 17)
        if date is None:
            year, month = divmod(packed >> 22 & 0x1FFFF, 13)
            day = packed >> 17 & 0x1F
            date = dates[packed >> 17] = (
                f"{year:04d}-{month:02d}-{day:02d}" if _valid_datetime(year, month, day) else ""
            )
        clock = clocks.get(packed & 0x1FFFF)
        if clock is None:
            hour, minute, second = packed >> 12 & 0x1F, packed >> 6 & 0x3F, packed & 0x3F
            valid = hour < 24 and minute < 60 and second < 60
            clock = clocks[packed & 0x1FFFF] = f"{hour:02d}:{minute:02d}:{second:02d}" if valid else ""
        if not date or not clock:
            return None, pos + size  # a zero or partly zero DATETIME: NULL, as MySQL's clients read it
        return f"{date} {clock}.{(frac // 10 if odd else frac) * frac_scale:06d}", pos + size

    return read


def _timestamp_text(seconds: int, us: int) -> str | None:
    if not seconds and not us:
        return None  # the zero TIMESTAMP (MySQL's smallest real one is 1970-01-01 00:00:01 UTC)
    value = _EPOCH + dt.timedelta(seconds=seconds, microseconds=us)
    return value.isoformat(sep=" ", timespec="microseconds")


def _timestamp2_reader(fsp: int) -> Reader:
    frac_size, micros = _fraction_reader(fsp)

    def read(buf: bytes, pos: int) -> tuple[str | None, int]:
        seconds = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
        return _timestamp_text(seconds, micros(buf, pos + 4)), pos + 4 + frac_size

    return read


def _time2_reader(fsp: int) -> Reader:
    """TIME2 as MySQL's `my_time_packed_from_binary` reads it (negative fractions borrow from the seconds)."""
    size = 3 + (fsp + 1) // 2

    def read(buf: bytes, pos: int) -> tuple[str, int]:
        if fsp >= 5:
            packed = int.from_bytes(buf[pos : pos + 6], "big") - _TIMEF_OFFSET
        else:
            whole = int.from_bytes(buf[pos : pos + 3], "big") - _TIMEF_INT_OFFSET
            frac_bytes = size - 3
            frac = int.from_bytes(buf[pos + 3 : pos + size], "big") if frac_bytes else 0
            if whole < 0 and frac:
                whole += 1
                frac -= 1 << (8 * frac_bytes)
            packed = (whole << 24) + frac * (10_000 if frac_bytes == 1 else 100)
        negative = packed < 0
        packed = abs(packed)
        return time_text(negative, packed >> 24, packed & 0xFFFFFF, fsp), pos + size

    return read


def _date_text(year: int, month: int, day: int) -> str | None:
    if not _valid_datetime(year, month, day):
        return None  # a zero or partly zero DATE: NULL, as MySQL's clients read it
    return f"{year:04d}-{month:02d}-{day:02d}"


def _date_reader(buf: bytes, pos: int) -> tuple[str | None, int]:
    packed = int.from_bytes(buf[pos : pos + 3], "little")
    return _date_text(packed >> 9, packed >> 5 & 0xF, packed & 0x1F), pos + 3


def _old_datetime_reader(buf: bytes, pos: int) -> tuple[str | None, int]:
    date, clock = divmod(int.from_bytes(buf[pos : pos + 8], "little"), 1_000_000)
    day_text = _date_text(date // 10_000, date // 100 % 100, date % 100)
    if day_text is None:
        return None, pos + 8
    return f"{day_text} {clock // 10_000:02d}:{clock // 100 % 100:02d}:{clock % 100:02d}.000000", pos + 8


def _old_timestamp_reader(buf: bytes, pos: int) -> tuple[str | None, int]:
    return _timestamp_text(int.from_bytes(buf[pos : pos + 4], "little"), 0), pos + 4


def _old_time_reader(buf: bytes, pos: int) -> tuple[str, int]:
    value = int.from_bytes(buf[pos : pos + 3], "little", signed=True)
    hms = abs(value)
    packed = (hms // 10_000) << 12 | (hms // 100 % 100) << 6 | hms % 100
    return time_text(value < 0, packed, 0, 0), pos + 3


def _year_reader(buf: bytes, pos: int) -> tuple[str, int]:
    stored = buf[pos]
    return str(1900 + stored if stored else 0), pos + 1


def _enum_reader(size: int, members: tuple[str, ...]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return members[int.from_bytes(buf[pos : pos + size], "little")], pos + size

    return read


def _set_reader(size: int, members: tuple[str, ...]) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        mask = int.from_bytes(buf[pos : pos + size], "little")
        return ",".join(m for i, m in enumerate(members) if mask >> i & 1), pos + size

    return read


def _bit_reader(size: int) -> Reader:
    def read(buf: bytes, pos: int) -> tuple[str, int]:
        return str(bit_to_long(int.from_bytes(buf[pos : pos + size], "big"))), pos + size

    return read


def column_reader(column: ColumnSpec, layout: ColumnLayout) -> Reader:
    """The reader of one column's values in row images."""
    code, size = layout.type, layout.size
    if (code, column.unsigned) in _FIXED_INTS:
        return _int_reader(*_FIXED_INTS[code, column.unsigned])
    if code == t.INT24:
        return _int24_reader(signed=not column.unsigned)
    if code == t.NEWDECIMAL:
        assert column.precision is not None and column.scale is not None
        return decimal_reader(column.precision, column.scale)
    if code == t.FLOAT:
        return _float_reader("<f", 4)
    if code == t.DOUBLE:
        return _float_reader("<d", 8)
    if code in (t.VARCHAR, t.VAR_STRING, t.STRING, t.BLOB):
        if column.type in PRINTED_BINARY_TYPES:
            return _printed_binary_reader(size, column.type)
        if column.type in ("binary", "varbinary", "blob"):
            return _binary_reader(size, pad_to=column.length if column.type == "binary" else None)
        return _text_reader(size, layout.codec)
    if code == t.DATETIME2:
        return _datetime2_reader(column.fsp)
    if code == t.TIMESTAMP2:
        return _timestamp2_reader(column.fsp)
    if code == t.TIME2:
        return _time2_reader(column.fsp)
    if code in (t.DATE, t.NEWDATE):
        return _date_reader
    if code == t.YEAR:
        return _year_reader
    if code == t.ENUM:
        return _enum_reader(size, column.members)
    if code == t.SET:
        return _set_reader(size, column.members)
    if code == t.BIT:
        return _bit_reader(size)
    if code == t.JSON:
        return _json_reader(size)
    if code == t.VECTOR:  # the float32s as stored: the canonical text of a VECTOR is their bytes (mysql_types)
        return _binary_reader(size)
    if code == t.GEOMETRY:  # MySQL stores a 4-byte SRID before the WKB; the lakehouse keeps plain WKB
        return _binary_reader(size, skip=GEOMETRY_SRID_BYTES)
    if code == t.DATETIME:
        return _old_datetime_reader
    if code == t.TIMESTAMP:
        return _old_timestamp_reader
    if code == t.TIME:
        return _old_time_reader
    raise ValueError(f"no reader for binlog type {code} of column {column.name!r}")


def _inline_read(column: ColumnSpec, layout: ColumnLayout, i: int) -> list[str] | None:
    """Source lines reading column `i` into `v{i}` for the commonest layouts (fixed-size integers, text with a
    one- or two-byte length), or None: the column's reader `r{i}` is called."""
    code, size = layout.type, layout.size
    if (code, column.unsigned) in _FIXED_INTS:
        return [f"v{i} = str(u{i}(buf, pos)[0])", f"pos += {_FIXED_INTS[code, column.unsigned][1]}"]
    text = code in (t.VARCHAR, t.VAR_STRING, t.STRING, t.BLOB) and column.type in TEXT_TYPES and layout.codec
    if text and size == 1:
        return ["end = pos + 1 + buf[pos]", f"v{i} = buf[pos + 1 : end].decode({layout.codec!r})", "pos = end"]
    if text and size == 2:
        return [
            "end = pos + 2 + (buf[pos] | buf[pos + 1] << 8)",
            f"v{i} = buf[pos + 2 : end].decode({layout.codec!r})",
            "pos = end",
        ]
    return None


def compile_image_reader(
    columns: tuple[ColumnSpec, ...], layouts: tuple[ColumnLayout, ...], readers: list[Reader]
) -> Callable[[bytes, int], tuple[Image, int]]:
    """One function reading a whole row image of the table, its columns' reads written out one after another.

    In a loop over per-column readers, the loop and the call cost about as much as reading a small value; the
    unrolled function (generated once per table map) reads a typical row in about two thirds of the time. It
    holds only integer offsets, codec names and the readers themselves."""
    null_bytes = (len(columns) + 7) // 8
    lines = [
        "def read(buf, pos):",
        f"    nulls = from_bytes(buf[pos : pos + {null_bytes}], 'little')",
        f"    pos += {null_bytes}",
    ]
    namespace: dict[str, object] = {"from_bytes": int.from_bytes}
    for i, (column, layout) in enumerate(zip(columns, layouts, strict=True)):
        inline = _inline_read(column, layout, i)
        if inline is None:
            namespace[f"r{i}"] = readers[i]
            inline = [f"v{i}, pos = r{i}(buf, pos)"]
        elif (code := (layout.type, column.unsigned)) in _FIXED_INTS:
            namespace[f"u{i}"] = struct.Struct(_FIXED_INTS[code][0]).unpack_from
        lines += [f"    if nulls >> {i} & 1:", f"        v{i} = None", "    else:"] + [
            f"        {line}" for line in inline
        ]
    lines.append(f"    return [{', '.join(f'v{i}' for i in range(len(columns)))}], pos")
    exec(compile("\n".join(lines), f"<row image of {len(columns)} columns>", "exec"), namespace)
    return namespace["read"]  # type: ignore[return-value]


class RowDecoder:
    """Decodes the row events of one table map into row images."""

    def __init__(self, table: TableMap) -> None:
        self.table = table
        self.readers = [column_reader(c, layout) for c, layout in zip(table.columns, table.layouts, strict=True)]
        self.width = len(self.readers)
        self._bitmap_bytes = (self.width + 7) // 8
        self._full_image = compile_image_reader(table.columns, table.layouts, self.readers)

    def rows(
        self, event_type: int, body: bytes, post_header_length: int
    ) -> tuple[list[Image | None], list[Image | None]]:
        """The images before and after each row of a row event: after is None for a delete, before for a write."""
        pos = post_header_length
        if event_type in ROWS_V2:  # the extra row info's length counts its own two bytes
            pos += int.from_bytes(body[pos - 2 : pos], "little") - 2
        width, pos = _packed_int(body, pos)
        if width != self.width:
            raise ValueError(f"a row event of {self.table.table} has {width} columns, its table map {self.width}")
        present = body[pos : pos + self._bitmap_bytes]
        pos += self._bitmap_bytes
        operation = ROW_EVENTS[event_type]
        end = len(body)
        if event_type == PARTIAL_UPDATE_ROWS:
            after_present = body[pos : pos + self._bitmap_bytes]
            return self._partial_json_updates(body, pos + self._bitmap_bytes, present, after_present)
        images: list[Image | None] = []
        append = images.append
        if operation == UPDATE:
            read_before = self._image_reader(present)
            read_after = self._image_reader(body[pos : pos + self._bitmap_bytes])
            pos += self._bitmap_bytes
            afters: list[Image | None] = []
            while pos < end:
                before, pos = read_before(body, pos)
                after, pos = read_after(body, pos)
                append(before)
                afters.append(after)
            return images, afters
        read = self._image_reader(present)
        while pos < end:
            image, pos = read(body, pos)
            append(image)
        nothing: list[Image | None] = [None] * len(images)
        return (nothing, images) if operation == INSERT else (images, nothing)

    def _partial_json_updates(
        self, body: bytes, pos: int, before_present: bytes, after_present: bytes
    ) -> tuple[list[Image | None], list[Image | None]]:
        """The rows of a PARTIAL_UPDATE_ROWS event (binlog_row_value_options=PARTIAL_JSON).

        Each after-image starts with its value options; with PARTIAL_JSON_UPDATES set, a bitmap with one bit per
        JSON column of the table (present or not) marks the columns whose value is a list of diffs against the
        before-image's document instead of a document: those are applied to it here, so the after-image holds
        the document the server now has (Rows_log_event::print_verbose_one_row reads the event the same way)."""
        layouts = self.table.layouts
        json_columns = [i for i, layout in enumerate(layouts) if layout.type == t.JSON]
        json_bitmap_bytes = (len(json_columns) + 7) // 8
        raw_json = {i: _length_prefixed(layouts[i].size) for i in json_columns}
        before_columns = _present_columns(before_present, self.width)
        after_columns = _present_columns(after_present, self.width)
        before_nulls, after_nulls = (len(before_columns) + 7) // 8, (len(after_columns) + 7) // 8
        befores: list[Image | None] = []
        afters: list[Image | None] = []
        end = len(body)
        while pos < end:
            before: Image = [None] * self.width
            documents: dict[int, bytes] = {}
            nulls = int.from_bytes(body[pos : pos + before_nulls], "little")
            pos += before_nulls
            for bit, i in enumerate(before_columns):
                if nulls >> bit & 1:
                    continue
                if i in raw_json:
                    documents[i], pos = raw_json[i](body, pos)
                    before[i] = json_text(documents[i])
                else:
                    before[i], pos = self.readers[i](body, pos)
            options, pos = _packed_int(body, pos)
            partial: set[int] = set()
            if options & PARTIAL_JSON_UPDATES:
                marks = int.from_bytes(body[pos : pos + json_bitmap_bytes], "little")
                pos += json_bitmap_bytes
                partial = {column for k, column in enumerate(json_columns) if marks >> k & 1}
            after: Image = [None] * self.width
            nulls = int.from_bytes(body[pos : pos + after_nulls], "little")
            pos += after_nulls
            for bit, i in enumerate(after_columns):
                if nulls >> bit & 1:
                    continue
                if i in partial:
                    diffs, pos = raw_json[i](body, pos)
                    after[i] = self._updated_document(i, documents.get(i), diffs)
                else:
                    after[i], pos = self.readers[i](body, pos)
            befores.append(before)
            afters.append(after)
        return befores, afters

    def _updated_document(self, column: int, before: bytes | None, diffs: bytes) -> str:
        """The document after a column's diffs. MySQL logs diffs only with the document they change in the
        before-image (a session with binlog_row_image MINIMAL logs the whole document instead): without it
        capture stops rather than guess."""
        name = f"{self.table.table}.{self.table.columns[column].name}"
        if before is None:
            raise ValueError(f"The binlog holds a partial JSON update of {name} without the document it changes.")
        try:
            return node_text(apply_diffs(document(before), diffs))
        except InvalidJson as error:
            raise ValueError(f"The partial JSON update of {name} cannot be applied: {error}.") from error

    def _image_reader(self, present: bytes) -> Callable[[bytes, int], tuple[Image, int]]:
        every_column = (1 << self.width) - 1
        if int.from_bytes(present, "little") & every_column != every_column:
            return self._partial_image_reader(present)
        return self._full_image

    def _partial_image_reader(self, present: bytes) -> Callable[[bytes, int], tuple[Image, int]]:
        """Images holding only some columns (binlog_row_image MINIMAL or NOBLOB): absent ones are None."""
        mask = int.from_bytes(present, "little")
        columns = [i for i in range(self.width) if mask >> i & 1]
        null_bytes = (len(columns) + 7) // 8

        def read(buf: bytes, pos: int) -> tuple[Image, int]:
            nulls = int.from_bytes(buf[pos : pos + null_bytes], "little")
            pos += null_bytes
            image: Image = [None] * self.width
            for bit, i in enumerate(columns):
                if not nulls >> bit & 1:
                    image[i], pos = self.readers[i](buf, pos)
            return image, pos

        return read


def _present_columns(bitmap: bytes, width: int) -> list[int]:
    mask = int.from_bytes(bitmap, "little")
    return [i for i in range(width) if mask >> i & 1]


def _packed_int(buf: bytes, pos: int) -> tuple[int, int]:
    first = buf[pos]
    if first < 251:
        return first, pos + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(buf[pos + 1 : pos + 1 + size], "little"), pos + 1 + size
