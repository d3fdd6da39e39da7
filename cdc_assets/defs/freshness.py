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
    """Warn, then fail, when the asset has not been brought (or confirmed) up to date for that long: on
    `current_tables`, any table; on `current/<schema>/<table>`, that table (a quiet one is confirmed by capture,
    defs/assets/tables.confirmations)."""
    warn, fail = freshness_windows()
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=fail), warn_window=timedelta(minutes=warn))


def confirm_every_seconds() -> float:
    """How old a quiet table's last materialization may be before a capture confirms it up to date again: a
    quarter of the warn window, so a capture every minute keeps every quiet table fresh with room to spare."""
    warn, _ = freshness_windows()
    return warn * 60 / 4


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
