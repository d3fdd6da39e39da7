"""Each table's own checks and freshness, on `current/<schema>/<table>`: the table that differs, falls behind or
stays quiet is the one its asset says so for, from the few runs that check many tables at once."""

from __future__ import annotations

import time

import pytest
from dagster import AssetCheckEvaluation, AssetCheckKey, AssetCheckSeverity
from deltalake import DeltaTable

from cdc_assets.capture.run import capture
from cdc_assets.commands.runs import instance, run_sync
from cdc_assets.core.names import TableRef
from cdc_assets.defs.assets.tables import DATA_VERSION_TAG, due_for_confirmation
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import LAG_JOB, table_asset_key
from cdc_assets.defs.resources import BinlogResource, CadenceResource
from cdc_assets.defs.table_checks import EQUALITY_CHECK, LAG_CHECK, SCHEMA_CHECK
from cdc_assets.lake.layout import CURRENT
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now


def _latest_check(table: str, name: str) -> AssetCheckEvaluation | None:
    records = instance().event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(table_asset_key(table), name), limit=1
    )
    return records[0].event.dagster_event.event_specific_data if records and records[0].event else None


def test_due_for_confirmation() -> None:
    assert due_for_confirmation({"a": None, "b": 100.0, "c": 95.0}, now=110.0, every_seconds=15) == ["a", "c"]


@pytest.mark.both_sources
def test_a_table_that_differs_fails_the_equality_check_on_its_own_asset(cdc: CdcEnv) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE good (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE bad (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO good VALUES (1, 'a')",
        "INSERT INTO bad VALUES (1, 'a'), (2, 'b')",
    )
    assert run_sync(settings_now()).success
    # each table's asset carries its freshness policy and its three checks, and the sync evaluated them
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    for table in (f"{db}.good", f"{db}.bad"):
        node = graph.get(table_asset_key(table))
        assert node.freshness_policy is not None
        assert {k.name for k in node.check_keys} == {EQUALITY_CHECK, SCHEMA_CHECK, LAG_CHECK}
        assert all(_latest_check(table, name).passed for name in (EQUALITY_CHECK, SCHEMA_CHECK, LAG_CHECK))

    DeltaTable(str(cdc.lakehouse.table_uri(CURRENT, TableRef(db, "bad")))).update(
        predicate="id = 2", updates={"v": "'tampered'"}
    )
    cdc.execute("INSERT INTO bad VALUES (3, 'c')")  # the next sync's apply run takes `bad` in, and checks it
    outcome = run_sync(settings_now())
    assert f"current/{db}/bad:{EQUALITY_CHECK}" in outcome.failed_checks and not outcome.success
    check = _latest_check(f"{db}.bad", EQUALITY_CHECK)
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR
    assert "1 different: 2" in check.description and check.metadata["different_keys"].value == [2]
    assert _latest_check(f"{db}.good", EQUALITY_CHECK).passed  # the table that differs is the one named
    assert _latest_check(f"{db}.bad", SCHEMA_CHECK).passed

    # run from the UI on its own, the per-table check compares the selected table only
    key = AssetCheckKey(table_asset_key(f"{db}.bad"), EQUALITY_CHECK)
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=set(), asset_check_selection={key})
    result = job.execute_in_process(instance=instance(), raise_on_error=False)
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.asset_check_key == key and not evaluation.passed and "1 different: 2" in evaluation.description


def test_a_quiet_table_is_confirmed_up_to_date_while_another_changes(cdc: CdcEnv, monkeypatch) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE quiet (id INT PRIMARY KEY)",
        "CREATE TABLE busy (id INT PRIMARY KEY)",
        "INSERT INTO quiet VALUES (1)",
        "INSERT INTO busy VALUES (1)",
    )
    assert run_sync(settings_now()).success
    before = {t: instance().get_latest_materialization_event(table_asset_key(f"{db}.{t}")) for t in ("quiet", "busy")}
    # confirm a table last materialized a second ago (by default a quarter of the freshness warn window)
    monkeypatch.setattr(CadenceResource, "confirm_every_seconds", property(lambda self: 1.0))
    time.sleep(1.1)
    cdc.execute("INSERT INTO busy VALUES (2)")
    started = time.time()
    assert run_sync(settings_now()).success
    quiet = instance().get_latest_materialization_event(table_asset_key(f"{db}.quiet"))
    busy = instance().get_latest_materialization_event(table_asset_key(f"{db}.busy"))
    # freshness counts the quiet table's last materialization: the capture run's confirmation, same data version
    assert quiet.timestamp >= started and quiet.run_id != before["quiet"].run_id
    metadata = quiet.asset_materialization.metadata
    assert metadata["unchanged"].value is True and metadata["up_to_date_through"].value
    assert metadata["dagster/row_count"].value == 1 and "dagster/column_schema" in metadata
    tags = quiet.asset_materialization.tags
    assert tags[DATA_VERSION_TAG] == before["quiet"].asset_materialization.tags[DATA_VERSION_TAG]
    # the same run restates its checks, so the UI shows them as the confirmed data's; its lag is nothing
    equality = _latest_check(f"{db}.quiet", EQUALITY_CHECK)
    assert equality.passed and equality.metadata["carried_over_from_run"].value != quiet.run_id
    lag = _latest_check(f"{db}.quiet", LAG_CHECK)
    assert lag.passed and lag.metadata["up_to_date_through"].value == metadata["up_to_date_through"].value
    # the busy table was behind when capture confirmed: its materialization is the apply run's, with new data
    assert "unchanged" not in busy.asset_materialization.metadata
    assert busy.asset_materialization.tags[DATA_VERSION_TAG] != before["busy"].asset_materialization.tags[DATA_VERSION_TAG]
    assert busy.timestamp >= started


def test_a_lagging_table_fails_the_lag_check_on_its_own_asset(cdc: CdcEnv, monkeypatch) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_LAG_WARN_SECONDS", "0.5")
    monkeypatch.setenv("CDC_LAG_FAIL_SECONDS", "1")
    cdc.execute("CREATE TABLE fast (id INT PRIMARY KEY)", "CREATE TABLE slow (id INT PRIMARY KEY)")
    cdc.execute("INSERT INTO fast VALUES (1)", "INSERT INTO slow VALUES (1)")
    assert cdc.sync() == 0
    cdc.execute("INSERT INTO slow VALUES (2)")  # captured, never applied
    capture(BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{db}.*").settings(), cdc.lakehouse)
    time.sleep(1.5)
    result = build_definitions().resolve_job_def(LAG_JOB).execute_in_process(instance=instance(), raise_on_error=False)
    by_key = {e.asset_check_key: e for e in result.get_asset_check_evaluations()}
    slow = by_key[AssetCheckKey(table_asset_key(f"{db}.slow"), LAG_CHECK)]
    assert not slow.passed and slow.severity == AssetCheckSeverity.ERROR
    assert slow.description.startswith(f"{db}.slow is ") and slow.metadata["lag_seconds"].value >= 1
    assert by_key[AssetCheckKey(table_asset_key(f"{db}.fast"), LAG_CHECK)].passed
    assert not _latest_check(f"{db}.slow", LAG_CHECK).passed and _latest_check(f"{db}.fast", LAG_CHECK).passed
