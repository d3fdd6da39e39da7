"""The sensor on new raw batches (the schedule mode's), evaluated with build_sensor_context on a local lakehouse and on
S3 over HTTP, and its run requests executed for real: one run materializes exactly the touched tables."""

from __future__ import annotations

import boto3
import pytest
from dagster import AssetRecordsFilter, DagsterInstance, SensorResult, SkipReason, build_sensor_context

from cdc_assets.capture.run import capture
from cdc_assets.commands.runs import instance as _instance
from cdc_assets.commands.runs import run_job
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB as APPLY_JOB_NAME
from cdc_assets.defs.keys import table_asset_key
from cdc_assets.defs.resources import BinlogResource, LakehouseResource
from cdc_assets.defs.sensors import build_raw_batch_sensor, current_tables_of
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets_tests.conftest import CdcEnv, use_s3
from cdc_assets_tests.env_settings import settings_now


def _capture(cdc: CdcEnv, location: str) -> None:
    binlog = BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{cdc.database}.*")
    capture(binlog.settings(), LakehouseResource(location=location).get())


def _evaluate(instance: DagsterInstance, location: str, cursor: str | None) -> SensorResult | SkipReason:
    with build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(location=location)}
    ) as context:
        return build_raw_batch_sensor(settings_now().cadence)(context)


def _covered(result: SensorResult) -> list[str]:
    """Tables the run requests cover."""
    return sorted(t for run in result.run_requests or [] for t in current_tables_of(list(run.asset_selection or [])))


def _execute(instance: DagsterInstance, result: SensorResult) -> None:
    job = build_definitions().resolve_job_def(APPLY_JOB_NAME)
    for run in result.run_requests or []:
        outcome = job.execute_in_process(instance=instance, asset_selection=list(run.asset_selection), tags=dict(run.tags))
        assert outcome.success
        assert all(e.passed for e in outcome.get_asset_check_evaluations())


def _materialized(instance: DagsterInstance, tables: list[str]) -> dict[str, int]:
    """How many times each table's current state has been materialized."""
    return {
        table: len(instance.fetch_materializations(AssetRecordsFilter(asset_key=table_asset_key(table)), limit=100).records)
        for table in tables
    }


