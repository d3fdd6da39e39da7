"""Every type change the server accepts in ALTER TABLE … MODIFY, applied by the lakehouse as the server applied it.

A pure table of the pairs (`SOURCES` × `TARGETS`), one column per pair, each source column's edge values in rows:
the server decides which ALTERs it accepts (each is tried alone on a temporary copy, which the binlog does not
log), the accepted ones run as one ALTER per table, and the lakehouse must then equal the source row for row, in
its current state and in its history's current versions.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cdc_assets.cli import main
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY
from cdc_assets.lake.quarantine import quarantined_tables
from cdc_assets.local_source.server import MARIADB
from cdc_assets.stages.changes.rows import cast_column
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

# -- the matrix --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A source column type and the edge values its column holds, one per row (SQL literals)."""

    sql: str
    values: tuple[str, ...]


_TEXTS = ("NULL", "''", "'12'", "'-3.5'", "' 42 '", "'1e3'", "'abc'", "'é🚀'", "'2024-02-29'", "'12:34:56'",
          "'b2b'", "'x,z'", "'0x1F'", "'9223372036854775808'")  # fmt: skip
_BYTES = ("NULL", "''", "x'00'", "'abc'", "x'FF'", "'12'", "'é🚀'", "'2024-02-29'", "x'00FF00FF00FF'")

