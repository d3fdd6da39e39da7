"""Reading whole source tables straight from the protocol (real MariaDB), against PyMySQL's own reading."""

from __future__ import annotations

import pyarrow as pa
import pymysql
import pytest

from cdc_assets.source import server as source
from cdc_assets.source.rows import query_chunks, query_columns
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

# Values around each length encoding: 1 byte up to 250, 2 bytes up to 65,535, 3 bytes beyond.
LENGTHS = [0, 1, 250, 251, 252, 65_535, 65_536, 70_000]
LONG_ROW = 17 * 1024 * 1024  # past one packet's 16 MB: the row comes in two packets


def _rows_by_pymysql(cdc: CdcEnv, sql: str) -> list[tuple]:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(v if v is None or isinstance(v, bytes) else str(v).encode() for v in row) for row in cur]


def _rows(columns: list[pa.BinaryArray]) -> list[tuple]:
    return list(zip(*(c.to_pylist() for c in columns), strict=True))


def test_every_length_encoding_nulls_and_a_row_of_two_packets(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE r (id INT PRIMARY KEY, a LONGBLOB, b VARCHAR(10), c INT)")
    for i, length in enumerate(LENGTHS):
        cdc.execute(f"INSERT INTO r VALUES ({i}, REPEAT('x', {length}), {'NULL' if i % 2 else repr(str(i))}, {i})")
    cdc.execute("INSERT INTO r VALUES (100, NULL, NULL, NULL)")
    with cdc.server.admin_connection() as admin, admin.cursor() as cur:
        cur.execute("SET GLOBAL max_allowed_packet = 64 * 1024 * 1024")  # new connections may carry the long row
    cdc.execute(f"INSERT INTO r VALUES (200, REPEAT('y', {LONG_ROW}), 'long', 7)")
    sql = f"SELECT id, a, b, c FROM `{cdc.database}`.r ORDER BY id"
    expected = _rows_by_pymysql(cdc, sql)
    assert len(expected[-1][1]) == LONG_ROW and expected[-2] == (b"100", None, None, None)

    conn = source.connect(source.MySQLUrl.parse(cdc.server.reader_url()))
    try:
        assert _rows(query_columns(conn, sql)) == expected
        chunks = list(query_chunks(conn, sql, rows_per_chunk=3))
        assert [len(c[0]) for c in chunks] == [3, 3, 3, 1]
        assert [row for chunk in chunks for row in _rows(chunk)] == expected
        with conn.cursor() as cur:  # the connection is free again
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_an_empty_result_is_one_empty_chunk(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE e (id INT PRIMARY KEY, v TEXT)")
    conn = source.connect(source.MySQLUrl.parse(cdc.server.reader_url()))
    try:
        chunks = list(query_chunks(conn, f"SELECT id, v FROM `{cdc.database}`.e", rows_per_chunk=10))
        assert [[len(c) for c in chunk] for chunk in chunks] == [[0, 0]]
    finally:
        conn.close()


def test_an_error_after_the_first_rows_is_raised(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE n (id INT PRIMARY KEY)", "INSERT INTO n SELECT seq FROM " + cdc.numbers(100000))
    conn = source.connect(source.MySQLUrl.parse(cdc.server.reader_url()))
    try:  # the subquery returns two rows only for the last id: the server has sent the others by then
        db = cdc.database
        two = "(SELECT 1 AS seq UNION ALL SELECT 2) AS two"
        sql = f"SELECT id, (SELECT seq FROM {two} WHERE seq < IF(n.id = 100000, 3, 2)) FROM `{db}`.n"
        seen = []
        with pytest.raises(pymysql.err.MySQLError) as raised:
            for chunk in query_chunks(conn, sql + " ORDER BY id", rows_per_chunk=1000):
                seen.append(len(chunk[0]))
        assert raised.value.args[0] == 1242  # Subquery returns more than 1 row
        assert sum(seen) >= 1000
        with conn.cursor() as cur:  # the connection is free again
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        conn.close()


def test_a_payload_of_several_packets_is_joined_in_place() -> None:
    """A row or binlog event of 16 MB or more comes in several packets; they are joined as they arrive, in one
    buffer grown in place (joining the parts at the end held them and the whole at once: twice the payload)."""
    import io
    import random
    import tracemalloc

    from cdc_assets.source.wire import MAX_PACKET_PAYLOAD, read_payload

    data = random.Random(7).randbytes(40 << 20)
    packets, rest = [], data
    while True:
        part, rest = rest[:MAX_PACKET_PAYLOAD], rest[MAX_PACKET_PAYLOAD:]
        packets.append(len(part).to_bytes(3, "little") + b"\0" + part)
        if len(part) < MAX_PACKET_PAYLOAD:
            break
    stream = io.BytesIO(b"".join(packets))
    del packets
    tracemalloc.start()
    try:
        payload = read_payload(stream.read)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert payload == data
    assert peak < 1.6 * len(data), f"a {len(data) >> 20} MB payload took {peak >> 20} MB to read"
