"""The code location as the UI shows it: groups, descriptions, freshness policies, schedules and the sensor."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dagster import AssetKey

from cdc_assets.definitions import build_definitions, build_resources
from cdc_assets.errors import CdcUserError
from cdc_assets.freshness import lag_thresholds

ASSETS = {"raw_binlog_batches": "capture", "table_changes": "changes", "current_tables": "current"}


def test_assets_are_grouped_and_everything_is_described() -> None:
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    for key, group in ASSETS.items():
        node = graph.get(AssetKey(key))
        assert node.group_name == group
        assert node.description and len(node.description) > 40
    for check in graph.asset_check_keys:
        assert graph.get(check).description, check
    for sensor in defs.sensors or []:
        assert sensor.description, sensor.name
    for schedule in defs.schedules or []:
        assert schedule.description, schedule.name
    for job in defs.jobs or []:
        assert job.description, job.name
    for name, resource in build_resources().items():
        assert resource.get_resource_definition().description, name  # type: ignore[attr-defined]
    assert {s.name for s in defs.sensors} == {"raw_batch_sensor", "binlog_sensor"}
    assert {s.name for s in defs.schedules} == {"capture_schedule", "lag_check_schedule"}


def test_freshness_policies_default_to_warn_after_2_and_fail_after_5_minutes(monkeypatch) -> None:
    for name in ("CDC_FRESHNESS_WARN_MINUTES", "CDC_FRESHNESS_FAIL_MINUTES", "CDC_LAG_WARN_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    policy = build_definitions().resolve_asset_graph().get(AssetKey("current_tables")).freshness_policy
    assert policy.fail_window.to_timedelta() == timedelta(minutes=5)
    assert policy.warn_window.to_timedelta() == timedelta(minutes=2)
    assert lag_thresholds() == (120.0, 300.0)


def test_freshness_windows_are_configurable_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "10")
    monkeypatch.setenv("CDC_FRESHNESS_FAIL_MINUTES", "30")
    policy = build_definitions().resolve_asset_graph().get(AssetKey("current_tables")).freshness_policy
    assert policy.fail_window.to_timedelta() == timedelta(minutes=30)
    assert lag_thresholds() == (600.0, 1800.0)
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "0.5")
    with pytest.raises(CdcUserError, match="at least 1"):
        build_definitions()
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "40")
    with pytest.raises(CdcUserError, match="must be below CDC_FRESHNESS_FAIL_MINUTES"):
        build_definitions()