SOURCES: dict[str, Source] = {
    "enum": Source("ENUM('b2c','b2b','12','ü🚀','x')", ("NULL", "'b2c'", "'b2b'", "'12'", "'ü🚀'", "'x'", "'nope'")),
    "set": Source("SET('x','y','z','ü🚀')", ("NULL", "''", "'x'", "'x,z'", "'y,z,ü🚀'", "'x,y,z,ü🚀'", "'z'")),
    "i8": Source("TINYINT", ("NULL", "0", "-128", "127", "1", "-1", "12")),
    "u8": Source("TINYINT UNSIGNED", ("NULL", "0", "255", "1", "2", "70", "12")),
    "i16": Source("SMALLINT", ("NULL", "0", "-32768", "32767", "1", "-1", "2024")),
    "u16": Source("SMALLINT UNSIGNED", ("NULL", "0", "65535", "1", "2", "1901", "2155")),
    "i24": Source("MEDIUMINT", ("NULL", "0", "-8388608", "8388607", "1", "-1", "123456")),
    "u24": Source("MEDIUMINT UNSIGNED", ("NULL", "0", "16777215", "1", "2", "235959", "8385959")),
    "i32": Source("INT", ("NULL", "0", "-2147483648", "2147483647", "1", "-1", "20240229")),
    "u32": Source("INT UNSIGNED", ("NULL", "0", "4294967295", "1", "2", "20240229", "99991231")),
    "i64": Source("BIGINT", ("NULL", "0", "-9223372036854775808", "9223372036854775807", "1", "-1",
                             "20240229123456")),  # fmt: skip
    "u64": Source("BIGINT UNSIGNED", ("NULL", "0", "18446744073709551615", "1", "2", "20240229123456",
                                      "9223372036854775808")),  # fmt: skip
    "dec": Source("DECIMAL(10,3)", ("NULL", "0", "-1234567.891", "9999999.999", "0.5", "2.5", "-0.001", "20240229.5")),
    "flt": Source("FLOAT", ("NULL", "0", "-3.40282e38", "1.17549e-38", "0.1", "2.5", "16777217", "-0.5")),
    "dbl": Source("DOUBLE", ("NULL", "0", "1.7976931348623157e308", "-2.2250738585072014e-308", "0.1", "2.5",
                             "1e15", "123456.789")),  # fmt: skip
    "bit": Source("BIT(64)", ("NULL", "b'0'", "b'1'", "65", "b'" + "1" * 64 + "'", "255", "0x3132")),
    "yr": Source("YEAR", ("NULL", "0", "1901", "2155", "2024", "1970", "2000")),
    "chr": Source("CHAR(16)", _TEXTS),
    "vch": Source("VARCHAR(24)", _TEXTS),
    "txt": Source("TEXT", _TEXTS),
    "l1": Source("VARCHAR(12) CHARACTER SET latin1", ("NULL", "''", "'café'", "x'81'", "'naïve 12'", "'ÿ'")),
    # texts the date, time and JSON parsers read
    "dtx": Source("VARCHAR(26)", ("NULL", "'20240229'", "'240229'", "'2024-2-9 1:2:3'", "'2024/02/29 12:34:56.789'",
                                  "'24-02-29'", "'2024-02-30'", "'2024-02-29T12:34:56'", "'20240229123456'",
                                  "'1 12:30:45'", "'12:30'", "'-838:59:59.9999995'", "'123456.789'", "'10:61:00'",
                                  "'2024-02-29 23:59:59.5'", "' 2024-02-29 '", "'99991231235959.9'")),  # fmt: skip
    "jtx": Source("VARCHAR(24)", ("NULL", "'{\"b\":1,\"a\":[1,2.50]}'", "'12'", "' 42 '", "'1e3'", "'-3.5'",
                                  "'\"é🚀\"'", "'null'", "'true'", "'[]'", "'{\"ab\":{\"c\":1,\"b\":2}}'",
                                  "'18446744073709551616'", "'-0.0'")),  # fmt: skip
    "bin": Source("BINARY(6)", _BYTES),
    "vbn": Source("VARBINARY(12)", _BYTES),
    "blb": Source("BLOB", _BYTES),
    "date": Source("DATE", ("'1000-01-01'", "'9999-12-31'", "'2024-02-29'", "'1970-01-01'", "'2000-01-01'")),
    "dtm": Source("DATETIME(6)", ("'1000-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'", "'2024-02-29 12:34:56.5'",
                                  "'2024-02-29 00:00:00'", "'2000-01-01 23:59:59.499999'",
                                  "'2024-02-29 23:59:59.9995'")),  # fmt: skip
    "ts": Source("TIMESTAMP(6) NULL", ("'1970-01-01 00:00:01'", "'2038-01-19 03:14:07.999999'",
                                       "'2024-02-29 12:34:56.5'", "'2000-01-01 00:00:00'",
                                       "'2024-02-29 23:59:59.9995'")),  # fmt: skip
    # zero dates are NULL in the lakehouse: only a temporal column keeps them apart from NULL (a zero date)
    "zd": Source("DATE", ("NULL", "'0000-00-00'", "'2024-00-00'", "'2024-02-29'")),
    "zdt": Source("DATETIME(6)", ("NULL", "'0000-00-00 00:00:00'", "'2024-02-00 10:00:00.5'", "'2024-02-29 12:00:00'")),
    "zts": Source("TIMESTAMP(6) NULL", ("NULL", "'0000-00-00 00:00:00'", "'2024-02-29 12:00:00.25'")),
    "tm": Source("TIME(6)", ("NULL", "'-838:59:59'", "'838:59:59'", "'00:00:00'", "'12:34:56.5'", "'-00:00:01.25'",
                             "'23:59:59.999999'")),  # fmt: skip
    "json": Source("JSON", ("NULL", "'{}'", "'[]'", "'\"abc\"'", "'12'", "'1.5'", "'null'", "'true'",
                            "'{\"a\": [1, \"é🚀\"]}'", "'\"2024-02-29\"'", "'-3'")),  # fmt: skip
}

