"""The binlog reader against python-mysql-replication, on the same binlog of every column type: the same
column specs, keys and canonical texts for every row image (before- and after-images, NULLs, edges), on MariaDB and
on MySQL. MySQL's binary JSON values are left out of the comparison: python-mysql-replication decodes some of them
wrongly, and the JSON reader has tests of its own."""

from __future__ import annotations

import pymysql
import pytest

from cdc_assets.capture.binlog import events
from cdc_assets.capture.binlog.protocol import dump_events
from cdc_assets.capture.binlog.row_images import RowDecoder
from cdc_assets.capture.binlog.table_map import parse_table_map
from cdc_assets.core import mysql_charsets
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.local_source.server import LocalServer
from cdc_assets.source.server import ServerCharsets, binlog_end
from cdc_assets_tests.pmr_reference import reference_events
from cdc_assets_tests.test_type_edges import EDGE_TABLE, ROWS

MORE_TYPES = """
CREATE TABLE more_types (
  a SMALLINT, b MEDIUMINT, c TIME(1), d TIME(2), e TIME(4), f TIME(5), g DATETIME(1), h DATETIME(4),
  i TIMESTAMP(3) NULL, j DECIMAL(10,3), k DECIMAL(19,9), l DECIMAL(4,4), m BIT(13), n CHAR(10) CHARACTER SET ascii,
  o ENUM('a','b') CHARACTER SET latin1, s SET('a','b','c','d','e','f','g','h','i','j'), p VARCHAR(300),
  q MEDIUMTEXT, r LONGBLOB, u CHAR(3) CHARACTER SET utf8mb4, v VARCHAR(5) CHARACTER SET cp1251,
  PRIMARY KEY (a, b)
)
"""
MORE_ROWS = [
    "(-5, -8388608, '-01:00:00.5', '-00:00:00.01', '-10:00:00.1234', '12:34:56.12345', '2020-01-01 00:00:00.1',"
    " '2020-01-01 00:00:00.1234', '2020-01-01 00:00:00.123', -1234567.891, -1234567890.123456789, -0.1234,"
    " b'1010101010101', 'abc', 'b', 'a,j', REPEAT('x', 300), REPEAT('é', 1000), REPEAT(x'00ff', 40000), '🚀', 'Жук')",
    "(5, 8388607, '01:00:00.5', '00:00:00.01', '10:00:00.1234', '-12:34:56.12345', '2020-01-01 00:00:00.9',"
    " '2020-01-01 00:00:00.9999', NULL, 0.001, 0, 0.9999, b'0', '', 'a', '', '', '', '', '', '')",
]


pytestmark = pytest.mark.both_sources


def _decoded(url: MySQLUrl, start: BinlogPosition, end: BinlogPosition, mariadb: bool) -> list[tuple]:
    found: list[tuple] = []
    decoders: dict[int, RowDecoder] = {}
    conn = pymysql.connect(**url.connection_settings())  # type: ignore[arg-type]
    charsets = ServerCharsets(url)  # the charsets Python has no exact codec for (cp1251 here): as capture sets them
    mysql_charsets.use_server(charsets.table, charsets.value)
    try:
        log_file = start.log_file
        for event in dump_events(conn, 4242, start):
            if event.type == events.ROTATE:
                log_file = events.rotate_target(event.body)[0]
            if log_file != end.log_file or event.log_pos > end.log_pos:
                break
            if event.type == events.TABLE_MAP:
                table_map = parse_table_map(event.body, mariadb=mariadb)
                decoders[table_map.table_id] = RowDecoder(table_map)
                found.append(
                    ("map", table_map.table.schema, table_map.table.table, table_map.columns, table_map.shape.primary_key)
                )
            elif event.type in events.ROW_EVENTS:
                decoder = decoders[int.from_bytes(event.body[:6], "little")]
                post_header = 10 if event.type in events.ROWS_V2 else 8
                befores, afters = decoder.rows(event.type, event.body, post_header)
                found += [(events.ROW_EVENTS[event.type], b, a) for b, a in zip(befores, afters, strict=True)]
    finally:
        conn.close()
        charsets.close()
    return found


def _without_binary_json(found: list[tuple]) -> list[tuple]:
    """The events with MySQL's JSON values left out (a placeholder in their place), judged by each table map."""
    json_columns: list[int] = []
    out = []
    for event in found:
        if event[0] == "map":
            json_columns = [i for i, column in enumerate(event[3]) if column.type == "json"]
            out.append(event)
            continue
        op, before, after = event
        out.append((op, *([v if i not in json_columns else "<json>" for i, v in enumerate(image)] if image else image
                           for image in (before, after))))  # fmt: skip
    return out


def test_every_type_decodes_as_python_mysql_replication_decodes_it(source: LocalServer) -> None:
    mariadb = source.flavour == "mariadb"
    with source.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS decoder_check")
        cur.execute("CREATE DATABASE decoder_check CHARACTER SET utf8mb4")
        cur.execute("USE decoder_check")
        cur.execute("FLUSH BINARY LOGS")  # one file for the whole check
        cur.execute("SET SESSION time_zone = '+05:30'")
        cur.execute("SET NAMES utf8mb4")
        start = binlog_end(conn)
        cur.execute(EDGE_TABLE)
        for row in ROWS:
            cur.execute(f"INSERT INTO edges VALUES {row}".replace("%", "%%"))
        cur.execute("UPDATE edges SET id = id + 10 WHERE id IN (1, 2)")
        cur.execute("UPDATE edges SET tx = 'changed', s = 'x' WHERE id = 4")
        cur.execute("DELETE FROM edges WHERE id = 12")
        cur.execute(MORE_TYPES)
        for row in MORE_ROWS:
            cur.execute(f"INSERT INTO more_types VALUES {row}")
        cur.execute("UPDATE more_types SET q = 'z', s = 'c,d'")
        cur.execute("DELETE FROM more_types WHERE a = 5")
        cur.execute("CREATE TABLE keyless (x INT, y VARCHAR(3))")
        cur.execute("INSERT INTO keyless VALUES (1, 'a'), (1, 'a'), (NULL, NULL)")
        cur.execute("DELETE FROM keyless WHERE x IS NULL")
        end = binlog_end(conn)
    url = MySQLUrl.parse(source.reader_url())

    ours = _decoded(url, start, end, mariadb)
    theirs = reference_events(url, 4243, start, end)
    if not mariadb:
        ours, theirs = _without_binary_json(ours), _without_binary_json(theirs)

    assert [e[0] for e in ours].count("map") == 14  # one before each of the 14 row events
    assert len(ours) - 14 == 9 + 5 + 4  # row changes of edges, more_types and keyless
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine == reference
