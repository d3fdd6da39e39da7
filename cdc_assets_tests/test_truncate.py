"""TRUNCATE empties a current-state table at its place in the order and is recorded in the change log."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.raw_batches import list_batches, read_manifest
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources


def _ids(cdc: CdcEnv, table: str) -> list[int]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table), ["id"])
    return sorted(rows.column("id").to_pylist())


def _ops(cdc: CdcEnv, table: str) -> list[str]:
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)), None)
    return read_query(log, "SELECT _cdc_op FROM changes ORDER BY _cdc_seq", "changes").column(0).to_pylist()


def test_truncate_in_the_middle_of_a_batch_keeps_only_later_rows(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE other (id INT PRIMARY KEY)",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "INSERT INTO other VALUES (1)",
    )
    assert cdc.sync() == 0
    cdc.execute(
        "INSERT INTO t VALUES (4, 'd')",
        "UPDATE t SET v = 'B' WHERE id = 2",
        "TRUNCATE TABLE t",
        "INSERT INTO t VALUES (2, 'again'), (7, 'g')",
        "UPDATE t SET v = 'G' WHERE id = 7",
        "INSERT INTO other VALUES (2)",
    )
    assert cdc.sync() == 0
    assert _ids(cdc, "t") == [2, 7]
    assert _ids(cdc, "other") == [1, 2]  # another table is not touched
    assert _ops(cdc, "t") == ["create"] + ["insert"] * 3 + ["insert", "update", "truncate", "insert", "insert", "update"]
    results = cdc.verify()
    assert all(r.ok for r in results), [r.describe() for r in results]


def test_truncate_alone_in_its_batch_and_twice_in_a_row(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "1")
    cdc.execute("TRUNCATE t")
    assert cdc.sync() == 0
    manifest = read_manifest(cdc.lakehouse.store, list_batches(cdc.lakehouse.store)[-1])
    assert manifest.rows == 0 and manifest.tables() == [f"{cdc.database}.t"]
    assert _ids(cdc, "t") == []
    cdc.execute("INSERT INTO t VALUES (3)", "TRUNCATE t", "INSERT INTO t VALUES (4)", "TRUNCATE t", "INSERT INTO t VALUES (5)")
    assert cdc.sync() == 0
    assert _ids(cdc, "t") == [5]
    assert _ops(cdc, "t").count("truncate") == 3
    assert all(r.ok for r in cdc.verify())


def test_truncate_of_a_keyless_table(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE k (id INT, v VARCHAR(5))", "INSERT INTO k VALUES (1, 'x'), (2, 'y')")
    assert cdc.sync() == 0
    cdc.execute("TRUNCATE `k`", "INSERT INTO k VALUES (3, 'z'), (1, 'x'), (1, 'x')")
    assert cdc.sync() == 0
    assert _ids(cdc, "k") == [1, 1, 3]  # the same values written again after the TRUNCATE: two copies, not three
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "k")), None)
    truncate_seq = read_query(log, "SELECT _cdc_seq FROM changes WHERE _cdc_op = 'truncate'", "changes").column(0)[0]
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "k"), ["_cdc_seq"])
    assert min(current.column("_cdc_seq").to_pylist()) > truncate_seq.as_py()
