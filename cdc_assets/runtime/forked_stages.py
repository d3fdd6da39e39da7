"""What a `cdc-lakehouse sync`'s forked child does once its capture is durable: the change logs and current state of
the tables pending, and the Dagster-free halves of their checks, while the parent is still importing Dagster and
starting the run (cdc_assets.runtime.forked_capture). This module imports nothing of Dagster.

Each step is the very function the run's op would call, with the same tables, the same locks and the run as their
owner; the child sends the op each step's report as soon as the step is done (kinds `tables`, `changes`, `current` with each table's facts for its own asset, `checks`), and the op records
them as if it had run the step (cdc_assets.defs.sync). A step the child did not report, because it was killed,
failed, or left it to the run, the op does itself: each stage resumes from the lakehouse's own progress (change-log
watermarks, applied seqs), so a child killed in a stage leaves what a sync killed there leaves.

The child leaves the stages to the run when the run would do them differently: when the raw batches' chain is broken
(the run's blocking check stops it before the stages), and when a stage would take Spark (`CDC_SPARK_MIN_ROWS`, the
run's engine choice: its session is a Dagster resource). It stops after the change logs when one has a duplicate
seq (the run's blocking check then fails before current state).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from cdc_assets.capture.run import CaptureReport
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.settings import SourceSettings, spark_min_rows
from cdc_assets.lake.layout import CURRENT_STAGE
from cdc_assets.lake.quarantine import RunWide, quarantined_tables
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import known_tables, tables_behind
from cdc_assets.lake.store import Lakehouse
from cdc_assets.lake.table_facts import table_facts
from cdc_assets.stages.changes.run import missing_change_logs, process_new_batches
from cdc_assets.stages.current.apply import missing_current_tables
from cdc_assets.stages.current.run import apply_pending
from cdc_assets.verification.changed_keys import compare_changed
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets.verification.lag import lags_now
from cdc_assets.verification.schema_match import schema_differences
from spark_resources.engine import DEFAULT_SPARK_MIN_ROWS, Transforms
from spark_resources.session import DEFAULT_SPARK_MASTER

Send = Callable[[str, Any], None]  # one message to the op: its kind and value (the child's log lines go with it)


class LeftToRun(RunWide):
    """A stage the run would take on Spark: the child leaves it, and what follows, to the run (and says so first, so
    that the parent starts the Spark session while it is still starting the run)."""


def pending_tables(house: Lakehouse, ordered: list[str]) -> list[str]:
    """The tables with changes captured and not yet in current state, and those whose change log or current state
    was removed by hand, in the order of `ordered`."""
    pending = set(tables_behind(house.store, CURRENT_STAGE))
    pending |= set(quarantined_tables(house.store))  # in every run while held back, so that their own checks fail
    pending |= set(missing_current_tables(house, sorted(set(ordered) - pending)))
    pending |= set(missing_change_logs(house, sorted(set(ordered) - pending)))
    return [t for t in ordered if t in pending]


def arrow_only(min_rows: int) -> Callable[[int], Transforms]:
    """The run's engine choice (spark_resources.engine.choose_transforms), with Spark's side left to the run."""

    def transforms(changes: int) -> Transforms:
        if changes >= min_rows:
            raise LeftToRun(f"{changes} changes take Spark (CDC_SPARK_MIN_ROWS={min_rows})")
        return Transforms(None)

    return transforms


def run_min_rows() -> int:
    """The CDC_SPARK_MIN_ROWS the run's resources read (defs/resources.py)."""
    return spark_min_rows(os.environ.get("CDC_SPARK_MASTER") or DEFAULT_SPARK_MASTER, DEFAULT_SPARK_MIN_ROWS)


def chain_broken(house: Lakehouse, report: CaptureReport) -> bool:
    """Whether raw_batches_contiguous would fail for this capture (the run checks from its first batch, which may be
    a later one than here when batches taken over were recorded after all: checking from the earliest covers it)."""
    names = [*(b.name for b in report.batches), *report.taken_over]
    since = min(names) if names else None
    if since is None:
        batches = list_batches(house.store)
        since = batches[-1] if batches else None
    return bool(batch_chain_breaks(house, since))


def run_stages(settings: SourceSettings, house: Lakehouse, report: CaptureReport, owner: str, log: Any, send: Send) -> None:
    """The sync's stages and checks after `report`'s capture, each step's report sent as soon as it is durable."""
    try:
        if chain_broken(house, report):
            send("left", "the raw batches' chain has a break")
            return
        transforms = arrow_only(run_min_rows())
        tables = pending_tables(house, known_tables(house.store))
        send("tables", tables)
        if not tables:
            return
        changes = process_new_batches(house, transforms, tables=tables, log=log, owner=owner)
        duplicates = duplicate_seqs(house, known_tables(house.store, tables))
        send("changes", (changes, duplicates))
        if duplicates:
            return  # the run's blocking check fails: no current state
        current = apply_pending(house, transforms, tables=tables, log=log, owner=owner)
        names = sorted(current.tables)  # what the run reads for each table's own asset, read here
        send("current", (current, dict(zip(names, for_each_table(names, lambda t: table_facts(house, t)), strict=True))))
        checked = known_tables(house.store, tables)
        comparisons = compare_changed(settings, house, [TableRef.parse(t) for t in checked])
        send("checks", (comparisons, schema_differences(settings, house, checked), lags_now(settings, house)))
    except LeftToRun as exc:
        send("spark", str(exc))  # the parent starts the run's session now, beside Dagster's import and the run's start
        send("left", str(exc))
    except CdcUserError as exc:
        send("user_error", str(exc))
    except Exception as exc:
        send("failed", f"{type(exc).__name__}: {exc}")
