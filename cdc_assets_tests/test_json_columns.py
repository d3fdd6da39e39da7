"""JSON columns through `sync`: every current-state document equals the source's own text of it (docs/lakehouse.md: Types (MySQL → Delta):
the document as the server prints it, MySQL's opaque values included, PARTIAL_JSON updates applied).

Each sync must succeed (its checks compare current state with the source) and `verify` must find every table
equal; the tests also read both sides themselves, the source through the text protocol as the verification
does, so a document that differs is shown as it is."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.local_source import server as local_server
from cdc_assets.source.rows import query_columns
from cdc_assets.source.server import binlog_end
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

on_mysql = pytest.mark.parametrize("source", [local_server.MYSQL], indirect=True)


def _source_documents(cdc: CdcEnv, table: str, columns: str) -> dict[int, tuple[str | None, ...]]:
    with cdc.admin() as conn:
        raw = query_columns(conn, f"SELECT id, {columns} FROM `{table}`")
    rows = zip(*(c.cast("string").to_pylist() for c in raw), strict=True)
    return {int(row[0]): tuple(row[1:]) for row in rows}


def _lakehouse_documents(cdc: CdcEnv, table: str, columns: str) -> dict[int, tuple[str | None, ...]]:
    names = ["id", *(c.strip() for c in columns.split(","))]
    current = read_current(cdc.lakehouse, TableRef(cdc.database, table), names)
    assert current is not None, f"no current state of {table}"
    return {row["id"]: tuple(row[n] for n in names[1:]) for row in current.to_pylist()}


def _synced(cdc: CdcEnv) -> None:
    """One `sync`, which must succeed: capture, apply and the checks that compare current state with the source."""
    assert cdc.sync() == 0


def _assert_lakehouse_equals_source(cdc: CdcEnv, table: str, columns: str = "j") -> None:
    source = _source_documents(cdc, table, columns)
    assert source, f"the source's {table} is empty: nothing would be compared"
    assert _lakehouse_documents(cdc, table, columns) == source
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    assert [str(r.table) for r in results] == [f"{cdc.database}.{table}"]


@pytest.mark.both_sources
def test_json_documents_land_as_the_source_prints_them(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE docs (id INT PRIMARY KEY, j JSON, k JSON)")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO docs VALUES (%s, %s, %s)",
            [
                (1, '"abc"', "[]"),  # a string at the top stays a JSON string
                (2, '{"b": 1, "a": [1, 2.5, "é🚀"], "c": null, "aa": {"z": true}}', "{}"),
                (3, "1e308", "-0.0"),
                (4, '[1.0, 100000000000000000000, -9223372036854775808, 18446744073709551615, 0.1]', None),
                (5, '{"esc": "tab\\t\\u0001 \\"quoted\\" back\\\\slash \\u2028 \\ud83d\\ude80"}', "false"),
                (6, '  {"spaced" :  [1 ,2] }  ', "null"),
                (7, None, '"x"'),
            ],
        )
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.added', 'later') WHERE id = 2")
        cur.execute("UPDATE docs SET k = '[1, 2, 3]' WHERE id = 4")
        cur.execute("DELETE FROM docs WHERE id = 7")
    _synced(cdc)
    _assert_lakehouse_equals_source(cdc, "docs", "j, k")


# The values (every sync exited 1, or stopped capture for good): MySQL's own SQL.
MYSQL_VALUES = [
    (1, "CAST('\"abc\"' AS JSON)"),
    (2, "CAST(CAST('-12:30:00' AS TIME) AS JSON)"),
    (3, "JSON_OBJECT('d', CAST('2024-01-02' AS DATE), 'dt', CAST('2024-01-02 03:04:05.5' AS DATETIME(2)))"),
    (4, "JSON_ARRAY(CAST(12345678901234567890.123 AS DECIMAL(23,3)), CAST(1.50 AS DECIMAL(5,2)))"),
    (5, "CAST(x'00ff10' AS JSON)"),
    (6, "JSON_ARRAY(1e308, 1e15, 0.00001e0, 1.0e0)"),
    (7, "JSON_OBJECT('elapsed', TIMEDIFF('2024-01-03', '2024-01-01'))"),  # 48 h: python-mysql-replication fails
    (8, "JSON_OBJECT('big', REPEAT('z', 70000))"),
]


@on_mysql
def test_mysql_values_inside_json_land_exactly(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE docs (id INT PRIMARY KEY, j JSON, n INT)")
    cdc.execute(*(f"INSERT INTO docs VALUES ({i}, {sql}, 0)" for i, sql in MYSQL_VALUES))
    # older rows hold an empty value in a JSON column added NOT NULL, which the server prints as `null`
    cdc.execute("ALTER TABLE docs ADD COLUMN k JSON NOT NULL", "UPDATE docs SET n = 1")
    cdc.execute("UPDATE docs SET j = JSON_ARRAY(j, j) WHERE id = 1")
    _synced(cdc)
    _assert_lakehouse_equals_source(cdc, "docs", "j, k")
    # the checkpoint moved past the 48-hour TIME: later changes land too
    cdc.execute(
        "INSERT INTO docs VALUES (9, JSON_ARRAY(TIMEDIFF('2024-02-01', '2024-01-01 00:00:00.5')), 2, '[]')",
        "UPDATE docs SET j = JSON_OBJECT('was', j) WHERE id = 7",
    )
    _synced(cdc)
    _assert_lakehouse_equals_source(cdc, "docs", "j, k")


@on_mysql
def test_partial_json_updates_are_applied(cdc: CdcEnv) -> None:
    """binlog_row_value_options=PARTIAL_JSON (with binlog_row_image=FULL the server logs a full before-image and
    the changed JSON columns' diffs): JSON_SET, JSON_REPLACE and JSON_REMOVE on nested paths and array cells, two
    columns at once, NULL documents, and whole-document updates in the same transaction."""
    cdc.execute(
        "CREATE TABLE docs (id INT PRIMARY KEY, j JSON, n INT, k JSON)",
        "INSERT INTO docs VALUES"
        " (1, '{\"a\": 1, \"arr\": [1, 2, 3], \"obj\": {\"k\": \"v\", \"n\": [true, null]}}', 1, '[1, {\"x\": 2}]'),"
        " (2, '[\"a\", {\"b\": [1, 2]}, 3.5]', 2, '{\"k\": [1, 2, 3]}'),"
        " (3, NULL, 3, '{\"only\": \"k\"}'),"
        " (4, JSON_OBJECT('big', REPEAT('y', 70000), 'n', 1), 4, NULL)",
    )
    _synced(cdc)
    with cdc.admin() as conn, conn.cursor() as cur:
        before = binlog_end(conn)
        cur.execute("SET SESSION binlog_row_value_options = 'PARTIAL_JSON'")
        cur.execute("BEGIN")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.a', 5, '$.new', 'x', '$.obj.n[1]', 'was null') WHERE id = 1")
        cur.execute("UPDATE docs SET j = JSON_REPLACE(j, '$[1].b[0]', JSON_OBJECT('deep', 1)), k = JSON_REMOVE(k, '$.k[0]') WHERE id = 2")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.arr[7]', 'appended', '$.\"key with space\"', CAST('2024-01-02' AS DATE)) WHERE id = 1")
        cur.execute("UPDATE docs SET j = '{\"whole\": [1, 2]}' WHERE id = 2")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.whole[last]', 20) WHERE id = 2")
        cur.execute("UPDATE docs SET k = JSON_SET(k, '$.elapsed', TIMEDIFF('2024-01-03', '2024-01-01')) WHERE id = 3")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.n', CAST(1.50 AS DECIMAL(5,2))), k = JSON_ARRAY() WHERE id = 4")
        cur.execute("COMMIT")
        cur.execute("UPDATE docs SET j = JSON_REMOVE(j, '$.arr[0]', '$.obj.k'), n = n + 1 WHERE id = 1")
        cur.execute(f"SHOW BINLOG EVENTS IN '{before.log_file}' FROM {before.log_pos}")
        assert "Update_rows_partial" in {row[2] for row in cur.fetchall()}  # the updates were logged as diffs
    _synced(cdc)
    _assert_lakehouse_equals_source(cdc, "docs", "j, k")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION binlog_row_value_options = 'PARTIAL_JSON'")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.from', 'null') WHERE id = 3")  # a NULL document stays NULL
        cur.execute("UPDATE docs SET j = JSON_OBJECT('from', 'null') WHERE id = 3")
        cur.execute("UPDATE docs SET j = JSON_REPLACE(j, '$.from', 'a document') WHERE id = 3")
        cur.execute("UPDATE docs SET j = JSON_SET(j, '$.big', 'small again') WHERE id = 4")
    _synced(cdc)
    _assert_lakehouse_equals_source(cdc, "docs", "j, k")


@on_mysql
def test_a_source_set_to_log_partial_json_is_read(cdc: CdcEnv) -> None:
    """binlog_row_value_options=PARTIAL_JSON in the server's configuration (the preflight refused it): sessions
    log partial updates without asking, and `sync` takes them in."""
    cdc.execute("CREATE TABLE docs (id INT PRIMARY KEY, j JSON)", "INSERT INTO docs VALUES (1, '{\"a\": [1, 2]}')")
    cdc.execute("SET GLOBAL binlog_row_value_options = 'PARTIAL_JSON'")
    try:
        cdc.execute("UPDATE docs SET j = JSON_SET(j, '$.a[1]', 'two', '$.b', 3) WHERE id = 1")  # a new session
        _synced(cdc)
    finally:
        cdc.execute("SET GLOBAL binlog_row_value_options = ''")
    _assert_lakehouse_equals_source(cdc, "docs")
    assert _lakehouse_documents(cdc, "docs", "j") == {1: ('{"a": [1, "two"], "b": 3}',)}
