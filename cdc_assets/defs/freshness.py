"""Freshness: how far behind the current-state layer may fall before Dagster warns and fails."""

from datetime import timedelta

from dagster import FreshnessPolicy

from cdc_assets.core.settings import CadenceSettings


def freshness_policy(warn_minutes: float, fail_minutes: float) -> FreshnessPolicy:
    """Warn, then fail, when the asset has not been brought (or confirmed) up to date for that long: on
    `current/<schema>/<table>`, that table (a quiet one is confirmed by capture, defs/assets/tables.confirmations)."""
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=fail_minutes), warn_window=timedelta(minutes=warn_minutes))


def current_freshness_policy(cadence: CadenceSettings) -> FreshnessPolicy:
    """The windows of CDC_FRESHNESS_WARN_MINUTES / CDC_FRESHNESS_FAIL_MINUTES: every table's but those
    CDC_FRESHNESS_TABLES gives others, and the capture's and the sinks'."""
    return freshness_policy(*cadence.freshness_windows)
