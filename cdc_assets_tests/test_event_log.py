"""The instance's event log writes a partition range's events in batches, and they read back as Dagster's own."""

from __future__ import annotations

from dagster import AssetKey, DagsterEventType, EventRecordsFilter

from cdc_assets.cli import main
from cdc_assets.defs.event_log import BatchingSqliteEventLogStorage
from cdc_assets.defs.runs import instance as _instance
from cdc_assets_tests.conftest import CdcEnv


def test_a_range_runs_events_are_stored_in_batches_and_read_back(cdc: CdcEnv, monkeypatch) -> None:
    tables = ["a", "b", "c"]
    cdc.execute(*[f"CREATE TABLE {t} (id INT PRIMARY KEY)" for t in tables], *[f"INSERT INTO {t} VALUES (1)" for t in tables])
    instance = _instance()
    assert isinstance(instance.event_log_storage, BatchingSqliteEventLogStorage)
    stored = []
    original = BatchingSqliteEventLogStorage.store_event_batch

    def spy(self, events):  # type: ignore[no-untyped-def]
        stored.append(len(events))
        return original(self, events)

    monkeypatch.setattr(BatchingSqliteEventLogStorage, "store_event_batch", spy)
    assert main(["sync"]) == 0
    assert stored and max(stored) >= len(tables)  # the range's events went in batches, not one by one
    names = {f"{cdc.database}.{t}" for t in tables}
    for asset in ("table_changes", "current_tables"):
        assert names <= set(instance.get_materialized_partitions(AssetKey(asset)))
        records = instance.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, asset_key=AssetKey(asset)), limit=100
        )
        partitions = {r.event_log_entry.dagster_event.partition for r in records}
        assert names <= partitions
        planned = instance.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION_PLANNED, asset_key=AssetKey(asset)), limit=100
        )
        assert planned  # planned materializations are recorded too (one per partition or per range)
