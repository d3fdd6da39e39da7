"""How the tables are kept up to date: by default, freshness governs it through Dagster's declarative automation.

Each table's current state has a freshness policy (CDC_FRESHNESS_WARN/FAIL_MINUTES, or its glob's windows in
CDC_FRESHNESS_TABLES), and an automation condition derived from it: on a cron of half its warn window, with the
capture (`table_automation`). The raw batches' condition is the cron of the tightest table, once the source has
something new: the binlog position sensor (defs/sensors.py) records the external asset `[<source>/]binlog_position`
(a runless materialization) when the binlog has grown past the checkpoint (or changes wait to be applied), and the
capture is requested only at the first tick after such a record (`capture_automation`). A tick's capture and the tables due then are
requested together: Dagster's automation sensor makes one run of them (the capture, then one step of the tables),
however many tables are due. A table with a tighter window is updated more often.

Quiet when idle: while the binlog ends at the checkpoint, no run is launched. The same sensor keeps freshness and
lag reported without a run: it records the quiet tables' confirmations (as a capture does) and the tables' lag
checks as runless events.

Two other modes, for users who prefer them, switch the automation sensor off: the schedule mode (CDC_CAPTURE_CRON
or CDC_CAPTURE_INTERVAL_SECONDS set: capture on that cron or interval, and the raw-batch sensor applies what it
touched) and the continuous mode (CDC_CONTINUOUS=1).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from dagster import (
    AssetSelection,
    AssetSpec,
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
BINLOG_POSITION = "binlog_position"  # the external asset the binlog position sensor records: `[<source>/]binlog_position`


def binlog_position_spec(keys: SourceKeys, owners: Sequence[str] = ()) -> AssetSpec:
    """The source's binlog position, `[<source>/]binlog_position`: external (the source is not ours to write),
    recorded by the binlog position sensor without a run (a runless materialization, what Dagster's automation reads
    of an external asset), its data version the binlog end, only when the source has something new for the capture.
    The raw batches depend on it, so the automation captures only after it moved."""
    return AssetSpec(
        keys.asset_key(BINLOG_POSITION),
        group_name=keys.group_of("capture"),
        kinds={"mysql"},
        owners=list(owners),
        description=(
            "The source's binlog end, recorded (without a run) by the binlog position sensor when the binlog has grown "
            "past the capture's checkpoint, or captured changes wait to be applied: what the automation waits for before "
            "it requests a capture, so an idle source launches no run."
        ),
    )


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
    """Once the table's cron ticked since it was last updated (or confirmed), at the next capture: requested with the
    raw batches, in one run. Not on the raw batches' own updates: on an idle source the binlog position sensor
    confirms them without a run, which must not set the tables going (its source table, observed, is not waited for
    either)."""
    cron = update_cron(warn_minutes)
    with_capture = AutomationCondition.any_deps_match(AutomationCondition.will_be_requested()).ignore(source_tables(keys))
    return (AutomationCondition.cron_tick_passed(cron).since_last_handled() & with_capture).with_label(
        f"within {warn_minutes:g} min: on_cron({cron})"
    )


def capture_automation(warn_minutes: float) -> AutomationCondition:
    """The raw batches on the cron of the tightest table window, so capture runs ahead of every table, but only once
    the binlog position was recorded moving since the last capture (or confirmation): nothing new, no run."""
    cron = update_cron(warn_minutes)
    grew = AutomationCondition.any_deps_match(AutomationCondition.newly_updated()).since_last_handled()
    return (
        AutomationCondition.cron_tick_passed(cron).since_last_handled() & grew & ~AutomationCondition.in_progress()
    ).with_label(f"ahead of the tightest window ({warn_minutes:g} min): on_cron({cron}) once the binlog grew")


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
