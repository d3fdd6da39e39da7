"""Foreign-key cascades: InnoDB's ON DELETE / ON UPDATE CASCADE and SET NULL change child rows that MariaDB and
MySQL before 9.6 never write to the binlog. The sync that captures the parent's change finds the child rows it
reached in the lakehouse and repairs them from the source; on MySQL 9.6+ the cascaded changes are row events of their
own, applied once, never twice. The check after an apply compares the reached child rows too."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB, changes_asset_key, table_asset_key
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.source.server import logs_foreign_key_cascades
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once
from cdc_assets_tests.test_table_checks import _latest_check

pytestmark = pytest.mark.both_sources

SCHEMA = [
    "CREATE TABLE parent (id INT PRIMARY KEY, code VARCHAR(5) NOT NULL UNIQUE)",
    "CREATE TABLE child (id INT PRIMARY KEY, parent_id INT, parent_code VARCHAR(5), note VARCHAR(10),"
    " FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE CASCADE,"
    " FOREIGN KEY (parent_code) REFERENCES parent (code) ON UPDATE CASCADE ON DELETE SET NULL)",
    "CREATE TABLE grandchild (id INT PRIMARY KEY, child_id INT, FOREIGN KEY (child_id) REFERENCES child (id) ON DELETE CASCADE)",
    "CREATE TABLE orphanable (id INT PRIMARY KEY, parent_id INT, FOREIGN KEY (parent_id) REFERENCES parent (id) ON DELETE SET NULL)",
]
ROWS = [
    "INSERT INTO parent VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    "INSERT INTO child VALUES (10, 1, 'a', 'x'), (11, 2, 'b', 'y'), (12, 2, 'c', 'z'), (13, 3, 'c', 'w')",
    "INSERT INTO grandchild VALUES (100, 10), (101, 11), (102, 13)",
    "INSERT INTO orphanable VALUES (7, 2), (8, 3)",
]


def _logs_cascades(cdc: CdcEnv) -> bool:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = cur.fetchone()[0]
    return logs_foreign_key_cascades(cdc.server.flavour, version)


def _ops(cdc: CdcEnv, table: str) -> list[tuple[str, int]]:
    log = DeltaTable(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)))
    rows = read_query(log, "SELECT _cdc_op, id FROM changes WHERE _cdc_op NOT IN ('create') ORDER BY _cdc_seq, id", "changes")
    return [(r["_cdc_op"], r["id"]) for r in rows.to_pylist()]


def test_cascaded_deletes_updates_and_set_nulls_end_equal_and_are_never_applied_twice(cdc: CdcEnv, capsys) -> None:
    cdc.execute(*SCHEMA, *ROWS)
    assert cdc.sync() == 0
    cdc.execute(
        "DELETE FROM parent WHERE id = 2",  # child 11, 12 go (and grandchild 101); orphanable 7 -> NULL; 'b' codes
        "UPDATE parent SET code = 'cc' WHERE id = 3",  # child 12? gone; 13's parent_code -> 'cc'
    )
    assert cdc.sync() == 0
    assert main(["verify"]) == 0
    assert "4 of 4 tables match the source" in capsys.readouterr().out
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()
    if _logs_cascades(cdc):  # MySQL 9.6+: the cascades are row events, and nothing is repaired on top
        assert not [op for op in _ops(cdc, "child") if op[0].startswith("repair")]
        assert ("delete", 11) in _ops(cdc, "child") and ("update", 13) in _ops(cdc, "child")
    else:  # derived from the lakehouse's rows and repaired from the source
        assert sorted(op for op in _ops(cdc, "child") if op[0].startswith("repair")) == [
            ("repair", 13), ("repair_delete", 11), ("repair_delete", 12)
        ]  # fmt: skip
        assert [op for op in _ops(cdc, "grandchild") if op[0].startswith("repair")] == [("repair_delete", 101)]
        assert [op for op in _ops(cdc, "orphanable") if op[0].startswith("repair")] == [("repair", 7)]
    assert cdc.sync() == 0 and main(["verify"]) == 0  # nothing more to repair


def test_the_check_after_an_apply_compares_the_rows_a_cascade_reached(cdc: CdcEnv, capsys) -> None:
    """The scheduled apply runs do not repair: the parent's run compares the child rows its changes cascaded to,
    finds them different, and names `repair` (it used to pass: only the keys the binlog changed were compared)."""
    from cdc_assets.capture.run import capture
    from cdc_assets.defs.resources import initialized_resources

    if _logs_cascades(cdc):
        pytest.skip("the server logs cascades: there is nothing to derive")
    cdc.execute(*SCHEMA, *ROWS)
    assert cdc.sync() == 0
    cdc.execute("UPDATE parent SET code = 'aa' WHERE id = 1")  # ON UPDATE CASCADE: child 10's parent_code
    capture(initialized_resources().binlog.settings(), cdc.lakehouse)
    parent = f"{cdc.database}.parent"
    build_definitions().resolve_job_def(APPLY_JOB).execute_in_process(
        instance=instance(), asset_selection=[changes_asset_key(parent), table_asset_key(parent)], raise_on_error=False
    )
    check = _latest_check(f"{cdc.database}.child", "current_matches_source")
    assert not check.passed and "different: 10" in check.description and "repair" in check.description, check.description
    assert main(["repair", f"{cdc.database}.child"]) == 0
    assert main(["verify"]) == 0
