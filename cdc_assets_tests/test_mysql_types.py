"""Type mapping (CONTRACT §5) and the canonical text form, without a server."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from cdc_assets.mysql_types import (
    ColumnSpec,
    _members,
    arrow_type,
    column_from_information_schema,
    decode_column,
    decode_image,
    encode_binlog_value,
    encode_sql_value,
    format_time,
)


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        (ColumnSpec("c", "tinyint"), pa.int8()),
        (ColumnSpec("c", "smallint"), pa.int16()),
        (ColumnSpec("c", "mediumint"), pa.int32()),
        (ColumnSpec("c", "int"), pa.int32()),
        (ColumnSpec("c", "bigint"), pa.int64()),
        (ColumnSpec("c", "tinyint", unsigned=True), pa.int16()),
        (ColumnSpec("c", "smallint", unsigned=True), pa.int32()),
        (ColumnSpec("c", "int", unsigned=True), pa.int64()),
        (ColumnSpec("c", "bigint", unsigned=True), pa.decimal128(20, 0)),
        (ColumnSpec("c", "decimal", precision=12, scale=4), pa.decimal128(12, 4)),
        (ColumnSpec("c", "decimal", precision=65, scale=30), pa.string()),
        (ColumnSpec("c", "float"), pa.float32()),
        (ColumnSpec("c", "double"), pa.float64()),
        (ColumnSpec("c", "bit"), pa.int64()),
        (ColumnSpec("c", "date"), pa.date32()),
        (ColumnSpec("c", "datetime", fsp=6), pa.timestamp("us")),
        (ColumnSpec("c", "timestamp", fsp=3), pa.timestamp("us", tz="UTC")),
        (ColumnSpec("c", "time"), pa.string()),
        (ColumnSpec("c", "year"), pa.int16()),
        (ColumnSpec("c", "varchar"), pa.string()),
        (ColumnSpec("c", "enum", members=("a",)), pa.string()),
        (ColumnSpec("c", "set", members=("a",)), pa.string()),
        (ColumnSpec("c", "json"), pa.string()),
        (ColumnSpec("c", "blob"), pa.binary()),
        (ColumnSpec("c", "varbinary"), pa.binary()),
    ],
)
def test_arrow_type_follows_the_contract(column: ColumnSpec, expected: pa.DataType) -> None:
    assert arrow_type(column) == expected


@pytest.mark.parametrize(
    ("value", "fsp", "text"),
    [
        (dt.timedelta(hours=-12, minutes=-30), 0, "-12:30:00"),
        (dt.timedelta(days=-1, seconds=41400), 0, "-12:30:00"),
        (dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=500000), 6, "838:59:59.500000"),
        (dt.timedelta(seconds=5, microseconds=120000), 2, "00:00:05.12"),
        (dt.timedelta(0), 0, "00:00:00"),
    ],
)
def test_time_prints_as_mysql_does(value: dt.timedelta, fsp: int, text: str) -> None:
    assert format_time(value, fsp) == text


def test_binlog_quirks_are_normalised() -> None:
    assert encode_binlog_value(ColumnSpec("b", "bit"), "10100101") == "165"
    assert encode_binlog_value(ColumnSpec("b", "bit"), "1" * 64) == "-1"  # BIT(64) wraps into a long
    members = ("red", "green", "blue")
    assert encode_binlog_value(ColumnSpec("s", "set", members=members), {"blue", "red"}) == "red,blue"
    assert encode_binlog_value(ColumnSpec("s", "set", members=members), None, "empty set") == ""
    assert encode_binlog_value(ColumnSpec("s", "set", members=members), None, "null") is None
    assert encode_binlog_value(ColumnSpec("x", "blob"), "") == ""  # empty BLOB arrives as ''
    assert encode_binlog_value(ColumnSpec("j", "json"), {b"k": [1, "é"]}) == '{"k": [1, "é"]}'
    assert encode_binlog_value(ColumnSpec("d", "decimal", precision=5, scale=2), Decimal("1.50")) == "1.50"


def test_sql_and_binlog_routes_meet_in_the_same_text() -> None:
    cases = [
        (ColumnSpec("b", "bit"), "101", b"\x05"),
        (ColumnSpec("s", "set", members=("a", "b")), {"a", "b"}, "a,b"),
        (ColumnSpec("t", "time", fsp=0), dt.timedelta(hours=-1), dt.timedelta(hours=-1)),
        (ColumnSpec("v", "varbinary"), b"\x00\x01", b"\x00\x01"),
        (ColumnSpec("f", "double"), 0.1, 0.1),
    ]
    for column, from_binlog, from_sql in cases:
        assert encode_binlog_value(column, from_binlog) == encode_sql_value(column, from_sql), column


def test_decode_column_is_exact() -> None:
    unsigned = ColumnSpec("u", "bigint", unsigned=True)
    assert decode_column(unsigned, pa.array(["18446744073709551615", None])).to_pylist() == [
        Decimal("18446744073709551615"),
        None,
    ]
    ts = ColumnSpec("t", "timestamp", fsp=6)
    assert decode_column(ts, pa.array(["2038-01-19 03:14:07.654321"])).to_pylist() == [
        dt.datetime(2038, 1, 19, 3, 14, 7, 654321, tzinfo=dt.UTC)
    ]
    blob = ColumnSpec("b", "blob")
    text = encode_binlog_value(blob, b"\x00\xff")
    assert decode_column(blob, pa.array([text, "", None])).to_pylist() == [b"\x00\xff", b"", None]
    wide = ColumnSpec("w", "decimal", precision=65, scale=30)
    assert decode_column(wide, pa.array(["1.000000000000000000000000000001"])).to_pylist() == [
        "1.000000000000000000000000000001"
    ]


def test_decode_image_checks_width() -> None:
    columns = [ColumnSpec("a", "int"), ColumnSpec("b", "varchar")]
    images = pa.array([["1", "x"], None, ["2", None]], pa.list_(pa.string()))
    decoded = decode_image(columns, images)
    assert decoded.to_pylist() == [{"a": 1, "b": "x"}, None, {"a": 2, "b": None}]
    with pytest.raises(ValueError, match="width"):
        decode_image(columns, pa.array([["1"]], pa.list_(pa.string())))


def test_information_schema_columns() -> None:
    row = {
        "COLUMN_NAME": "price",
        "DATA_TYPE": "decimal",
        "COLUMN_TYPE": "decimal(10,2) unsigned",
        "NUMERIC_PRECISION": 10,
        "NUMERIC_SCALE": 2,
        "DATETIME_PRECISION": None,
        "CHARACTER_SET_NAME": None,
    }
    assert column_from_information_schema(row) == ColumnSpec("price", "decimal", unsigned=True, precision=10, scale=2)
    assert _members("set('a','it''s','c,d')") == ("a", "it's", "c,d")


def test_binlog_decoder_quirks_for_time_year_and_zero_timestamp() -> None:
    time2 = ColumnSpec("t", "time", fsp=2)
    # python-mysql-replication 1.0.17 hands -12:30:00.01 over as -12:30:00.99
    as_decoded = -dt.timedelta(hours=12, minutes=30, microseconds=990_000)
    assert encode_binlog_value(time2, as_decoded) == "-12:30:00.01"
    assert encode_binlog_value(time2, -dt.timedelta(hours=1)) == "-01:00:00.00"
    assert encode_binlog_value(time2, dt.timedelta(hours=1, microseconds=10_000)) == "01:00:00.01"
    assert encode_binlog_value(ColumnSpec("y", "year"), 1900) == "0"
    assert encode_binlog_value(ColumnSpec("y", "year"), 2155) == "2155"
    assert encode_binlog_value(ColumnSpec("ts", "timestamp"), dt.datetime(1970, 1, 1)) is None
    assert encode_sql_value(ColumnSpec("d", "datetime"), "0000-00-00 00:00:00") is None
    assert encode_sql_value(ColumnSpec("d", "date"), "2024-00-00") is None
