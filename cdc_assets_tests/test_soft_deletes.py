"""Soft deletes (CDC_SOFT_DELETES): deleted rows stay in current state, flagged with the delete's seq and time;
a re-insert revives them; verify compares only live rows."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv


def _current(cdc: CdcEnv, table: str) -> dict[int, tuple]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table))
    assert rows is not None
    deleted = rows.column("_cdc_deleted").to_pylist() if "_cdc_deleted" in rows.column_names else [None] * rows.num_rows
    return {
        r["id"]: (r["v"], bool(d), r["_cdc_seq"], r["_cdc_commit_ts"])
        for r, d in zip(rows.to_pylist(), deleted, strict=True)
    }


def _seq_of(cdc: CdcEnv, table: str, op: str, row_id: int) -> tuple[int, object]:
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)), None)
    rows = read_query(log, "SELECT * FROM changes ORDER BY _cdc_seq DESC", "changes").to_pylist()
    row = next(r for r in rows if r["_cdc_op"] == op and (r["id"] == row_id or op == "truncate"))
    return row["_cdc_seq"], row["_cdc_commit_ts"]


def _verified(cdc: CdcEnv) -> None:
    results = cdc.verify()
    assert results and all(r.ok for r in results), [r.describe() for r in results]


def test_soft_deletes_keep_deleted_rows_flagged(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_SOFT_DELETES", f"{cdc.database}.s")
    for table in ("s", "hard"):
        cdc.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(10))", f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    assert cdc.sync() == 0
    cdc.execute(
        "DELETE FROM s WHERE id = 2",
        "UPDATE s SET id = 30 WHERE id = 3",  # the old key is deleted
        "INSERT INTO s VALUES (9, 'i')",
        "DELETE FROM s WHERE id = 9",  # written and deleted in one run: kept as deleted all the same
        "DELETE FROM hard WHERE id = 2",
    )
    assert cdc.sync() == 0
    current = _current(cdc, "s")
    assert {k: v[:2] for k, v in current.items()} == {
        1: ("a", False), 2: ("b", True), 3: ("c", True), 30: ("c", False), 9: ("i", True)
    }  # fmt: skip
    assert current[2][2:] == _seq_of(cdc, "s", "delete", 2)  # the delete's seq and commit time
    assert sorted(_current(cdc, "hard")) == [1, 3]  # a table CDC_SOFT_DELETES does not select deletes for real
    _verified(cdc)

    cdc.execute("INSERT INTO s VALUES (2, 'b2')", "ALTER TABLE s ADD COLUMN w INT DEFAULT 1")
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # a run Spark would take: soft deletes keep it on Arrow
    assert cdc.sync() == 0
    current = _current(cdc, "s")
    assert current[2][:2] == ("b2", False)  # revived by the re-insert
    assert current[3][:2] == ("c", True)  # the ALTER keeps the flags
    _verified(cdc)

    cdc.execute("TRUNCATE TABLE s", "INSERT INTO s VALUES (5, 'e', 2)")
    assert cdc.sync() == 0
    current = _current(cdc, "s")
    truncate = _seq_of(cdc, "s", "truncate", 0)
    assert {k for k, v in current.items() if not v[1]} == {5}
    assert all(current[k][2:] == truncate for k in (1, 2, 30))  # deleted by the TRUNCATE, at its seq and time
    assert current[9][2:] == _seq_of(cdc, "s", "delete", 9)  # deleted before keeps its own delete
    _verified(cdc)
