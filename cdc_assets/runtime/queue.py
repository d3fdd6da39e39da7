"""What is running or waiting to run: schedules and sensors ask before they request a run, so runs do not pile
up behind a lock."""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from cdc_assets.lake.layout import CAPTURE_LOCK
from cdc_assets.lake.locks import read_holder
from cdc_assets.lake.store import Lakehouse
from cdc_assets.runtime.instance import QUEUE_TAG
from cdc_assets.stages.follow import CONTINUOUS_OWNER

WAITING_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]


def capture_in_progress(instance: DagsterInstance, lakehouse: Lakehouse, capture_lane: str) -> str | None:
    """Why a new capture must wait: one holds the lakehouse's capture lock (started by the schedule, the CLI,
    the UI or another machine), or a capture run of this source is already waiting to start: a run tagged with its
    capture lane (`capture_lane`, the `cdc/queue` value `<source>/capture` of defs/keys.SourceKeys.lane), so another
    source's waiting capture never holds this one back.

    The lock, not the run's status, says whether a capture is running: a process killed mid-capture
    leaves its run marked as started, but the lock is released with it.
    """
    holder = read_holder(lakehouse, CAPTURE_LOCK)
    if holder is not None and holder.owner.startswith(CONTINUOUS_OWNER):
        return f"The continuous mode is running ({holder.describe()}): it captures and applies everything itself."
    if holder is not None:
        return f"A capture is running ({holder.describe()}); two captures never run at once."
    runs = instance.get_runs(filters=RunsFilter(tags={QUEUE_TAG: capture_lane}, statuses=WAITING_STATUSES), limit=1)
    if runs:
        return f"Capture run {runs[0].run_id[:8]} is {runs[0].status.value.lower()}; two captures never run at once."
    return None
