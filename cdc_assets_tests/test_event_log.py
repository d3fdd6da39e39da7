"""The instance's event log writes a partition range's events in batches, and they read back as Dagster's own; a
`sync` (one run) records the same materializations and every check's evaluation."""

from __future__ import annotations

from dagster import AssetCheckKey, AssetKey, DagsterEventType, EventRecordsFilter

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance as _instance
from cdc_assets.commands.runs import run_job
from cdc_assets.defs.keys import APPLY_JOB, CAPTURE_JOB, CHANGES_ASSET, CURRENT_ASSET, RAW_ASSET, SYNC_JOB
from cdc_assets.defs.sensors import apply_run_request
from cdc_assets.runtime.event_log import BatchingSqliteEventLogStorage
from cdc_assets_tests.conftest import CdcEnv

CHECKS = [
    (RAW_ASSET, "raw_batches_contiguous"),
    (CHANGES_ASSET, "change_log_seq_unique"),
    (CURRENT_ASSET, "current_matches_source"),
    (CURRENT_ASSET, "current_schema_matches_source"),
    (CURRENT_ASSET, "table_lag"),
]


def _partitions(asset: str, event_type: DagsterEventType) -> set[str]:
    records = _instance().get_event_records(EventRecordsFilter(event_type, asset_key=AssetKey(asset)), limit=100)
    return {r.event_log_entry.dagster_event.partition for r in records}


def test_a_sync_is_one_run_with_every_materialization_and_check_and_a_range_run_writes_in_batches(
    cdc: CdcEnv, monkeypatch
) -> None:
    tables = ["a", "b", "c"]
    cdc.execute(*[f"CREATE TABLE {t} (id INT PRIMARY KEY)" for t in tables], *[f"INSERT INTO {t} VALUES (1)" for t in tables])
    instance = _instance()
    assert isinstance(instance.event_log_storage, BatchingSqliteEventLogStorage)
    names = {f"{cdc.database}.{t}" for t in tables}
    assert main(["sync"]) == 0

    # the sync: one run records each table's partitions, the raw batches and every check's evaluation
    [run] = instance.get_runs(limit=1)
    assert run.job_name == SYNC_JOB and run.is_success
    for asset in ("table_changes", "current_tables"):
        assert names <= set(instance.get_materialized_partitions(AssetKey(asset)))
        assert names <= _partitions(asset, DagsterEventType.ASSET_MATERIALIZATION)
    assert instance.get_latest_materialization_event(RAW_ASSET).run_id == run.run_id
    for asset, check in CHECKS:
        record = instance.get_latest_asset_check_evaluation_record(AssetCheckKey(asset, check))
        assert record is not None and record.run_id == run.run_id, check
        assert record.event.dagster_event.event_specific_data.passed, check

    # the sensor's runs: a capture, then one apply run over the range, whose events go in batches
    cdc.execute(*[f"INSERT INTO {t} VALUES (2)" for t in tables])
    stored = []
    original = BatchingSqliteEventLogStorage.store_event_batch

    def spy(self, events):  # type: ignore[no-untyped-def]
        stored.append(len(events))
        return original(self, events)

    monkeypatch.setattr(BatchingSqliteEventLogStorage, "store_event_batch", spy)
    assert run_job(CAPTURE_JOB).success
    first, last = sorted(names)[0], sorted(names)[-1]
    request = apply_run_request(first, last, run_key="test")
    assert run_job(APPLY_JOB, tags=dict(request.tags), partition_key=request.partition_key).success
    assert stored and max(stored) >= len(tables)  # the range's events went in batches, not one by one
    for asset in ("table_changes", "current_tables"):
        assert names <= _partitions(asset, DagsterEventType.ASSET_MATERIALIZATION)
        # planned materializations are recorded too (one per partition or per range)
        assert _partitions(asset, DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
    [result] = [r for r in cdc.verify() if str(r.table) == f"{cdc.database}.a"]
    assert result.ok and result.compared_rows == 2
