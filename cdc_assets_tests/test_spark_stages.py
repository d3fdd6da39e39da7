"""The stages on the Spark engine: tasks read, key, type and write; the run process plans and commits. Every
run ends with the lakehouse equal to the source, as on the Arrow engine."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CHANGES
from cdc_assets_tests.conftest import CdcEnv


@pytest.fixture
def on_spark_engine(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> CdcEnv:
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # every run on Spark, whatever its size
    return cdc


def _assert_equal(cdc: CdcEnv, tables: int) -> None:
    results = cdc.verify()
    assert len(results) == tables
    assert [r.describe() for r in results if not r.ok] == []


def test_change_logs_and_current_state_on_spark_with_ddl_and_truncate(on_spark_engine: CdcEnv) -> None:
    cdc = on_spark_engine
    cdc.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n SMALLINT)",
        "CREATE TABLE k (x INT, y VARCHAR(5))",
        "INSERT INTO a VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)",
        "INSERT INTO k VALUES (1, 'p'), (1, 'p'), (2, 'q')",
    )
    assert cdc.sync() == 0
    _assert_equal(cdc, 2)
    cdc.execute(
        "UPDATE a SET v = 'uno' WHERE id = 1",
        "DELETE FROM a WHERE id = 2",
        "ALTER TABLE a ADD COLUMN extra VARCHAR(10) DEFAULT 'd'",
        "INSERT INTO a VALUES (4, 'four', 4, 'x')",
        "ALTER TABLE a MODIFY n INT",  # a type change: the change log's older rows are rewritten too
        "UPDATE a SET n = 70000 WHERE id = 3",
        "DELETE FROM k WHERE x = 1 LIMIT 1",
    )
    assert cdc.sync() == 0
    _assert_equal(cdc, 2)
    cdc.execute("TRUNCATE TABLE k", "INSERT INTO k VALUES (5, 'z')", "UPDATE a SET id = 10 WHERE id = 1")
    assert cdc.sync() == 0
    _assert_equal(cdc, 2)
    log = cdc.lakehouse.open(CHANGES, TableRef(cdc.database, "a"))
    assert log is not None and any("zstd" in p for p in log.file_uris())  # files the Spark tasks wrote
