"""What is running or waiting to run: schedules and sensors ask before they request a run, so runs do not pile
up behind a lock."""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from cdc_assets.lake.layout import CAPTURE_LOCK
from cdc_assets.lake.locks import read_holder
from cdc_assets.lake.store import Lakehouse
from cdc_assets.runtime.instance import STAGE_TAG
from cdc_assets.stages.follow import CONTINUOUS_OWNER

WAITING_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]


def capture_in_progress(instance: DagsterInstance, lakehouse: Lakehouse) -> str | None:
    """Why a new capture must wait: one holds the lakehouse's capture lock (started by the schedule, the CLI,
    the UI or another machine), or a capture run is already waiting to start.

    The lock, not the run's status, says whether a capture is running: a process killed mid-capture
    leaves its run marked as started, but the lock is released with it.
    """
    holder = read_holder(lakehouse, CAPTURE_LOCK)
    if holder is not None and holder.owner.startswith(CONTINUOUS_OWNER):
        return f"The continuous mode is running ({holder.describe()}): it captures and applies everything itself."
    if holder is not None:
        return f"A capture is running ({holder.describe()}); two captures never run at once."
    runs = instance.get_runs(filters=RunsFilter(tags={STAGE_TAG: "capture"}, statuses=WAITING_STATUSES), limit=1)
    if runs:
        return f"Capture run {runs[0].run_id[:8]} is {runs[0].status.value.lower()}; two captures never run at once."
    return None
