"""Schedules: capture on a cron (CDC_CAPTURE_CRON, every minute when it is turned on without one), the per-table lag
check, and the comparison of every row with the source (CDC_FULL_CHECK_CRON, default hourly).

The capture schedule is the schedule mode's (defs/automation.py): running when CDC_CAPTURE_CRON is set, otherwise
stopped, as the automation (or, with CDC_CAPTURE_INTERVAL_SECONDS, the binlog sensor) captures."""

from typing import Any

from dagster import (
    DagsterInvalidDefinitionError,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import DEFAULT_CAPTURE_CRON, CadenceSettings
from cdc_assets.defs.keys import CAPTURE_JOB, CAPTURE_LANE, EQUALITY_JOB, LAG_JOB, UNNAMED, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.runtime.queue import capture_in_progress

CAPTURE_SCHEDULE = "capture_schedule"
FULL_CHECK_SCHEDULE = "full_equality_schedule"
LAG_CHECK_SCHEDULE = "lag_check_schedule"


def build_capture_schedule(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> ScheduleDefinition:
    cron = cadence.capture_cron or DEFAULT_CAPTURE_CRON

    def _capture_tick(context: ScheduleEvaluationContext, **_given: Any) -> RunRequest | SkipReason:
        house = SourceResources(context, keys).lakehouse.get()
        busy = capture_in_progress(context.instance, house, keys.lane(CAPTURE_LANE))
        if busy:
            return SkipReason(busy)
        return RunRequest()

    try:
        return schedule(
            name=keys.qualified(CAPTURE_SCHEDULE),
            job_name=keys.job(CAPTURE_JOB),
            required_resource_keys=keys.resource_keys("lakehouse"),
            cron_schedule=cron,
            default_status=DefaultScheduleStatus.RUNNING
            if cadence.capture_cron and cadence.capture_interval_seconds is None
            else DefaultScheduleStatus.STOPPED,
            description=(
                "Schedule mode: captures new binlog changes into raw batches on a cron (CDC_CAPTURE_CRON, every "
                "minute when turned on without it), and the raw-batch sensor applies them. Running when CDC_CAPTURE_CRON "
                "is set; by default the automation sensor captures ahead of the tightest freshness window instead. A "
                "tick is skipped while a capture holds the lakehouse's capture lock or a capture run waits to start."
            ),
        )(_capture_tick)
    except DagsterInvalidDefinitionError as exc:
        raise CdcUserError(
            f"CDC_CAPTURE_CRON={cron!r} is not a cron expression: use e.g. '* * * * *' (every minute)."
        ) from exc


def build_lag_check_schedule(keys: SourceKeys = UNNAMED, reported_without_run: bool = False) -> ScheduleDefinition:
    """The lag check job every minute. `reported_without_run`: the binlog position sensor records every check of the
    job itself, the tables' and the sinks', with no run (the automation mode), so the schedule is stopped: an idle
    source runs nothing."""
    return ScheduleDefinition(
        name=keys.qualified(LAG_CHECK_SCHEDULE),
        job_name=keys.job(LAG_JOB),
        cron_schedule="* * * * *",
        default_status=DefaultScheduleStatus.STOPPED if reported_without_run else DefaultScheduleStatus.RUNNING,
        description=(
            "Runs the per-table lag check every minute, so a table falling behind is named even if nothing runs. "
            "Stopped in the automation mode: the binlog position sensor records the tables' and the sinks' lag every "
            "minute without a run."
        ),
    )


def build_full_check_schedule(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> ScheduleDefinition:
    """The comparison of every row (job check_equality) on CDC_FULL_CHECK_CRON: the checks after applies compare
    only the keys they changed, and this cadence bounds how long a difference elsewhere can go unnamed."""
    cron = cadence.full_check_cron
    try:
        return ScheduleDefinition(
            name=keys.qualified(FULL_CHECK_SCHEDULE),
            job_name=keys.job(EQUALITY_JOB),
            cron_schedule=cron,
            default_status=DefaultScheduleStatus.RUNNING,
            description=(
                "Compares every row of every current-state table with the source (CDC_FULL_CHECK_CRON, default "
                "hourly): what the checks after each apply, which compare only the keys it changed, cannot see."
            ),
        )
    except DagsterInvalidDefinitionError as exc:
        raise CdcUserError(
            f"CDC_FULL_CHECK_CRON={cron!r} is not a cron expression: use e.g. '0 * * * *' (every hour)."
        ) from exc
