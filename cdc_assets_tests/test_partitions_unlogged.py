"""Partition maintenance changes rows without row events: a partition truncated, dropped or exchanged with a table.
The lakehouse is never reported equal while it still holds those rows (it used to say `ok … not compared` for
ever), and the sync that captures such a statement repairs the tables it touched: the rows removed or moved are
written as `repair` / `repair_delete` changes, and the tables end equal to the source."""

from __future__ import annotations

import pytest
from dagster import AssetCheckSeverity
from deltalake import DeltaTable

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB, changes_asset_key, table_asset_key
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.repair_marks import owing_repair
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once
from cdc_assets_tests.test_table_checks import _latest_check

pytestmark = pytest.mark.both_sources

PARTITIONED = (
    "CREATE TABLE p (id INT, at DATE, v VARCHAR(10), PRIMARY KEY (id, at)) PARTITION BY RANGE (YEAR(at)) ("
    "PARTITION p2023 VALUES LESS THAN (2024), PARTITION p2024 VALUES LESS THAN (2025), "
    "PARTITION pmax VALUES LESS THAN MAXVALUE)"
)
ROWS = "INSERT INTO p VALUES (1, '2023-05-01', 'a'), (2, '2023-06-01', 'b'), (3, '2024-01-01', 'c'), (4, '2025-02-02', 'd')"


def _ops(cdc: CdcEnv, table: str) -> list[tuple[str, int]]:
    log = DeltaTable(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)))
    rows = read_query(log, "SELECT _cdc_op, id FROM changes WHERE _cdc_op LIKE 'r%' ORDER BY _cdc_seq, id", "changes")
    return [(r["_cdc_op"], r["id"]) for r in rows.to_pylist()]


@pytest.mark.parametrize("statement", ["ALTER TABLE p TRUNCATE PARTITION p2023", "ALTER TABLE p DROP PARTITION p2023"])
def test_a_partition_emptied_is_repaired_by_the_sync_that_captures_it(cdc: CdcEnv, statement: str, capsys) -> None:
    cdc.execute(PARTITIONED, ROWS)
    assert cdc.sync() == 0
    cdc.execute(statement, "INSERT INTO p VALUES (5, '2024-03-03', 'e')")
    assert cdc.sync() == 0
    assert main(["verify"]) == 0
    assert "1 of 1 tables match the source" in capsys.readouterr().out
    assert _ops(cdc, "p") == [("rows_removed", None), ("repair_delete", 1), ("repair_delete", 2)]
    assert owing_repair(cdc.lakehouse.store, [f"{cdc.database}.p"]) == {}
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()
    assert cdc.sync() == 0 and _ops(cdc, "p")[-1] == ("repair_delete", 2)  # repaired once, not at every sync


def test_a_partition_exchanged_with_a_table_repairs_both(cdc: CdcEnv, capsys) -> None:
    cdc.execute(
        PARTITIONED, ROWS, "CREATE TABLE ex (id INT, at DATE, v VARCHAR(10), PRIMARY KEY (id, at))",
        "INSERT INTO ex VALUES (9, '2023-09-09', 'x')",
    )  # fmt: skip
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE p EXCHANGE PARTITION p2023 WITH TABLE ex")
    assert cdc.sync() == 0
    assert main(["verify"]) == 0
    assert "2 of 2 tables match the source" in capsys.readouterr().out
    assert sorted(o for o in _ops(cdc, "p") if o[0].startswith("repair")) == [
        ("repair", 9), ("repair_delete", 1), ("repair_delete", 2)
    ]  # fmt: skip
    assert sorted(o for o in _ops(cdc, "ex") if o[0].startswith("repair")) == [
        ("repair", 1), ("repair", 2), ("repair_delete", 9)
    ]  # fmt: skip


def test_without_the_sync_the_tables_checks_name_repair(cdc: CdcEnv, capsys) -> None:
    """The scheduled apply runs take the statement in without repairing: the table is marked, its check fails naming
    `repair`, verify reports it, and `cdc-lakehouse repair` makes it equal."""
    from cdc_assets.capture.run import capture
    from cdc_assets.defs.resources import initialized_resources

    cdc.execute(PARTITIONED, ROWS)
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE p TRUNCATE PARTITION p2024")
    resources = initialized_resources()
    capture(resources.binlog.settings(), cdc.lakehouse)
    table = f"{cdc.database}.p"
    build_definitions().resolve_job_def(APPLY_JOB).execute_in_process(
        instance=instance(), asset_selection=[changes_asset_key(table), table_asset_key(table)], raise_on_error=False
    )
    check = _latest_check(table, "current_matches_source")
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR, check.description
    assert f"cdc-lakehouse repair {table}" in check.description, check.description
    assert set(owing_repair(cdc.lakehouse.store, [table])) == {table}
    assert main(["verify"]) == 1
    assert "without row events" in capsys.readouterr().out
    assert main(["repair", table]) == 0
    assert main(["verify"]) == 0
    assert owing_repair(cdc.lakehouse.store, [table]) == {}
