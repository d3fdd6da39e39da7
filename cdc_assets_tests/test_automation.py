"""Freshness governs updates (issue 30, item 2): each table's automation condition comes from its freshness window,
Dagster's declarative automation requests the capture (on the tightest table's cron) and the tables due at the same
tick, as one run, and a table with a tighter window (CDC_FRESHNESS_TABLES) is updated more often. Ten minutes of the
automation sensor's ticks (every 30 s), evaluated with Dagster's own evaluator at simulated times, each after a tick
of the binlog position sensor (which records the binlog's growth, what the capture waits for), their runs executed
for real against the source."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dagster import AssetKey, AssetRecordsFilter, Definitions, build_sensor_context, evaluate_automation_conditions
from dagster._core.test_utils import freeze_time

from cdc_assets.commands.runs import instance as _instance
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import RAW_ASSET, table_asset_key
from cdc_assets.defs.resources import resources_from_env
from cdc_assets_tests.conftest import CdcEnv

MINUTES = 10
AUTOMATION_TAGS = {"dagster/from_automation_condition": "true", "cdc/stage": "sync"}


def _materializations(key: AssetKey) -> int:
    return len(_instance().fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1000).records)


def _binlog_position_tick(defs: Definitions, cursor: str | None) -> str | None:
    """One tick of the binlog position sensor, its runless events recorded as the daemon records them."""
    sensor = next(s for s in defs.sensors or [] if s.name == "binlog_position_sensor")
    with build_sensor_context(
        instance=_instance(), cursor=cursor, repository_def=defs.get_repository_def(), resources=resources_from_env().by_key()
    ) as context:
        result = sensor(context)
    for event in result.asset_events:
        _instance().report_runless_asset_event(event)
    return result.cursor


def test_the_table_with_the_tighter_window_is_materialized_more_often(cdc: CdcEnv, monkeypatch) -> None:
    db = cdc.database
    for mode in ("CDC_CAPTURE_CRON", "CDC_CAPTURE_INTERVAL_SECONDS", "CDC_CONTINUOUS"):
        monkeypatch.delenv(mode, raising=False)
    monkeypatch.setenv("CDC_FRESHNESS_TABLES", f"{db}.tight=2/4,{db}.loose=10/20")  # every minute; every 5 minutes
    cdc.execute(
        "CREATE TABLE tight (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE loose (id INT PRIMARY KEY, v INT)",
        "INSERT INTO tight VALUES (0, 0)",
        "INSERT INTO loose VALUES (0, 0)",
    )
    assert cdc.sync() == 0  # the tables are in the registry when the definitions load
    defs = build_definitions()
    job = defs.resolve_implicit_global_asset_job_def()
    tight, loose = table_asset_key(f"{db}.tight"), table_asset_key(f"{db}.loose")
    before = {key: _materializations(key) for key in (tight, loose)}
    keys = [k for k in defs.resolve_asset_graph().get_all_asset_keys() if k.path[0] != "mysql"]
    start = datetime(2026, 11, 26, 12, 0, 30, tzinfo=UTC)
    cursor = position_cursor = None
    runs = []
    for tick in range(2 * MINUTES + 1):
        cdc.execute(f"INSERT INTO tight VALUES ({tick + 1}, {tick})", f"INSERT INTO loose VALUES ({tick + 1}, {tick})")
        now = start + timedelta(seconds=30 * tick)
        with freeze_time(now):  # the sensors' ticks; the run requested starts and records a few seconds later
            position_cursor = _binlog_position_tick(defs, position_cursor)
            result = evaluate_automation_conditions(defs=defs, instance=_instance(), cursor=cursor, evaluation_time=now)
        cursor = result.cursor
        selection = {key for key in keys if result.get_requested_partitions(key)}
        if not selection:
            continue
        # the sensor makes one run of what one tick requests, as here: the capture, then every table due
        assert RAW_ASSET in selection, selection
        with freeze_time(now + timedelta(seconds=10)):
            done = job.execute_in_process(instance=_instance(), asset_selection=list(selection), tags=AUTOMATION_TAGS)
        assert done.success
        runs.append(selection)
    updates = {key: _materializations(key) - before[key] for key in (tight, loose)}
    # the tight table every minute, the loose one every five: a tighter window, more updates
    assert updates[tight] >= MINUTES - 1, (updates, runs)
    assert 1 <= updates[loose] <= 3, (updates, runs)
    assert all(tight in r for r in runs if loose in r)  # when both are due, one run applies both
    assert sum(RAW_ASSET in r for r in runs) >= MINUTES - 1  # capture ran ahead of the tightest window
    # each run left its tables equal to the source up to what it captured; the last one applies everything
    diffs = {str(d.table): d for d in cdc.verify()}
    assert diffs[f"{db}.tight"].ok and diffs[f"{db}.tight"].in_flight_keys <= 1
