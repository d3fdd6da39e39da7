"""The server's conversions of a MODIFY COLUMN, without a server: each case is what MariaDB 10.11 and MySQL 9.7 wrote
(test_alter_conversions runs every pair against both), so a rule can be read and changed here."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from cdc_assets.capture.ddl import parse_column_definition, tokenize
from cdc_assets.core.mysql_conversions import MARIADB, MYSQL, Conversion, InexactConversion, my_gcvt
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.stages.changes.rows import conformed_schema, unified_schema
from cdc_assets.stages.current.rows import convert_column

TODAY = dt.date(2026, 11, 28)


def _spec(sql: str) -> ColumnSpec:
    return parse_column_definition(tokenize(f"c {sql}"), "utf8mb4").spec


def _converted(old: str, new: str, values: list, flavor: str) -> list:
    return Conversion(_spec(old), _spec(new), flavor, TODAY).values(values)


BOTH = (MARIADB, MYSQL)


@pytest.mark.parametrize(
    ("old", "new", "values", "mariadb", "mysql"),
    [
        # an ENUM gives a number its index, a SET its bitmask, a text its member
        ("ENUM('b2c','b2b')", "INT", ["b2c", "b2b", "", None], [1, 2, 0, None], [1, 2, 0, None]),
        ("SET('x','y','z')", "SMALLINT UNSIGNED", ["", "x,z", "y"], [0, 5, 2], [0, 5, 2]),
        ("ENUM('a','12')", "VARCHAR(4)", ["12", ""], ["12", ""], ["12", ""]),
        # a number to an ENUM: MariaDB by index, MySQL by its text (a member's name first, then an index)
        ("INT", "ENUM('b2c','b2b','x','abc','é🚀','12')", [1, 12, 0, 99], ["b2c", "", "", ""], ["b2c", "12", "", ""]),
        ("BIGINT", "SET('x','y','z')", [5, 127, -1], ["x,z", "x,y,z", "x,y,z"], ["x,z", "", ""]),
        ("DECIMAL(10,3)", "ENUM('a','b','c')", [Decimal("0.500"), Decimal("2.500")], ["a", "c"], ["", ""]),
        # a text to a number: MariaDB takes its leading integer, MySQL rounds its leading number (exponent and all)
        ("VARCHAR(20)", "TINYINT", ["-3.5", "1e3", " 42 ", "abc", "2024-02-29", ""], [-3, 1, 42, 0, 127, 0], [-4, 127, 42, 0, 127, 0]),
        ("VARCHAR(20)", "BIGINT UNSIGNED", ["9223372036854775808"], [Decimal(9223372036854775807)], [Decimal(9223372036854775808)]),
        ("VARCHAR(20)", "DECIMAL(12,2)", ["1e3", "12:34:56", "0x1F", "-3.456"], [Decimal("1000.00"), Decimal("12.00"), Decimal("0.00"), Decimal("-3.46")],
         [Decimal("1000.00"), Decimal("12.00"), Decimal("0.00"), Decimal("-3.46")]),
        ("VARCHAR(20)", "YEAR", ["12", "0", "0000", "1e3", "12:34:56"], [2012, 2000, 0, 0, 2012], [2012, 2000, 0, 0, 2012]),
        ("VARCHAR(20)", "BIT(64)", ["-3.5", "1e3"], [-3, 1], [-3, 1]),
        # numbers among themselves: doubles round half to even, decimals half away from zero; out of range clamps
        ("DOUBLE", "INT", [2.5, 123456.789, -0.5], [2, 123457, 0], [2, 123457, 0]),
        ("DECIMAL(10,3)", "INT UNSIGNED", [Decimal("2.500"), Decimal("-1.000")], [3, 0], [3, 0]),
        ("DOUBLE", "FLOAT", [1.7976931348623157e308, 1e15], [3.4028234663852886e38, 999999986991104.0],
         [3.4028234663852886e38, 999999986991104.0]),
        ("BIT(64)", "DOUBLE", [-1], [-1.0], [18446744073709551615.0]),
        ("BIT(64)", "DECIMAL(12,2)", [-1], [Decimal("9999999999.99")], [Decimal("9999999999.99")]),
        ("DECIMAL(10,3)", "BIT(64)", [Decimal("-2.500")], [0], [-3]),
        # a number to a text as the server prints it
        ("FLOAT", "VARCHAR(40)", [16777216.0, 0.10000000149011612, -3.4028200183756560e38], ["16777200", "0.1", "-3.40282e38"],
         ["16777200", "0.1", "-3.40282e38"]),
        ("DOUBLE", "TEXT", [1e15, 1e14, 1e-15, 1e-16], ["1e15", "100000000000000", "0.000000000000001", "1e-16"],
         ["1e15", "100000000000000", "0.000000000000001", "1e-16"]),
        ("BIT(64)", "VARCHAR(40)", [-1], ["18446744073709551615"], ["18446744073709551615"]),
        ("BIT(16)", "BLOB", [0x3132], [b"12"], [b"12"]),
        ("YEAR", "CHAR(8)", [0, 2024], ["0000", "2024"], ["0000", "2024"]),
        ("DECIMAL(10,3)", "JSON", [Decimal("0.500")], ["0.500"], ["0.5"]),
        # bytes to a text: MariaDB writes '?' for each byte that is no character, MySQL cuts the text there
        ("VARBINARY(12)", "VARCHAR(40)", [b"\x00\xff\x00\xff", "é".encode()], ["\x00?\x00?", "é"], ["\x00", "é"]),
        ("VARCHAR(20)", "BINARY(8)", ["é🚀", "2024-02-29"], ["é🚀".encode() + b"\0\0", b"2024-02-"], ["é🚀".encode() + b"\0\0", b"2024-02-"]),
        ("VARCHAR(20)", "VARCHAR(20) CHARACTER SET latin1", ["é🚀"], ["é?"], ["é?"]),
        ("VARCHAR(20)", "VARCHAR(4)", ["abcdef", "é🚀é🚀é"], ["abcd", "é🚀é🚀"], ["abcd", "é🚀é🚀"]),
        # dates and times: MySQL rounds the fraction it drops, MariaDB cuts it
        ("DATETIME(6)", "DATETIME", [dt.datetime(2024, 2, 29, 12, 34, 56, 500000), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
         [dt.datetime(2024, 2, 29, 12, 34, 56), dt.datetime(9999, 12, 31, 23, 59, 59)], [dt.datetime(2024, 2, 29, 12, 34, 57), None]),
        ("DATETIME(6)", "TIME", [dt.datetime(9999, 12, 31, 23, 59, 59, 999999)], ["23:59:59"], ["24:00:00"]),
        ("DATETIME(6)", "BIGINT", [dt.datetime(2024, 2, 29, 12, 34, 56, 500000), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
         [20240229123456, 99991231235959], [20240229123457, 99991231000000]),
        ("DATE", "YEAR", [dt.date(2024, 2, 29), dt.date(1000, 1, 1)], [2024, 0], [0, 0]),
        ("TIME(6)", "DATETIME", ["-00:00:01.250000", "23:59:59.999999"],
         [dt.datetime(2026, 11, 27, 23, 59, 58), dt.datetime(2026, 11, 28, 23, 59, 59)],
         [dt.datetime(2026, 11, 27, 23, 59, 59), dt.datetime(2026, 11, 29)]),
        ("TIME(6)", "TIME(2)", ["838:59:59.999999"], ["838:59:59.99"], ["838:59:59.00"]),
        ("DATE", "TIMESTAMP NULL", [dt.date(1970, 1, 1), dt.date(2024, 2, 29)],
         [None, dt.datetime(2024, 2, 29, tzinfo=dt.UTC)], [None, dt.datetime(2024, 2, 29, tzinfo=dt.UTC)]),
        # numbers and texts to dates and times
        ("INT", "DATE", [127, 20240229, 0], [dt.date(2000, 1, 27), dt.date(2024, 2, 29), None], [None, dt.date(2024, 2, 29), None]),
        ("INT", "TIME", [2147483647, 20240229, -2147483648, 70], ["00:00:00", "00:00:00", "-838:59:59", "00:00:00"],
         ["838:59:59", "838:59:59", "-838:59:59", "00:00:00"]),
        ("VARCHAR(26)", "DATETIME", ["2024-2-9 1:2:3", "240229", "2024/02/29 12:34:56.789", "2024-02-30", "12"],
         [dt.datetime(2024, 2, 9, 1, 2, 3), dt.datetime(2024, 2, 29), dt.datetime(2024, 2, 29, 12, 34, 56), None, None],
         [dt.datetime(2024, 2, 9, 1, 2, 3), dt.datetime(2024, 2, 29), dt.datetime(2024, 2, 29, 12, 34, 57), None, None]),
        ("VARCHAR(26)", "TIME", ["-3.5", "1 12:30:45", "12:30", "1e3", "2024-02-29", "2024-02-29T12:34:56"],
         ["-00:00:03", "36:30:45", "12:30:00", "00:00:00", "00:20:24", "12:34:56"],
         ["-00:00:04", "36:30:45", "12:30:00", "00:00:00", "00:20:24", "00:20:24"]),
        # JSON: MySQL prints a text it parses its own way; MariaDB keeps the text
        ("VARCHAR(40)", "JSON", ['{"b":1,"a":[1,2.50]}', " 42 ", "1e3", "18446744073709551616"],
         ['{"b":1,"a":[1,2.50]}', " 42 ", "1e3", "18446744073709551616"],
         ['{"a": [1, 2.5], "b": 1}', "42", "1000.0", "1.8446744073709552e19"]),
        ("JSON", "INT", ["1.5", "true", '"2024-02-29"'], [1, 0, 0], [2, 0, 0]),
        ("JSON", "BIT(64)", ["1.5", "true", '"2024-02-29"'], [1, 0, 0], [2, 1, 2024]),
    ],
)
def test_each_server_converts_its_own_way(old: str, new: str, values: list, mariadb: list, mysql: list) -> None:
    assert _converted(old, new, values, MARIADB) == mariadb
    assert _converted(old, new, values, MYSQL) == mysql


def test_a_table_maps_enum_members_start_with_the_error_value() -> None:
    """The binlog's table map lists an ENUM's members after the empty error value, a DDL's do not: both convert."""
    mapped = ColumnSpec("c", "enum", charset="utf8", members=("", "b2c", "b2b"))
    for old in (mapped, _spec("ENUM('b2c','b2b')")):
        assert Conversion(old, _spec("INT"), MARIADB, TODAY).values(["b2b", ""]) == [2, 0]