TARGETS: dict[str, str] = {
    "enum": "ENUM('b2c','b2b','x','abc','é🚀','12')",
    "set": "SET('x','y','z','abc','é🚀')",
    "i8": "TINYINT", "u8": "TINYINT UNSIGNED", "i16": "SMALLINT", "u16": "SMALLINT UNSIGNED",
    "i24": "MEDIUMINT", "u24": "MEDIUMINT UNSIGNED", "i32": "INT", "u32": "INT UNSIGNED",
    "i64": "BIGINT", "u64": "BIGINT UNSIGNED",
    "dec": "DECIMAL(12,2)", "flt": "FLOAT", "dbl": "DOUBLE", "bit": "BIT(64)", "yr": "YEAR",
    "chr": "CHAR(32)", "vch": "VARCHAR(40)", "txt": "TEXT",
    "bin": "BINARY(8)", "vbn": "VARBINARY(40)", "blb": "BLOB",
    "date": "DATE", "dtm": "DATETIME", "ts": "TIMESTAMP NULL", "tm": "TIME",
    "json": "JSON",
    # lengths, precisions and charsets that cut or round
    "v4": "VARCHAR(4)", "l1": "VARCHAR(20) CHARACTER SET latin1", "b8": "BIT(8)", "dw": "DECIMAL(65,4)",
    "dt3": "DATETIME(3)", "tm2": "TIME(2)",
}  # fmt: skip

TEMPORAL = ("date", "dtm", "ts", "dt3")


@dataclass(frozen=True)
class Family:
    """A table of the matrix: one column per pair of its sources and targets, within InnoDB's row size."""

    sources: tuple[str, ...]
    targets: tuple[str, ...] = tuple(TARGETS)


FAMILIES: dict[str, Family] = {
    "m_signed": Family(("i8", "i16", "i24", "i32", "i64")),
    "m_unsigned": Family(("u8", "u16", "u24", "u32", "u64")),
    "m_num": Family(("dec", "flt", "dbl", "yr")),
    "m_bit": Family(("bit",), tuple(t for t in TARGETS if t not in ("txt", "blb"))),
    "m_chr": Family(("chr", "l1", "dtx")),
    "m_text": Family(("vch", "txt")),
    "m_bin": Family(("bin", "vbn", "blb")),
    "m_time": Family(("date", "dtm", "ts", "tm")),
    "m_zero": Family(("zd", "zdt", "zts"), TEMPORAL),
    "m_misc": Family(("enum", "set", "json", "jtx")),
}

# What the lakehouse cannot convert exactly, and quarantines (docs/lakehouse.md, "Schema changes"): a zero date is NULL in the
# lakehouse, and only a date, DATETIME or TIMESTAMP column keeps the two alike; a BIT gives a TEXT or BLOB its bytes,
# as many as its width, which the binlog's table map does not tell.
EXPECTED_QUARANTINES: dict[str, Family] = {
    "m_zero_q": Family(("zd", "zdt", "zts"), tuple(t for t in TARGETS if t not in TEMPORAL)),
    "m_bit_q": Family(("bit",), ("txt", "blb")),
}

PAIRS: list[tuple[str, str]] = sorted({(s, t) for f in FAMILIES.values() for s in f.sources for t in f.targets})


def column(source: str, target: str) -> str:
    return f"{source}_{target}"


def create_statements(table: str, family: Family) -> list[str]:
    """The family's table, one column per pair, and its rows: row i holds each source's edge value i (a source with
    fewer values repeats its last, so no NULL is added to it)."""
    columns = [f"`{column(s, t)}` {SOURCES[s].sql}" for s in family.sources for t in family.targets]
    count = max(len(SOURCES[s].values) for s in family.sources)

    def value(source: str, i: int) -> str:
        values = SOURCES[source].values
        return values[min(i, len(values) - 1)]

    rows = ["(" + ", ".join([str(i)] + [value(s, i) for s in family.sources for _ in family.targets]) + ")"
            for i in range(count)]  # fmt: skip
    return [f"CREATE TABLE {table} (id INT PRIMARY KEY, {', '.join(columns)})", f"INSERT INTO {table} VALUES {', '.join(rows)}"]


STRICT, LOOSE = "DEFAULT", "''"  # the server's default sql_mode (strict), and none


def _server_session(cur: object) -> None:
    cur.execute("SET SESSION time_zone = '+00:00'")  # type: ignore[attr-defined]


def _created(cdc: CdcEnv, families: dict[str, Family]) -> None:
    with cdc.admin() as conn, conn.cursor() as cur:
        _server_session(cur)
        for table, family in families.items():
            create, insert = create_statements(table, family)
            cur.execute(create)
            cur.execute(f"SET SESSION sql_mode = {LOOSE}")  # zero dates and an ENUM's error value
            cur.execute(insert)
            cur.execute(f"SET SESSION sql_mode = {STRICT}")


