"""Schedules: capture on a cron (CDC_CAPTURE_CRON, default every minute) and the per-table lag check.

With CDC_CAPTURE_INTERVAL_SECONDS set, capture runs continuously instead (the binlog sensor, sensors.py) and
the capture schedule starts switched off."""

import os

from dagster import (
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SkipReason,
    schedule,
)
from dagster._utils.schedules import is_valid_cron_string

from cdc_assets.errors import CdcUserError
from cdc_assets.jobs import STAGE_TAG, capture_job, lag_check_job
from cdc_assets.lakehouse import Lakehouse
from cdc_assets.locks import read_holder
from cdc_assets.resources import LakehouseResource
from cdc_assets.settings import DEFAULT_CAPTURE_CRON, env_number
from cdc_assets.stages import CAPTURE_LOCK


def capture_cron() -> str:
    cron = os.environ.get("CDC_CAPTURE_CRON") or DEFAULT_CAPTURE_CRON
    if not is_valid_cron_string(cron):
        raise CdcUserError(f"CDC_CAPTURE_CRON={cron!r} is not a cron expression: use e.g. '* * * * *' (every minute).")
    return cron


def capture_interval() -> float | None:
    """CDC_CAPTURE_INTERVAL_SECONDS: how often the binlog sensor looks for new changes (None: capture on the cron)."""
    if not os.environ.get("CDC_CAPTURE_INTERVAL_SECONDS"):
        return None
    return env_number("CDC_CAPTURE_INTERVAL_SECONDS", 10, lambda s: s >= 1, "a number of seconds of at least 1")


WAITING_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]


def capture_in_progress(context: ScheduleEvaluationContext | SensorEvaluationContext, lakehouse: Lakehouse) -> str | None:
    """Why a new capture must wait: one holds the lakehouse's capture lock (started by the schedule, the CLI,
    the UI or another machine), or a capture run is already waiting to start.

    The lock, not the run's status, says whether a capture is running: a process killed mid-capture
    leaves its run marked as started, but the lock is released with it.
    """
    holder = read_holder(lakehouse, CAPTURE_LOCK)
    if holder is not None:
        return f"A capture is running ({holder.describe()}); two captures never run at once."
    runs = context.instance.get_runs(filters=RunsFilter(tags={STAGE_TAG: "capture"}, statuses=WAITING_STATUSES), limit=1)
    if runs:
        return f"Capture run {runs[0].run_id[:8]} is {runs[0].status.value.lower()}; two captures never run at once."
    return None


def build_capture_schedule() -> ScheduleDefinition:
    @schedule(
        name="capture_schedule",
        job=capture_job,
        cron_schedule=capture_cron(),
        default_status=DefaultScheduleStatus.RUNNING if capture_interval() is None else DefaultScheduleStatus.STOPPED,
        description=(
            "Captures new binlog changes into raw batches on a cron (CDC_CAPTURE_CRON, default every minute). A "
            "tick is skipped while a capture holds the lakehouse's capture lock or a capture run waits to start; "
            "the lock also keeps apart captures started elsewhere."
        ),
    )
    def capture_schedule(context: ScheduleEvaluationContext, lakehouse: LakehouseResource) -> RunRequest | SkipReason:
        busy = capture_in_progress(context, lakehouse.get())
        if busy:
            return SkipReason(busy)
        return RunRequest()

    return capture_schedule


lag_check_schedule = ScheduleDefinition(
    name="lag_check_schedule",
    job=lag_check_job,
    cron_schedule="* * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Runs the per-table lag check every minute, so a table falling behind is named even if nothing runs.",
)
