"""Column readers of the binlog decoder on hand-made row-image bytes (no server): the stored layouts and the
MySQL quirks the canonical texts settle (test_binlog_decoder compares whole binlogs with a server)."""

from __future__ import annotations

import pytest

from cdc_assets.capture.binlog import table_map as t
from cdc_assets.capture.binlog.packed import decimal_size
from cdc_assets.capture.binlog.row_images import column_reader
from cdc_assets.capture.binlog.table_map import ColumnLayout
from cdc_assets.core.mysql_types import ColumnSpec


def read(column: ColumnSpec, layout: ColumnLayout, data: bytes) -> str | None:
    text, end = column_reader(column, layout)(b"\xaa" + data + b"\xbb", 1)
    assert end == 1 + len(data), "the reader must stop exactly at the value's end"
    return text


@pytest.mark.parametrize(
    ("data", "text"),
    [  # the examples of MySQL's decimal.c: DECIMAL(14,4)
        (bytes.fromhex("810DFB38D204D2"), "1234567890.1234"),
        (bytes.fromhex("7EF204C72DFB2D"), "-1234567890.1234"),
        (bytes.fromhex("80000000000000"), "0.0000"),
    ],
)
def test_decimal(data: bytes, text: str) -> None:
    column = ColumnSpec("d", "decimal", precision=14, scale=4)
    assert decimal_size(14, 4) == 7
    assert read(column, ColumnLayout(t.NEWDECIMAL), data) == text


@pytest.mark.parametrize(
    ("fsp", "data", "text"),
    [
        (2, bytes.fromhex("7FFFFFFF"), "-00:00:00.01"),  # a negative fraction borrows from the seconds
        (1, bytes.fromhex("80100032"), "01:00:00.5"),
        (0, bytes.fromhex("80C780"), "12:30:00"),
        (0, bytes.fromhex("7F3880"), "-12:30:00"),
    ],
)
def test_time2(fsp: int, data: bytes, text: str) -> None:
    assert read(ColumnSpec("t", "time", fsp=fsp), ColumnLayout(t.TIME2), data) == text


def test_datetime2_and_zero_dates() -> None:
    column = ColumnSpec("d", "datetime", fsp=0)
    packed = 1 << 39 | (2024 * 13 + 2) << 22 | 29 << 17 | 12 << 12 | 34 << 6 | 56
    assert read(column, ColumnLayout(t.DATETIME2), packed.to_bytes(5, "big")) == "2024-02-29 12:34:56.000000"
    assert read(column, ColumnLayout(t.DATETIME2), (1 << 39).to_bytes(5, "big")) is None  # 0000-00-00 00:00:00
    assert read(ColumnSpec("d", "date"), ColumnLayout(t.DATE), (2024 << 9 | 2 << 5 | 0).to_bytes(3, "little")) is None


def test_timestamp_zero_is_null_and_fractions_scale() -> None:
    column = ColumnSpec("ts", "timestamp", fsp=3)
    assert read(column, ColumnLayout(t.TIMESTAMP2), bytes(6)) is None
    one = (1).to_bytes(4, "big") + (1230).to_bytes(2, "big")  # fsp 3 stores 4 digits
    assert read(column, ColumnLayout(t.TIMESTAMP2), one) == "1970-01-01 00:00:01.123000"


def test_year_bit_enum_and_set() -> None:
    assert read(ColumnSpec("y", "year"), ColumnLayout(t.YEAR), b"\x00") == "0"
    assert read(ColumnSpec("y", "year"), ColumnLayout(t.YEAR), b"\xff") == "2155"
    assert read(ColumnSpec("b", "bit"), ColumnLayout(t.BIT, 8), b"\xff" * 8) == "-1"  # BIT(64) wraps into a long
    assert read(ColumnSpec("b", "bit"), ColumnLayout(t.BIT, 2), b"\x01\x02") == "258"
    enum = ColumnSpec("e", "enum", members=("", "a", "b"))
    assert read(enum, ColumnLayout(t.ENUM, 1), b"\x02") == "b"
    assert read(enum, ColumnLayout(t.ENUM, 1), b"\x00") == ""  # the error value of an invalid ENUM
    members = ("red", "green", "blue")
    assert read(ColumnSpec("s", "set", members=members), ColumnLayout(t.SET, 1), b"\x05") == "red,blue"
    assert read(ColumnSpec("s", "set", members=members), ColumnLayout(t.SET, 1), b"\x00") == ""


def test_strings_and_bytes() -> None:
    assert read(ColumnSpec("v", "varchar"), ColumnLayout(t.VARCHAR, 1, "utf-8"), b"\x04\xf0\x9f\x9a\x80") == "🚀"
    assert read(ColumnSpec("v", "varchar"), ColumnLayout(t.VARCHAR, 2, "utf-8"), b"\x01\x00x") == "x"
    binary = ColumnSpec("b", "binary", length=4)
    assert read(binary, ColumnLayout(t.STRING, 1), b"\x02\x01\x02") == "AQIAAA=="  # trailing zeros restored
    blob = ColumnSpec("b", "blob")
    assert read(blob, ColumnLayout(t.BLOB, 2), b"\x00\x00") == ""
    point = bytes(4) + bytes.fromhex("0101000000000000000000F03F0000000000000040")  # SRID 0, POINT(1 2)
    geometry = read(ColumnSpec("g", "geometry"), ColumnLayout(t.GEOMETRY, 4), len(point).to_bytes(4, "little") + point)
    assert geometry == "AQEAAAAAAAAAAADwPwAAAAAAAABA"  # plain WKB, SRID left out