def _accepted(cdc: CdcEnv, families: dict[str, Family]) -> dict[str, dict[str, str]]:
    """Each table's columns whose ALTER the server accepts, and in which sql_mode: every ALTER is tried alone on a
    temporary copy of the table (no binlog event), first strict, then without a mode for those strict refused."""
    accepted: dict[str, dict[str, str]] = {}
    with cdc.admin() as conn, conn.cursor() as cur:
        _server_session(cur)
        for table, family in families.items():
            cur.execute(f"CREATE TEMPORARY TABLE trial LIKE {table}")
            cur.execute(f"SET SESSION sql_mode = {LOOSE}")
            cur.execute(f"INSERT INTO trial SELECT * FROM {table}")
            modes: dict[str, str] = {}
            for mode in (STRICT, LOOSE):
                cur.execute(f"SET SESSION sql_mode = {mode}")
                for source in family.sources:
                    for target in family.targets:
                        name = column(source, target)
                        if name in modes:
                            continue
                        try:
                            cur.execute(f"ALTER TABLE trial MODIFY `{name}` {TARGETS[target]}")
                            modes[name] = mode
                        except Exception:  # noqa: BLE001 - a refused ALTER changes nothing
                            pass
            cur.execute("DROP TEMPORARY TABLE trial")
            cur.execute(f"SET SESSION sql_mode = {STRICT}")
            accepted[table] = modes
    return accepted


def _altered(cdc: CdcEnv, families: dict[str, Family], accepted: dict[str, dict[str, str]]) -> None:
    """The accepted ALTERs, one statement per table and sql_mode."""
    with cdc.admin() as conn, conn.cursor() as cur:
        _server_session(cur)
        for table in families:
            for mode in (STRICT, LOOSE):
                names = [n for n, m in accepted[table].items() if m == mode]
                if names:
                    cur.execute(f"SET SESSION sql_mode = {mode}")
                    cur.execute(f"ALTER TABLE {table} " + ", ".join(f"MODIFY `{n}` {TARGETS[n.split('_', 1)[1]]}" for n in names))
        cur.execute(f"SET SESSION sql_mode = {STRICT}")


def _differing_columns(cdc: CdcEnv, tables: list[str]) -> dict[str, list[tuple]]:
    """Each column whose values differ between the source and the current state: (id, source, lakehouse) of each
    differing row. Says which conversions went wrong where verify names the keys."""
    from cdc_assets.source.rows import read_source_table, source_shapes

    refs = [TableRef(cdc.database, t) for t in tables]
    differing: dict[str, list[tuple]] = {}
    with cdc.server.admin_connection() as conn:
        conn.cursor().execute("SET SESSION time_zone = '+00:00'")
        shapes = source_shapes(conn, refs)
        for ref in refs:
            shape = shapes[ref]
            assert shape is not None
            source = read_source_table(conn, ref, list(shape.columns)).sort_by("id")
            current = read_current(cdc.lakehouse, ref)
            assert current is not None
            current = current.sort_by("id")
            ids = source.column("id").to_pylist()
            for name in source.column_names:
                want = [repr(v) for v in source.column(name).to_pylist()]  # -0.0 and 0.0, 1.0 and 1.00 apart
                got = [repr(v) for v in current.column(name).to_pylist()] if name in current.column_names else None
                if got != want:
                    differing[f"{ref.table}.{name}"] = [(i, w, g) for i, w, g in zip(ids, want, got or [None] * len(ids), strict=True) if w != g]
    return differing


