"""Digests by key range (verification/digests.py): the source and the lakehouse write every value's text alike, so
equal tables have equal digests, and a row changed behind the pipeline's back shows in exactly its range."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CURRENT
from cdc_assets.source import server as source
from cdc_assets.source.rows import source_shapes
from cdc_assets.verification import digests
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

TABLE = """CREATE TABLE d (
  id BIGINT PRIMARY KEY, u BIGINT UNSIGNED, i8 TINYINT, dec38 DECIMAL(38,10), dec65 DECIMAL(65,30), b64 BIT(64),
  flag BOOL, t0 TIME, t6 TIME(6), dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), ts6 TIMESTAMP(6) NULL, da DATE,
  y YEAR, e ENUM('a','c 🚀'), s SET('x','y'), j JSON, bl BLOB, bn BINARY(4), l1 VARCHAR(20) CHARACTER SET latin1,
  emoji VARCHAR(20), geo GEOMETRY
)"""
ROWS = [
    "(1, 18446744073709551615, -128, 9999999999999999999999999999.9999999999, -1.5, b'1111111111111111111111111111111111111111111111111111111111111111',"
    " TRUE, '-838:59:59', '12:30:00.123456', '9999-12-31 23:59:59', '2024-02-29 12:00:00.5', '1000-01-01 00:00:00.000001',"
    " '2038-01-19 03:14:07.999999', '2024-02-29', 2155, 'c 🚀', 'x,y', '{\"a\": [1, 2.5, \"é\"]}', x'00FF00', x'01',"
    " 'caf\\xe9', '🚀🙂', ST_GeomFromText('POINT(1 2)'))",
    "(2" + ", NULL" * 22 + ")",
    "(3, 0, 0, 0, 0, b'0', FALSE, '00:00:00', '-00:00:00.000001', '2024-01-01 00:00:00', '2024-01-01 00:00:00.000', "
    "'2024-01-01 00:00:00.000000', '1970-01-01 00:00:01', '1000-01-01', 0, 'a', '', '\"s\"', x'', x'00000000', '', '', "
    "ST_GeomFromText('LINESTRING(0 0, 1 1)'))",
]


def test_equal_tables_have_equal_digests_and_a_drifted_row_shows_in_its_range(cdc: CdcEnv, monkeypatch) -> None:
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 2)
    cdc.execute("SET SESSION time_zone = '+00:00'", TABLE)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET NAMES utf8mb4")
        for row in ROWS:
            cur.execute(f"INSERT INTO d VALUES {row}".replace("%", "%%"))
        cur.execute("INSERT INTO d (id, emoji) SELECT seq + 10, CONCAT('row ', seq) FROM " + cdc.numbers(20))
    assert cdc.sync() == 0
    table = TableRef(cdc.database, "d")
    conn = source.connect(source.MySQLUrl.parse(cdc.server.reader_url()))
    try:
        shape = source_shapes(conn, [table])[table]
        assert shape is not None and digests.digestible(shape)
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        bounds = digests.range_bounds(current, "id")
        assert len(bounds) == 12
        assert digests.source_digests(conn, shape, bounds) == digests.lake_digests(current, shape, bounds)
        current.update(predicate="id = 15", updates={"emoji": "'drifted'"})
        current.delete("id = 3")
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        lake = digests.lake_digests(current, shape, bounds)
        ranges = digests.differing_ranges(digests.source_digests(conn, shape, bounds), lake, bounds)
        assert len(ranges) == 2 and all(low in bounds and high in bounds for low, high in ranges), (ranges, bounds)
        keys = {k for (k,) in digests.keys_in_ranges(conn, current, table, "id", ranges)}
        assert {3, 15} <= keys and len(keys) <= 2 * digests.ROWS_PER_RANGE + 1, keys
    finally:
        conn.close()
