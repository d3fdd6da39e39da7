"""Freshness: how far behind the current-state layer may fall before Dagster warns and fails."""

import os
from datetime import timedelta

from dagster import FreshnessPolicy

from cdc_assets.errors import CdcUserError
from cdc_assets.settings import DEFAULT_FRESHNESS_FAIL_MINUTES, DEFAULT_FRESHNESS_WARN_MINUTES


def freshness_windows() -> tuple[float, float]:
    """(warn, fail) in minutes from CDC_FRESHNESS_WARN_MINUTES / CDC_FRESHNESS_FAIL_MINUTES."""
    values = []
    for name, default in (
        ("CDC_FRESHNESS_WARN_MINUTES", DEFAULT_FRESHNESS_WARN_MINUTES),
        ("CDC_FRESHNESS_FAIL_MINUTES", DEFAULT_FRESHNESS_FAIL_MINUTES),
    ):
        text = os.environ.get(name)
        try:
            value = float(text) if text else default
        except ValueError:
            value = -1.0
        if value < 1:
            raise CdcUserError(
                f"{name}={text!r} is not a number of minutes of at least 1 (Dagster's shortest freshness window): "
                f"set it to e.g. {default:g}."
            )
        values.append(value)
    warn, fail = values
    if warn >= fail:
        raise CdcUserError(
            f"CDC_FRESHNESS_WARN_MINUTES ({warn:g}) must be below CDC_FRESHNESS_FAIL_MINUTES ({fail:g}): lower the "
            "first or raise the second."
        )
    return warn, fail


def current_freshness_policy() -> FreshnessPolicy:
    """Warn, then fail, when no current-state table has been brought up to date for that long."""
    warn, fail = freshness_windows()
    return FreshnessPolicy.time_window(fail_window=timedelta(minutes=fail), warn_window=timedelta(minutes=warn))


def lag_thresholds() -> tuple[float, float]:
    """(warn, fail) in seconds for the per-table lag check: CDC_LAG_WARN_SECONDS / CDC_LAG_FAIL_SECONDS, by
    default the freshness windows, so the check names the tables behind when freshness warns or fails."""
    warn_minutes, fail_minutes = freshness_windows()
    values = []
    for name, default in (("CDC_LAG_WARN_SECONDS", warn_minutes * 60), ("CDC_LAG_FAIL_SECONDS", fail_minutes * 60)):
        text = os.environ.get(name)
        try:
            value = float(text) if text else default
        except ValueError:
            value = -1.0
        if value <= 0:
            raise CdcUserError(f"{name}={text!r} is not a positive number of seconds: set it to e.g. {default:g}.")
        values.append(value)
    warn, fail = values
    if warn >= fail:
        raise CdcUserError(
            f"CDC_LAG_WARN_SECONDS ({warn:g}) must be below CDC_LAG_FAIL_SECONDS ({fail:g}): lower the first or raise "
            "the second."
        )
    return warn, fail
