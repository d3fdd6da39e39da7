"""Freshness: how far behind the current-state layer may fall before Dagster warns and fails."""

from datetime import timedelta

from dagster import FreshnessPolicy

from cdc_assets.core.settings import freshness_windows

# the thresholds are read where every setting is (core.settings); the checks and sensors import them from here
from cdc_assets.core.settings import lag_thresholds as lag_thresholds
from cdc_assets.core.settings import sink_lag_thresholds as sink_lag_thresholds


def freshness_policy(warn_minutes: float, fail_minutes: float) -> FreshnessPolicy:
    """Warn, then fail, when the asset has not been brought (or confirmed) up to date for that long: on
    `current/<schema>/<table>`, that table (a quiet one is confirmed by capture, defs/assets/tables.confirmations)."""
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=fail_minutes), warn_window=timedelta(minutes=warn_minutes))


def current_freshness_policy() -> FreshnessPolicy:
    """The windows of CDC_FRESHNESS_WARN_MINUTES / CDC_FRESHNESS_FAIL_MINUTES: every table's but those
    CDC_FRESHNESS_TABLES gives others, and the capture's and the sinks'."""
    return freshness_policy(*freshness_windows())


def confirm_every_seconds() -> float:
    """How old a quiet table's last materialization may be before a capture confirms it up to date again: a
    quarter of the warn window, so a capture every minute keeps every quiet table fresh with room to spare."""
    warn, _ = freshness_windows()
    return warn * 60 / 4
