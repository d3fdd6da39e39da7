"""Freshness: how far behind the current-state layer may fall before Dagster warns and fails."""

from datetime import timedelta

from dagster import FreshnessPolicy

from cdc_assets.core.settings import DEFAULT_FRESHNESS_FAIL_MINUTES, DEFAULT_FRESHNESS_WARN_MINUTES, env_window


def freshness_windows() -> tuple[float, float]:
    """(warn, fail) in minutes from CDC_FRESHNESS_WARN_MINUTES / CDC_FRESHNESS_FAIL_MINUTES."""
    return env_window(
        ("CDC_FRESHNESS_WARN_MINUTES", "CDC_FRESHNESS_FAIL_MINUTES"),
        (DEFAULT_FRESHNESS_WARN_MINUTES, DEFAULT_FRESHNESS_FAIL_MINUTES),
        lambda minutes: minutes >= 1,
        "a number of minutes of at least 1 (Dagster's shortest freshness window)",
    )


def current_freshness_policy() -> FreshnessPolicy:
    """Warn, then fail, when no current-state table has been brought up to date for that long."""
    warn, fail = freshness_windows()
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=fail), warn_window=timedelta(minutes=warn))


def lag_thresholds() -> tuple[float, float]:
    """(warn, fail) in seconds for the per-table lag check: CDC_LAG_WARN_SECONDS / CDC_LAG_FAIL_SECONDS, by
    default the freshness windows, so the check names the tables behind when freshness warns or fails."""
    warn_minutes, fail_minutes = freshness_windows()
    return env_window(
        ("CDC_LAG_WARN_SECONDS", "CDC_LAG_FAIL_SECONDS"),
        (warn_minutes * 60, fail_minutes * 60),
        lambda seconds: seconds > 0,
        "a positive number of seconds",
    )


def sink_lag_thresholds() -> tuple[float, float]:
    """(warn, fail) in seconds for each sink's lag check: CDC_SINK_LAG_WARN_SECONDS / CDC_SINK_LAG_FAIL_SECONDS,
    by default the freshness windows."""
    warn_minutes, fail_minutes = freshness_windows()
    return env_window(
        ("CDC_SINK_LAG_WARN_SECONDS", "CDC_SINK_LAG_FAIL_SECONDS"),
        (warn_minutes * 60, fail_minutes * 60),
        lambda seconds: seconds > 0,
        "a positive number of seconds",
    )