def _loaded_by_snapshot(cdc: CdcEnv, table: str) -> bool:
    """Whether the table's current rows are a snapshot's (their seq is no insert's of the change log) rather than the
    binlog's (each row's seq is its insert's)."""
    ref = TableRef(cdc.database, table)
    log = open_table(cdc.lakehouse.table_uri(CHANGES, ref), None)
    assert log is not None
    inserts = set(read_query(log, "SELECT _cdc_seq FROM changes WHERE _cdc_op = 'insert'", "changes").column(0).to_pylist())
    current = read_current(cdc.lakehouse, ref, ["_cdc_seq"])
    assert current is not None and current.num_rows
    seqs = set(current.column(0).to_pylist())
    assert seqs <= inserts or not seqs & inserts, table
    return not seqs <= inserts


def _history_follows_current_state(cdc: CdcEnv, table: str) -> int:
    """The history's current versions equal the current-state rows (at the history's column types, which hold a
    changed column's old and new values), row for row; returns how many."""
    ref = TableRef(cdc.database, table)
    history = cdc.lakehouse.open(HISTORY, ref)
    assert history is not None, f"no history for {table}"
    versions = read_query(history, "SELECT * FROM history WHERE _cdc_is_current ORDER BY id", "history")
    current = read_current(cdc.lakehouse, ref)
    assert current is not None
    current = current.sort_by("id")
    names = [n for n in current.column_names if not n.startswith("_cdc_")]
    kept = [n for n in versions.column_names if not n.startswith("_cdc_") and n not in names]  # renamed, dropped
    assert [n for n in versions.column_names if n in names] == names, "the history's columns"
    assert all(versions.column(n).null_count == versions.num_rows for n in kept), kept
    for name in names:
        want = cast_column(current.column(name), versions.schema.field(name).type).to_pylist()
        got = versions.column(name).to_pylist()
        assert got == want, (table, name, [(w, g) for w, g in zip(want, got, strict=True) if w != g])
    return versions.num_rows


# the rows of these tables reach the lakehouse by a snapshot, the others' from the binlog; every ALTER from the binlog
SNAPSHOT_LOADED = ("m_unsigned", "m_bit", "m_chr", "m_bin", "m_zero")