def _sensor_round_trip(cdc: CdcEnv, location: str) -> None:
    instance = _instance()
    db = cdc.database
    cdc.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE b (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE c (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO a VALUES (1, 'x'), (2, 'y')",
        "INSERT INTO b VALUES (1, 'x')",
        "INSERT INTO c VALUES (1, 'x')",
    )
    _capture(cdc, location)
    first = _evaluate(instance, location, None)
    assert isinstance(first, SensorResult)
    assert len(first.run_requests) == 1  # one run, however many tables
    assert _covered(first) == [f"{db}.a", f"{db}.b", f"{db}.c"]
    assert first.cursor == list_batches(LakehouseResource(location=location).get().store)[-1]
    _execute(instance, first)
    results = cdc.verify()
    assert all(r.ok for r in results)
    assert [(str(r.table), r.compared_rows) for r in results] == [(f"{db}.a", 2), (f"{db}.b", 1), (f"{db}.c", 1)]

    # Nothing new: the sensor skips and keeps its cursor.
    assert isinstance(_evaluate(instance, location, first.cursor), SkipReason)

    # Only b changes: exactly b is requested and materialized, a and c are left alone.
    before = _materialized(instance, [f"{db}.a", f"{db}.b", f"{db}.c"])
    cdc.execute("UPDATE b SET v = 'changed' WHERE id = 1", "INSERT INTO b VALUES (2, 'new')")
    _capture(cdc, location)
    second = _evaluate(instance, location, first.cursor)
    assert isinstance(second, SensorResult)
    assert _covered(second) == [f"{db}.b"]
    _execute(instance, second)
    after = _materialized(instance, [f"{db}.a", f"{db}.b", f"{db}.c"])
    assert after[f"{db}.b"] == before[f"{db}.b"] + 1
    assert after[f"{db}.a"] == before[f"{db}.a"] and after[f"{db}.c"] == before[f"{db}.c"]
    assert all(d.ok for d in cdc.verify())


def test_sensor_on_a_local_lakehouse(cdc: CdcEnv) -> None:
    _sensor_round_trip(cdc, str(cdc.lakehouse_dir))


def test_sensor_on_s3(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    use_s3(monkeypatch, s3_endpoint)
    bucket = f"sensor-{cdc.database.replace('_', '-')}"[:60]
    boto3.client("s3").create_bucket(Bucket=bucket)
    location = f"s3://{bucket}/cdc"
    monkeypatch.setenv("CDC_LAKEHOUSE", location)
    _sensor_round_trip(cdc, location)
    assert not cdc.lakehouse_dir.exists()


def test_sensor_confirms_current_state_when_capture_finds_nothing(cdc: CdcEnv, monkeypatch) -> None:
    """Freshness follows the current-state layer's materializations; a quiet source must not look stale while
    capture keeps succeeding, so the sensor confirms every table after a capture that found nothing."""
    from cdc_assets.commands.runs import run_job
    from cdc_assets.defs.keys import CAPTURE_JOB as CAPTURE_JOB_NAME

    monkeypatch.setenv("CDC_LAG_WARN_SECONDS", "0.1")
    monkeypatch.setenv("CDC_LAG_FAIL_SECONDS", "0.5")
    instance = _instance()
    location = str(cdc.lakehouse_dir)
    cdc.execute("CREATE TABLE q (id INT PRIMARY KEY)", "INSERT INTO q VALUES (1)")
    assert cdc.sync() == 0
    assert run_job(settings_now(), CAPTURE_JOB_NAME).success  # a capture that finds nothing new
    cursor = list_batches(LakehouseResource(location=location).get().store)[-1]
    result = _evaluate(instance, location, cursor)
    assert isinstance(result, SensorResult) and len(result.run_requests) == 1
    assert f"{cdc.database}.q" in _covered(result)
    _execute(instance, result)
    # Confirmed after the last capture: no second confirmation for the same capture.
    assert isinstance(_evaluate(instance, location, cursor), SkipReason)


def test_sensor_requests_a_table_again_when_its_run_did_not_apply_it(cdc: CdcEnv) -> None:
    instance = _instance()
    location = str(cdc.lakehouse_dir)
    cdc.execute("CREATE TABLE r (id INT PRIMARY KEY)", "INSERT INTO r VALUES (1), (2)")
    _capture(cdc, location)
    first = _evaluate(instance, location, None)
    assert isinstance(first, SensorResult) and _covered(first) == [f"{cdc.database}.r"]
    # The requested run failed (here: never ran). The cursor has moved on, yet the table is asked for again.
    again = _evaluate(instance, location, first.cursor)
    assert isinstance(again, SensorResult) and _covered(again) == [f"{cdc.database}.r"]
    assert all(r.run_key.startswith("retry:") for r in again.run_requests)
    _execute(instance, again)
    assert all(r.ok and r.compared_rows == 2 for r in cdc.verify())
    assert isinstance(_evaluate(instance, location, first.cursor), SkipReason)  # applied: nothing to retry


def test_no_second_apply_run_queues_behind_one_waiting_for_the_same_tables(cdc: CdcEnv) -> None:
    """Under steady load a new batch arrives while an apply run for its tables still waits in the queue: that
    run will take in the batch when it starts, so no run is queued behind it; other tables still get one."""
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    instance = _instance()
    location = str(cdc.lakehouse_dir)
    db = cdc.database
    cdc.execute("CREATE TABLE a (id INT PRIMARY KEY)", "INSERT INTO a VALUES (1)")
    _capture(cdc, location)
    first = _evaluate(instance, location, None)
    assert _covered(first) == [f"{db}.a"]
    request = first.run_requests[0]
    queued = create_run_for_test(
        instance,
        job_name=APPLY_JOB_NAME,
        status=DagsterRunStatus.NOT_STARTED,
        tags=dict(request.tags),
        asset_selection=frozenset(request.asset_selection),
    )
    cdc.execute("INSERT INTO a VALUES (2)", "CREATE TABLE b (id INT PRIMARY KEY)", "INSERT INTO b VALUES (1)")
    _capture(cdc, location)
    second = _evaluate(instance, location, first.cursor)
    assert _covered(second) == [f"{db}.b"]  # a is left to the waiting run
    assert second.cursor == list_batches(cdc.lakehouse.store)[-1]
    instance.report_run_failed(queued)
    cdc.execute("INSERT INTO a VALUES (3)")
    _capture(cdc, location)
    third = _evaluate(instance, location, second.cursor)
    # a: nothing waits for it any more; b: its requested run never ran here, so it is requested again
    assert _covered(third) == [f"{db}.a", f"{db}.b"]


def test_a_table_captured_after_the_definitions_loaded_is_applied_before_any_reload(cdc: CdcEnv) -> None:
    """It has no asset the automation or the raw-batch sensor could select: the new-tables sensor applies it, and
    its runs record its change log and current state under its keys, which the next reload shows."""

    from cdc_assets.defs.keys import NEW_TABLES_JOB, changes_asset_key
    from cdc_assets.defs.sensors import build_new_tables_sensor

    instance = _instance()
    location = str(cdc.lakehouse_dir)
    cdc.execute("CREATE TABLE old (id INT PRIMARY KEY)", "INSERT INTO old VALUES (1)")
    assert cdc.sync() == 0
    defs = build_definitions()  # loaded now: `old` has its assets, `late` will not

    def tick() -> SensorResult:
        with build_sensor_context(
            instance=instance,
            repository_def=defs.get_repository_def(),
            resources={"lakehouse": LakehouseResource(location=location)},
        ) as context:
            return build_new_tables_sensor(settings_now().cadence)(context)

    assert not tick().run_requests  # every table with changes pending has its assets
    cdc.execute("CREATE TABLE late (k VARCHAR(4) PRIMARY KEY)", "INSERT INTO late VALUES ('a'), ('b')", "INSERT INTO old VALUES (2)")
    _capture(cdc, location)
    [request] = tick().run_requests
    tables = request.run_config["ops"]["take_in_new_tables"]["config"]["tables"]
    assert tables == [f"{cdc.database}.late"]  # `old` is the automation's: it has assets
    assert run_job(settings_now(), NEW_TABLES_JOB, op_config=request.run_config["ops"]).success
    late = f"{cdc.database}.late"
    diffs = {str(d.table): d for d in cdc.verify()}
    assert diffs[late].ok and diffs[late].compared_rows == 2
    assert _materialized(instance, [late]) == {late: 1}
    assert instance.get_latest_materialization_event(changes_asset_key(late)) is not None
    idle = tick()  # applied: nothing left for it, but its assets wait for a reload, which no webserver was named for
    assert not idle.run_requests and "Reload the code location" in str(idle.skip_reason)
    assert table_asset_key(late) in build_definitions().resolve_asset_graph().get_all_asset_keys()  # a reload shows it
