"""Type mapping (docs/lakehouse.md: Types (MySQL → Delta)) and the canonical text form, without a server."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from cdc_assets.core.mysql_types import (
    ColumnSpec,
    _members,
    arrow_type,
    column_from_information_schema,
    decode_column,
    decode_image,
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


def test_sql_values_meet_binlog_texts() -> None:
    """What PyMySQL returns for a SELECT reaches the texts the binlog reader produces (test_binlog_row_images)."""
    assert encode_sql_value(ColumnSpec("b", "bit"), b"\x05") == "5"
    assert encode_sql_value(ColumnSpec("b", "bit"), b"\xff" * 8) == "-1"  # BIT(64) wraps into a long
    assert encode_sql_value(ColumnSpec("s", "set", members=("a", "b")), {"b", "a"}) == "a,b"
    assert encode_sql_value(ColumnSpec("t", "time", fsp=0), dt.timedelta(hours=-1)) == "-01:00:00"
    assert encode_sql_value(ColumnSpec("v", "varbinary"), b"\x00\x01") == "AAE="
    assert encode_sql_value(ColumnSpec("f", "double"), 0.1) == "0.1"
    assert encode_sql_value(ColumnSpec("d", "decimal", precision=5, scale=2), Decimal("1.50")) == "1.50"
    assert encode_sql_value(ColumnSpec("j", "json"), '{"k": [1, "é"]}') == '{"k": [1, "é"]}'


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
    assert decode_column(blob, pa.array(["AP8=", "", None])).to_pylist() == [b"\x00\xff", b"", None]
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


def test_zero_dates_from_sql_are_null() -> None:
    assert encode_sql_value(ColumnSpec("d", "datetime"), "0000-00-00 00:00:00") is None
    assert encode_sql_value(ColumnSpec("d", "date"), "2024-00-00") is None
