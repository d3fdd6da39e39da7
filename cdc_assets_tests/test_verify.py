"""verify's comparison, without a server."""

import pyarrow as pa
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.verification.compare import compare_tables

pytestmark = pytest.mark.both_sources

T = TableRef("s", "t")


def test_compare_finds_missing_extra_and_different_rows() -> None:
    source = pa.table({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    lake = pa.table({"k": [1, 2, 4], "v": ["a", "B", "d"]})
    diff = compare_tables(T, source, lake, ["k"])
    assert (diff.missing, diff.extra, diff.different) == ([(3,)], [(4,)], [(2,)])
    assert not diff.ok
    assert "1 missing: 3" in diff.describe()


def test_tables_without_a_key_compare_duplicates() -> None:
    source = pa.table({"v": ["a", "a", "b"]})
    assert compare_tables(T, source, pa.table({"v": ["a", "b", "a"]}), []).ok
    assert not compare_tables(T, source, pa.table({"v": ["a", "b"]}), []).ok


def test_verify_consistent_reports_every_table_at_one_point(cdc, spark) -> None:
    from cdc_assets.capture.run import capture
    from cdc_assets.defs.resources import BinlogResource
    from cdc_assets.stages.changes.run import process_new_batches
    from cdc_assets.stages.current.run import apply_pending
    from cdc_assets.verification.consistency import verify_tables
    from cdc_assets_tests.conftest import on_spark

    cdc.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE b (v VARCHAR(5))",
        "INSERT INTO a VALUES (1, 1), (2, 2), (3, 3)",
        "INSERT INTO b VALUES ('x'), ('y')",
    )
    binlog = BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{cdc.database}.*")
    capture(binlog.settings(), cdc.lakehouse)
    process_new_batches(cdc.lakehouse, on_spark(lambda: spark))
    apply_pending(cdc.lakehouse, on_spark(lambda: spark))
    cdc.execute("UPDATE a SET v = 20 WHERE id = 2", "INSERT INTO b VALUES ('z')")  # busy: not captured yet

    results = verify_tables(binlog.settings(), cdc.lakehouse, None)
    assert [str(r.table) for r in results] == [f"{cdc.database}.a", f"{cdc.database}.b"]
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert len({r.position for r in results}) == 1  # one snapshot for all tables
    assert [(r.compared_rows, r.in_flight_keys) for r in results] == [(2, 1), (2, 1)]
    only_a = verify_tables(binlog.settings(), cdc.lakehouse, [f"{cdc.database}.a"])
    assert [r.describe().split(":")[0] for r in only_a] == [f"{cdc.database}.a"]


def test_a_dropped_table_is_reported_dropped_not_in_flight(cdc) -> None:
    """Once its DROP is applied, a dropped table is not a DDL in flight: `verify` says it is gone on both sides
    (it once kept saying "not compared: a ddl of the table is in flight" for ever)."""
    from cdc_assets.defs.resources import BinlogResource
    from cdc_assets.verification.consistency import verify_tables
    from cdc_assets_tests.conftest import run_cli

    cdc.execute(
        "CREATE TABLE keep (id INT PRIMARY KEY)",
        "CREATE TABLE gone (id INT PRIMARY KEY)",
        "INSERT INTO keep VALUES (1)",
        "INSERT INTO gone VALUES (1), (2)",
    )
    assert cdc.sync() == 0
    cdc.execute("DROP TABLE gone", "INSERT INTO keep VALUES (2)")
    assert cdc.sync() == 0

    shown = run_cli("verify")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    gone = [line for line in shown.stdout.splitlines() if f"{cdc.database}.gone" in line]
    assert len(gone) == 1 and gone[0].startswith("ok") and "dropped from the source (_cdc_seq " in gone[0], shown.stdout
    assert "in flight" not in shown.stdout

    # created again and written, not yet captured: its one row is in flight, nothing differs and nothing could
    # be compared (not "a ddl of the table is in flight" for ever: the row it is waiting for)
    cdc.execute("CREATE TABLE gone (id INT PRIMARY KEY, v INT)", "INSERT INTO gone VALUES (5, 5)")
    settings = BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{cdc.database}.*").settings()
    again = {str(r.table): r for r in verify_tables(settings, cdc.lakehouse)}
    recreated = again[f"{cdc.database}.gone"]
    assert not recreated.differs and recreated.in_flight_keys == 1, recreated.describe()
    assert "every one of its rows changed" in recreated.describe() and "ddl" not in recreated.describe()
    assert cdc.sync() == 0
    assert all(r.ok and r.compared_rows for r in cdc.verify()), [r.describe() for r in cdc.verify()]
