"""Every type of docs/lakehouse.md's type table (Types (MySQL → Delta)) at its edges, through the binlog, compared with the source row for row."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

EDGE_TABLE = """
CREATE TABLE edges (
  id INT PRIMARY KEY,
  u64 BIGINT UNSIGNED, i64 BIGINT, u32 INT UNSIGNED, i8 TINYINT, u8 TINYINT UNSIGNED, m24 MEDIUMINT UNSIGNED,
  d38 DECIMAL(38,10), d65 DECIMAL(65,30), d5 DECIMAL(5,0),
  f FLOAT, g DOUBLE,
  b1 BIT(1), b64 BIT(64), flag BOOL,
  t0 TIME, t6 TIME(6), t3 TIME(3),
  dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6),
  ts0 TIMESTAMP NULL DEFAULT NULL, ts6 TIMESTAMP(6) NULL DEFAULT NULL,
  d DATE, y YEAR,
  e ENUM('a','b','c 🚀'), s SET('x','y','z'),
  j JSON,
  bl BLOB, tx TEXT, vb VARBINARY(10), bn BINARY(4),
  l1 VARCHAR(20) CHARACTER SET latin1, bin_text VARCHAR(10) CHARACTER SET binary,
  emoji VARCHAR(20) CHARACTER SET utf8mb4,
  geo GEOMETRY
)
"""

ROWS = [
    # maxima
    "(1, 18446744073709551615, 9223372036854775807, 4294967295, 127, 255, 16777215,"
    " 9999999999999999999999999999.9999999999, 99999999999999999999999999999999999.999999999999999999999999999999, 99999,"
    " 3.40282e38, 1.7976931348623157e308, b'1', b'1111111111111111111111111111111111111111111111111111111111111111', TRUE,"
    " '838:59:59', '838:59:59.000000', '-838:59:59.000',"
    " '9999-12-31 23:59:59', '9999-12-31 23:59:59.999', '9999-12-31 23:59:59.999999',"
    " '2038-01-19 08:44:07', '2038-01-19 08:44:07.999999', '9999-12-31', 2155,"
    " 'c 🚀', 'x,y,z', '{\"a\": [1, 2.5, \"é\"], \"b\": null}',"
    " x'00FF00', 'text é 🚀', x'0001', x'DEADBEEF', 'caf\xe9 na\xefve', x'00ff', '🚀🙂', ST_GeomFromText('POINT(1 2)'))",
    # minima and negatives
    "(2, 0, -9223372036854775808, 0, -128, 0, 0,"
    " -9999999999999999999999999999.9999999999, -99999999999999999999999999999999999.999999999999999999999999999999, -99999,"
    " -3.40282e38, -1.7976931348623157e308, b'0', b'0', FALSE,"
    " '-838:59:59', '-00:00:00.000001', '00:00:00.500',"
    " '1000-01-01 00:00:00', '1000-01-01 00:00:00.001', '1000-01-01 00:00:00.000001',"
    " '1970-01-01 05:30:01', '1970-01-01 05:30:01.000001', '1000-01-01', 1901,"
    " 'a', '', '[]',"
    " '', '', '', x'00000000', '', '', '', ST_GeomFromText('LINESTRING(0 0, 1 1)'))",
    # NULL everywhere
    "(3" + ", NULL" * 35 + ")",
    # small floats and odd values
    "(4, 1, 0, 1, 0, 1, 1, 0.0000000001, 0.000000000000000000000000000001, 0,"
    " 1.17549e-38, 2.2250738585072014e-308, b'1', b'1000000000000000000000000000000000000000000000000000000000000000', 1,"
    " '-12:30:00', '12:30:00.123456', '-00:00:01.001',"
    " '2024-02-29 12:00:00', '2024-02-29 12:00:00.5', '2024-02-29 12:00:00.000001',"
    " '2024-06-30 23:59:59', '2024-06-30 23:59:59.5', '2024-02-29', 0,"
    " 'b', 'y', '\"just a string\"',"
    " x'00', 'NULL', x'', x'20202020', 'ÿ', x'ff', 'a', ST_GeomFromText('POLYGON((0 0, 1 0, 1 1, 0 0))'))",
    # latin1 bytes that cp1252 leaves undefined (MariaDB's latin1 maps them to U+0081 and so on)
    "(5" + ", NULL" * 31 + ", x'41818D8F909D5A', NULL, NULL, NULL)",
]


def test_every_type_at_its_edges_matches_the_source(cdc: CdcEnv) -> None:
    cdc.execute("SET SESSION time_zone = '+05:30'", EDGE_TABLE)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+05:30'")
        cur.execute("SET NAMES utf8mb4")
        for row in ROWS:
            cur.execute(f"INSERT INTO edges VALUES {row}".replace("%", "%%"))
        # updates touch every column, so before- and after-images both carry edge values
        cur.execute("UPDATE edges SET id = id + 10 WHERE id IN (1, 2)")
        cur.execute("UPDATE edges SET tx = 'changed', s = 'x' WHERE id = 4")
        cur.execute("DELETE FROM edges WHERE id = 12")
        cur.execute(f"INSERT INTO edges VALUES {ROWS[1]}".replace("%", "%%"))
    synced = cdc.sync()
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    assert synced == 0
    assert [(str(r.table), r.compared_rows) for r in results] == [(f"{cdc.database}.edges", 5)]
    # GEOMETRY is plain WKB, as ST_AsBinary gives it
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, ST_AsBinary(geo) FROM edges WHERE geo IS NOT NULL ORDER BY id")
        wkb = dict(cur.fetchall())
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "edges"), ["id", "geo"]).to_pylist()
    assert {r["id"]: r["geo"] for r in current if r["geo"] is not None} == wkb


def test_zero_dates_where_the_server_allows_them(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE z (id INT PRIMARY KEY, d DATE, dt DATETIME(6), ts TIMESTAMP NULL DEFAULT NULL)")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(
            "INSERT INTO z VALUES (1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00'),"
            " (2, '2024-00-00', '2024-02-00 10:00:00.5', NULL), (3, '2024-01-01', '2024-01-01 00:00:00', NOW())"
        )
    synced = cdc.sync()
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    assert synced == 0


def test_edge_values_survive_schema_changes(cdc: CdcEnv) -> None:
    """The edge rows, then ALTERs that widen, re-time, rename, drop and add columns of many types."""
    cdc.execute(EDGE_TABLE)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+05:30'")  # as the rows were written for
        cur.execute("SET NAMES utf8mb4")
        for row in ROWS:
            cur.execute(f"INSERT INTO edges VALUES {row}".replace("%", "%%"))
    assert cdc.sync() == 0
    # MySQL rounds a fraction it shortens, MariaDB cuts it: the lakehouse follows each. 9999-12-31 23:59:59.999999
    # overflows DATETIME(1) on MySQL, which strict mode refuses; without it the value is a zero date (NULL here).
    _alter_edges(cdc, "SET SESSION sql_mode = ''" if cdc.server.flavour == "mysql" else "DO 0")
    synced = cdc.sync()
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    assert synced == 0
    assert [(str(r.table), r.compared_rows) for r in results] == [(f"{cdc.database}.edges", len(ROWS) + 1)]


def _alter_edges(cdc: CdcEnv, sql_mode: str) -> None:
    cdc.execute(
        sql_mode,
        "ALTER TABLE edges MODIFY i8 BIGINT, MODIFY u32 BIGINT UNSIGNED, MODIFY d5 DECIMAL(20,2), "
        "MODIFY f DOUBLE, MODIFY t6 TIME(2), MODIFY t0 TIME(3), MODIFY dt6 DATETIME(1), MODIFY ts0 TIMESTAMP(6) NULL, "
        "MODIFY l1 VARCHAR(40) CHARACTER SET latin1, MODIFY e ENUM('a','b','c 🚀','d'), "
        "RENAME COLUMN emoji TO smile, DROP COLUMN geo, DROP COLUMN d65, "
        "ADD COLUMN extra SET('p','q') NOT NULL DEFAULT 'q' AFTER id, ADD COLUMN big DECIMAL(38,10) DEFAULT -0.5",
        "UPDATE edges SET e = 'd', smile = '🚀🚀' WHERE id = 2",
        "INSERT INTO edges (id, extra, i8, smile) VALUES (99, 'p', -9223372036854775808, 'new')",
    )
