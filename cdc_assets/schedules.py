"""Schedules: capture on a cron (CDC_CAPTURE_CRON, default every minute) and the per-table lag check."""

import os

from dagster import (
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES
from dagster._utils.schedules import is_valid_cron_string

from cdc_assets.errors import CdcUserError
from cdc_assets.jobs import STAGE_TAG, capture_job, lag_check_job
from cdc_assets.settings import DEFAULT_CAPTURE_CRON


def capture_cron() -> str:
    cron = os.environ.get("CDC_CAPTURE_CRON") or DEFAULT_CAPTURE_CRON
    if not is_valid_cron_string(cron):
        raise CdcUserError(f"CDC_CAPTURE_CRON={cron!r} is not a cron expression: use e.g. '* * * * *' (every minute).")
    return cron


def capture_in_progress(context: ScheduleEvaluationContext) -> str | None:
    """Why a new capture must wait: a capture run (from the schedule, the CLI or the UI) is queued or running."""
    runs = context.instance.get_runs(
        filters=RunsFilter(tags={STAGE_TAG: "capture"}, statuses=list(IN_PROGRESS_RUN_STATUSES)), limit=1
    )
    if not runs:
        return None
    return f"Capture run {runs[0].run_id[:8]} is {runs[0].status.value.lower()}; two captures never run at once."


def build_capture_schedule() -> ScheduleDefinition:
    @schedule(
        name="capture_schedule",
        job=capture_job,
        cron_schedule=capture_cron(),
        default_status=DefaultScheduleStatus.RUNNING,
        description=(
            "Captures new binlog changes into raw batches on a cron (CDC_CAPTURE_CRON, default every minute). A "
            "tick is skipped while another capture run is queued or running; the lakehouse's capture lock "
            "keeps captures apart even when they are started elsewhere."
        ),
    )
    def capture_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        busy = capture_in_progress(context)
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
