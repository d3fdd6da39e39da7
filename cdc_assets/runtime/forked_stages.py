"""What a `cdc-lakehouse sync`'s forked child runs: the pipeline's one driver (cdc_assets/pipeline/driver.py), its
capture and then, while the parent is still importing Dagster and starting the run (cdc_assets.runtime.forked_capture),
the change logs and current state of the tables pending and the Dagster-free halves of their checks. This module
imports nothing of Dagster.

The driver runs with the same tables, the same locks and the run as their owner as in the run's op; the child sends
the op each step's report as the driver yields it (message `step`), and the op records them as if it had run the step
(cdc_assets.defs.sync). The steps the child did not report, because it was killed, failed, or left them to the run,
the op runs the driver for itself (`pipeline.driver.remaining`): each stage resumes from the lakehouse's own progress
(change-log watermarks, applied seqs), so a child killed in a stage leaves what a sync killed there leaves.

The driver's blocking rules end the child's run where they end the run's: after the capture when the raw batches'
chain is broken, after the change logs when one has a duplicate seq (the run's blocking check then fails). The child
leaves a stage, and what follows, to the run when it would take Spark (`CDC_SPARK_MIN_ROWS`, the run's engine
choice: its session is a Dagster resource).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.core import work_tally
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings
from cdc_assets.lake.quarantine import RunWide
from cdc_assets.lake.store import lakehouse_from
from cdc_assets.pipeline.driver import CAPTURE, SYNC_STEPS, drive
from cdc_assets.source.server import resolved_source
from spark_resources.engine import Transforms

Send = Callable[[str, Any], None]  # one message to the op: its kind and value (the child's log lines go with it)


class LeftToRun(RunWide):
    """A stage the run would take on Spark: the child leaves it, and what follows, to the run (and says so first, so
    that the parent starts the Spark session while it is still starting the run)."""


def arrow_only(min_rows: int) -> Callable[[int], Transforms]:
    """The run's engine choice (spark_resources.engine.choose_transforms), with Spark's side left to the run."""

    def transforms(changes: int) -> Transforms:
        if changes >= min_rows:
            raise LeftToRun(f"{changes} changes take Spark (CDC_SPARK_MIN_ROWS={min_rows})")
        return Transforms(None)

    return transforms


def run_driver(settings: Settings, owner: str, journal: CaptureJournal, log: Any, send: Send, stages: bool = True) -> None:
    """The sync's driver (its capture, and with `stages` what follows it), each step's report sent as soon as the
    step is done, preceded by the work it took (`work`: the child's `core.work_tally` since the last, which the op
    adds to its own and counts to the step). How it ended, when the driver did not end on its own: `user_error` (a sentence for the user),
    `failed`, or `left` (a stage left to the run's Spark, said first as `spark`: the parent starts the session now)."""
    counted = work_tally.snapshot()  # the parent's, copied by the fork: not this child's work

    def send_work() -> None:
        nonlocal counted
        now = work_tally.snapshot()
        send("work", now - counted)
        counted = now

    try:
        # the sync's own settings, as the run's resources are built from them (defs/resources.resources_of)
        source, house = resolved_source(settings.source), lakehouse_from(settings.lakehouse)
        steps = SYNC_STEPS if stages else (CAPTURE,)
        transforms = arrow_only(settings.engine.spark_min_rows)
        for step in drive(
            source, house, owner=owner, steps=steps, transforms=transforms, log=log, journal=journal, repairs_owed=True
        ):
            send_work()  # first: the op counts the work up to a report to that report's step
            send("step", step)
    except LeftToRun as exc:
        send_work()
        send("spark", str(exc))  # the parent starts the run's session now, beside Dagster's import and the run's start
        send("left", str(exc))
    except CdcUserError as exc:
        send_work()
        send("user_error", str(exc))
    except Exception as exc:
        send_work()
        send("failed", f"{type(exc).__name__}: {exc}")
