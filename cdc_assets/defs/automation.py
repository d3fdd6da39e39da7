"""How the tables are kept up to date: by default, freshness governs it through Dagster's declarative automation.

Each table's current state has a freshness policy (CDC_FRESHNESS_WARN/FAIL_MINUTES, or its glob's windows in
CDC_FRESHNESS_TABLES), and an automation condition derived from it: materialize on a cron of half its warn window,
once its upstream raw batches were captured since that tick (`table_automation`). The raw batches' condition is
the cron of the tightest table, so capture always runs ahead of the tightest window, and a tick's capture and the
tables due then are requested together: Dagster's automation sensor makes one run of them (the capture, then one
step of the tables), however many tables are due. A table with a tighter window is updated more often.

Two other modes, for users who prefer them, switch the automation sensor off: the schedule mode (CDC_CAPTURE_CRON
or CDC_CAPTURE_INTERVAL_SECONDS set: capture on that cron or interval, and the raw-batch sensor applies what it
touched) and the continuous mode (CDC_CONTINUOUS=1).
"""

from __future__ import annotations

import warnings

from dagster import (
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    BetaWarning,
    DefaultSensorStatus,
)

from cdc_assets.core.settings import CadenceSettings
from cdc_assets.defs.keys import (
    CHANGES_TABLE_PREFIX,
    CURRENT_TABLE_PREFIX,
    SOURCE_TABLE_PREFIX,
    SYNC_LANE,
    UNNAMED,
    SourceKeys,
)

AUTOMATION_SENSOR = "automation_sensor"


def source_tables(keys: SourceKeys) -> AssetSelection:
    """The source tables of the source `keys` names, `[<source>/]mysql/…` (external assets)."""
    with warnings.catch_warnings():  # include_sources is flagged beta; without it external assets are never selected
        warnings.simplefilter("ignore", BetaWarning)
        return AssetSelection.key_prefixes(keys.prefix(SOURCE_TABLE_PREFIX), include_sources=True)


def update_minutes(warn_minutes: float) -> int:
    """How often a table with this warn window is updated: every half window (at least every minute), so a run's
    wait for the sensor's tick and its own length still leave it within the window."""
    return max(1, int(warn_minutes // 2))


def update_cron(warn_minutes: float) -> str:
    """The cron of `update_minutes`: every k minutes, every h hours, or daily (`*/k` restarts each hour, so no gap
    is longer than k)."""
    minutes = update_minutes(warn_minutes)
    if minutes == 1:
        return "* * * * *"
    if minutes < 60:
        return f"*/{minutes} * * * *"
    hours = minutes // 60
    if hours < 24:
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    return "0 0 * * *"


def table_automation(warn_minutes: float, keys: SourceKeys = UNNAMED) -> AutomationCondition:
    """On the table's cron, once its upstream (the raw batches; its source table, observed, is not waited for) was
    updated since the tick or is requested with it."""
    cron = update_cron(warn_minutes)
    return (
        AutomationCondition.on_cron(cron)
        .ignore(source_tables(keys))
        .with_label(f"within {warn_minutes:g} min: on_cron({cron})")
    )


def capture_automation(warn_minutes: float) -> AutomationCondition:
    """The raw batches on the cron of the tightest table window, so capture runs ahead of every table."""
    cron = update_cron(warn_minutes)
    return AutomationCondition.on_cron(cron).with_label(f"ahead of the tightest window ({warn_minutes:g} min): on_cron({cron})")


def build_automation_sensor(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> AutomationConditionSensorDefinition:
    """Dagster's automation sensor over the source's capture and tables, running in the automation mode (`make dev`'s
    default; `cadence.automation_on`); its runs queue as the source's syncs do (one at a time, in its sync lane)."""
    tables = AssetSelection.key_prefixes(keys.prefix(CHANGES_TABLE_PREFIX), keys.prefix(CURRENT_TABLE_PREFIX))
    return AutomationConditionSensorDefinition(
        keys.qualified(AUTOMATION_SENSOR),
        target=AssetSelection.assets(keys.raw_asset) | tables,
        default_status=DefaultSensorStatus.RUNNING if cadence.automation_on else DefaultSensorStatus.STOPPED,
        run_tags=keys.tags("sync", SYNC_LANE),
        minimum_interval_seconds=30,
        description=(
            "Keeps every table within its freshness window: requests the capture and the tables whose automation "
            "condition (derived from their freshness policy) is due, as one run. Running unless CDC_CAPTURE_CRON, "
            "CDC_CAPTURE_INTERVAL_SECONDS or CDC_CONTINUOUS chooses another mode."
        ),
    )
