"""verify's comparison, without a server."""

import pyarrow as pa

from cdc_assets.core.names import TableRef
from cdc_assets.verification.compare import compare_tables

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
    from cdc_assets.stages.changes import process_new_batches
    from cdc_assets.stages.current import apply_pending
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