def test_what_the_lakehouse_cannot_know_is_inexact() -> None:
    """A zero date is NULL in the lakehouse, like NULL itself, and only a temporal column keeps them alike; a BIT's
    width (its bytes in a BLOB) is not in the binlog's table map."""
    with pytest.raises(InexactConversion, match="zero date"):
        _converted("DATETIME", "VARCHAR(30)", [dt.datetime(2024, 2, 29), None], MARIADB)
    assert _converted("DATETIME", "DATE", [None], MYSQL) == [None]
    with pytest.raises(InexactConversion, match="width"):
        Conversion(ColumnSpec("c", "bit"), _spec("BLOB"), MYSQL, TODAY).values([1])


def test_doubles_print_as_the_server_prints_them() -> None:
    assert [my_gcvt(v, single=False) for v in (0.0, 123456.789, 1.7976931348623157e308, -2.2250738585072014e-308)] == [
        "0", "123456.789", "1.7976931348623157e308", "-2.2250738585072014e-308"
    ]  # fmt: skip
    assert my_gcvt(1.1754900067970481e-38, single=True) == "1.17549e-38"


def test_convert_column_keeps_arrow_speed_where_nothing_changes_and_a_policy_gets_canonical_texts() -> None:
    """A widening is a plain cast; a column policy's alter makes each value the text its policy polices."""
    ints = pa.array([1, None, -5], pa.int16())
    assert convert_column(ints, _spec("SMALLINT"), _spec("BIGINT")).type == pa.int64()
    moments = pa.array([dt.datetime(2024, 2, 29, 12, 0, 0, 500000)], pa.timestamp("us"))
    policed = ColumnSpec("c", "varchar", charset="utf8mb4")
    assert convert_column(moments, _spec("DATETIME(6)"), policed, by_policy=True).to_pylist() == ["2024-02-29 12:00:00.500000"]
    assert convert_column(moments, _spec("DATETIME(6)"), policed, MYSQL).to_pylist() == ["2024-02-29 12:00:00.500000"]


def test_a_column_renamed_in_case_alone_takes_its_new_name_in_the_change_log() -> None:
    """Delta's column names are case-insensitive: the change log's column is renamed (its files rewritten) rather
    than kept under the name it first had."""
    log = pa.schema([("id", pa.int32()), ("CUSTOMER_TYPE", pa.string())])
    incoming = pa.schema([("id", pa.int32()), ("customer_type", pa.int32())])
    assert conformed_schema(log, incoming) == pa.schema([("id", pa.int32()), ("customer_type", pa.string())])
    assert conformed_schema(log, log) is None
    assert unified_schema([log, incoming]).names == ["id", "customer_type"]