def test_every_alter_the_server_accepts_converts_as_the_server_does(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every source type to every target type, over rows of edge values, one column per pair: the lakehouse equals
    the source row for row after the ALTERs, in its current state and in its history's current versions, whether it
    had the rows from the binlog or from a snapshot. The server decides which pairs it accepts (strict, else with no
    sql_mode); on both servers it refuses only JSON targets of values that are no JSON document. The conversions
    the lakehouse cannot do exactly quarantine their tables alone, with the cause, and a snapshot lifts them."""
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.*")
    tables = {**FAMILIES, **EXPECTED_QUARANTINES}
    _created(cdc, tables)
    assert main(["snapshot", *(f"{cdc.database}.{t}" for t in SNAPSHOT_LOADED)]) == 0
    accepted = _accepted(cdc, tables)
    refused = {(s, t) for table, f in tables.items() for s in f.sources for t in f.targets
               if column(s, t) not in accepted[table]}  # fmt: skip
    assert {t for _, t in refused} <= {"json"}, sorted(refused)
    assert len(PAIRS) - len(refused) > 1000
    _altered(cdc, tables, accepted)
    synced = cdc.sync()

    quarantined = quarantined_tables(cdc.lakehouse.store)
    assert sorted(quarantined) == sorted(f"{cdc.database}.{t}" for t in EXPECTED_QUARANTINES)
    assert "a zero date" in quarantined[f"{cdc.database}.m_zero_q"].cause
    assert "the BIT column's width is not known" in quarantined[f"{cdc.database}.m_bit_q"].cause
    assert all("cdc-lakehouse snapshot" in q.sentence() for q in quarantined.values())
    assert synced == 1  # the quarantined tables' checks fail; every other table went on
    results = {str(r.table).split(".")[1]: r for r in cdc.verify()}
    assert [r.describe() for t, r in results.items() if t in FAMILIES and not r.ok] == [], _differing_columns(cdc, list(FAMILIES))
    assert all(results[t].compared_rows > 0 for t in FAMILIES)
    assert not any(results[t].ok for t in EXPECTED_QUARANTINES)
    assert {t for t in FAMILIES if _loaded_by_snapshot(cdc, t)} == set(SNAPSHOT_LOADED)
    for table in FAMILIES:
        assert _history_follows_current_state(cdc, table) > 0
    assert main(["snapshot", *(f"{cdc.database}.{t}" for t in EXPECTED_QUARANTINES)]) == 0  # the fix each names
    assert all(r.ok for r in cdc.verify()), "after the snapshot"


def _column_names(cdc: CdcEnv, layer: str, table: str) -> list[str]:
    delta = cdc.lakehouse.open(layer, TableRef(cdc.database, table))
    assert delta is not None, f"no {layer} table {table}"
    return [f.name for f in delta.schema().fields if not f.name.startswith("_cdc_")]


@pytest.mark.parametrize("route", ["binlog", "snapshot"])
def test_an_enum_made_an_int_by_a_change_that_renames_it_by_case(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """Debezium's default_value fixture (DBZ-771): `CHANGE customer_type customer_type INT DEFAULT 42` of
    `CUSTOMER_TYPE ENUM('b2c','b2b')` gives each row its member's index and renames the column by case. The
    lakehouse failed the sync (it parsed 'b2b' as an int) and kept `CUSTOMER_TYPE`. Now every layer has the
    source's values under the source's new name, whether the rows came from the binlog or a snapshot; on MariaDB
    the binlog route's ALTER runs on Spark (whose tasks call the same conversion), on MySQL on Arrow. A column
    renamed to another name (`TIER` to `level`, an ENUM made a SMALLINT) follows too: its older rows keep the old
    column in the change log and the history, later ones and current state have the new one."""
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.*")
    table = "DBZ_771_CUSTOMERS"
    cdc.execute(
        f"CREATE TABLE {table} (id INTEGER NOT NULL AUTO_INCREMENT PRIMARY KEY, "
        "CUSTOMER_TYPE ENUM('b2c','b2b') NOT NULL DEFAULT 'b2c', TIER ENUM('gold','silver'))",
        f"INSERT INTO {table} VALUES (DEFAULT, 'b2c', 'silver'), (DEFAULT, 'b2b', NULL)",
    )
    spark = route == "binlog" and cdc.server.flavour == MARIADB
    if route == "snapshot":
        assert main(["snapshot"]) == 0
    else:
        assert cdc.sync() == 0
        if spark:
            monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")
    cdc.execute(
        f"ALTER TABLE {table} CHANGE customer_type customer_type INT DEFAULT 42, CHANGE tier level SMALLINT",
        f"INSERT INTO {table} (id) VALUES (DEFAULT)",
        f"UPDATE {table} SET customer_type = 7, level = -3 WHERE id = 1",
    )
    assert cdc.sync() == 0
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == [] and results[0].compared_rows == 3

    ref = TableRef(cdc.database, table)
    current = read_current(cdc.lakehouse, ref, ["id", "customer_type", "level"])
    assert current is not None
    assert sorted(tuple(r.values()) for r in current.to_pylist()) == [(1, 7, -3), (2, 2, None), (3, 42, None)]
    assert _column_names(cdc, CURRENT, table) == ["id", "customer_type", "level"]
    for layer in (CHANGES, HISTORY):  # the old name's column holds the rows from before the rename
        assert _column_names(cdc, layer, table) == ["id", "customer_type", "TIER", "level"], layer
    log = read_query(cdc.lakehouse.open(CHANGES, ref), "SELECT * FROM changes ORDER BY _cdc_seq", "changes").to_pylist()
    rows = [(r["id"], r["customer_type"], r["TIER"], r["level"]) for r in log if r["_cdc_op"] in ("insert", "update")]
    assert rows == [(1, "b2c", "silver", None), (2, "b2b", None, None), (3, "42", None, None), (1, "7", None, -3)]
    if spark:  # every file of the change log, renamed and retyped, is a Spark task's
        assert all("zstd" in p for p in cdc.lakehouse.open(CHANGES, ref).file_uris())
    assert _history_follows_current_state(cdc, table) == 3
