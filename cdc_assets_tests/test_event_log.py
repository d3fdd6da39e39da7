"""The instance's event log writes a sync's events in batches, and they read back as Dagster's own: a `sync` (one
run) records every table's materializations and check evaluations, as a run of the tables' assets does."""

from __future__ import annotations

import os

import pytest
from dagster import AssetCheckKey, AssetKey

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance as _instance
from cdc_assets.commands.runs import run_job
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB, CAPTURE_JOB, RAW_ASSET, SYNC_JOB, changes_asset_key, table_asset_key
from cdc_assets.defs.sensors import apply_run_request
from cdc_assets.runtime.event_log import BatchingSqliteEventLogStorage
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now

# what this module checks is our batching event log itself, which CDC_EVENT_BATCHES=0 leaves out
pytestmark = pytest.mark.skipif(os.environ.get("CDC_EVENT_BATCHES", "1").strip() == "0", reason="CDC_EVENT_BATCHES=0")


def _checks(table: str) -> list[tuple[AssetKey, str]]:
    current = table_asset_key(table)
    return [
        (changes_asset_key(table), "change_log_seq_unique"),
        (current, "current_matches_source"),
        (current, "current_schema_matches_source"),
        (current, "table_lag"),
    ]


def _runs_of(asset: AssetKey) -> set[str]:
    records = _instance().fetch_materializations(asset, limit=100).records
    return {r.event_log_entry.run_id for r in records}


def test_a_sync_is_one_run_with_every_materialization_and_check_and_a_range_run_writes_in_batches(
    cdc: CdcEnv, monkeypatch
) -> None:
    tables = ["a", "b", "c"]
    cdc.execute(*[f"CREATE TABLE {t} (id INT PRIMARY KEY)" for t in tables], *[f"INSERT INTO {t} VALUES (1)" for t in tables])
    instance = _instance()
    assert isinstance(instance.event_log_storage, BatchingSqliteEventLogStorage)
    names = {f"{cdc.database}.{t}" for t in tables}
    stored = []
    original = BatchingSqliteEventLogStorage.store_event_batch

    def spy(self, events):  # type: ignore[no-untyped-def]
        stored.append(len(events))
        return original(self, events)

    monkeypatch.setattr(BatchingSqliteEventLogStorage, "store_event_batch", spy)
    assert main(["sync"]) == 0
    assert stored and max(stored) >= 4 * len(tables)  # each table's verdicts went in one batch, not one by one

    # the sync: one run records each table's change log and current state, the raw batches, every check's evaluation
    [run] = instance.get_runs(limit=1)
    assert run.job_name == SYNC_JOB and run.is_success
    for name in names:
        assert _runs_of(changes_asset_key(name)) == _runs_of(table_asset_key(name)) == {run.run_id}
    assert instance.get_latest_materialization_event(RAW_ASSET).run_id == run.run_id
    for asset, check in [(RAW_ASSET, "raw_batches_contiguous"), *(c for name in names for c in _checks(name))]:
        record = instance.get_latest_asset_check_evaluation_record(AssetCheckKey(asset, check))
        assert record is not None and record.run_id == run.run_id, check
        assert record.event.dagster_event.event_specific_data.passed, check

    # the sensor's runs: a capture, then one run of the three tables' assets and their checks
    cdc.execute(*[f"INSERT INTO {t} VALUES (2)" for t in tables])
    assert run_job(settings_now(), CAPTURE_JOB).success
    request = apply_run_request(sorted(names), run_key="test")
    job = build_definitions().resolve_job_def(APPLY_JOB)
    applied = job.execute_in_process(instance=instance, asset_selection=list(request.asset_selection), tags=dict(request.tags))
    assert applied.success
    for name in names:
        assert applied.run_id in _runs_of(table_asset_key(name)) and applied.run_id in _runs_of(changes_asset_key(name))
        for asset, check in _checks(name):
            record = instance.get_latest_asset_check_evaluation_record(AssetCheckKey(asset, check))
            assert record.run_id == applied.run_id and record.event.dagster_event.event_specific_data.passed, check
    [result] = [r for r in cdc.verify() if str(r.table) == f"{cdc.database}.a"]
    assert result.ok and result.compared_rows == 2
