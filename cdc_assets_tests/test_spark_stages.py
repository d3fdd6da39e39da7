"""The stages on the Spark engine: tasks read, key, type and write; the run process plans and commits. Every
run ends with the lakehouse equal to the source, as on the Arrow engine."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_assets.capture.run import capture
from cdc_assets.core.names import TableRef
from cdc_assets.lake import delta
from cdc_assets.lake.layout import CHANGES
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.run import apply_pending
from cdc_assets_tests.conftest import CdcEnv, on_spark
from cdc_assets_tests.env_settings import source_now


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


def _jobs_so_far(spark: Any) -> int:
    """Every Spark job the session has run, from its status tracker: jobs are numbered from 0 in the order they start
    (the tracker keeps only the newest thousand, so the highest number counts them, not the list's length)."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1) + 1


def test_a_run_of_many_tables_costs_as_many_spark_jobs_as_a_run_of_two(
    cdc: CdcEnv, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's fixed cost is per job: a stage whose jobs grew with its tables would cost a cluster user minutes a run
    on a few hundred tables. Two new tables, then twenty (keyed and keyless, one TRUNCATEd), each run pinned to
    Spark, with every table's files due for compaction: every stage takes the same number of jobs, and the lakehouse
    equals the source."""
    monkeypatch.setattr(delta, "SMALL_FILES_BEFORE_COMPACTION", 1)  # every table written to is compacted too
    settings = source_now()
    engine = on_spark(lambda: spark)
    jobs: dict[int, dict[str, int]] = {}
    for count, prefix in ((2, "few"), (20, "many")):
        for n in range(count):
            keyed = n % 2 == 0
            columns = "id INT PRIMARY KEY, v VARCHAR(10)" if keyed else "id INT, v VARCHAR(10)"
            cdc.execute(
                f"CREATE TABLE {prefix}{n} ({columns})",
                f"INSERT INTO {prefix}{n} VALUES (1, 'a'), (2, 'b'), (3, 'c')",
                f"UPDATE {prefix}{n} SET v = 'z' WHERE id = 2",
                f"DELETE FROM {prefix}{n} WHERE id = 3",
            )
        cdc.execute(f"TRUNCATE TABLE {prefix}1", f"INSERT INTO {prefix}1 VALUES (9, 'after')")
        capture(settings, cdc.lakehouse)
        jobs[count] = {}
        for stage, run in (("change logs", process_new_batches), ("current state", apply_pending)):
            before = _jobs_so_far(spark)
            run(cdc.lakehouse, engine)
            jobs[count][stage] = _jobs_so_far(spark) - before
    assert jobs[2] == jobs[20], jobs
    assert all(n > 0 for n in jobs[2].values())  # the runs did take Spark
    _assert_equal(cdc, 22)
