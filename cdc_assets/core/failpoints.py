"""Failpoints: named places at the pipeline's durable steps where a test makes it crash or fail on purpose.

Off, a failpoint costs one dict lookup. On, it does what it was armed with:

- `exit`: end the process at once (`os._exit`), as a SIGKILL or a power cut would: nothing is flushed, no
  `finally` runs;
- `kill`: SIGKILL the process itself: unlike `exit`, which a `sync`'s forked child passes on to its parent (the
  two stand for one command), a child killed goes unseen by the parent but for its missing reports, and the parent's
  run does what the child left;
- `ioerror` / `enospc`: raise an OSError (EIO / ENOSPC) there, as a failing or full disk would;
- `sleep:S`: wait S seconds (a slow step, so another process can act meanwhile);
- in-process tests may also arm a callable, run right there (say, a second writer's whole commit).

`CDC_FAILPOINTS="name=action,name=action@N"` arms them for a process (so tests arm a `cdc-lakehouse` child);
`@N` fires on the Nth time the point is reached (default the first). `arm()` arms one in this process.
`CDC_CHILD_FAILPOINTS` arms more, the same way, in a `sync`'s forked child only (cdc_assets/runtime/forked_capture.py),
so a test can kill the child at a point its parent then passes too.
Every name is listed in FAILPOINTS, each documented in docs/architecture.md with why recovery is correct.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ENV = "CDC_FAILPOINTS"
CHILD_ENV = "CDC_CHILD_FAILPOINTS"  # armed in a sync's forked child only
EXIT_CODE = 77  # what a process ended at a failpoint exits with

FAILPOINTS = frozenset(
    {
        # capture (cdc_assets/capture/run.py, lake/raw_batches.py): a raw batch and the state that follows it
        "capture.transaction_spilled",  # a huge transaction has spilled rows to the local spool
        "capture.upload_part",  # a multipart upload of a batch's data is under way (S3)
        "capture.batch_data_written",  # a batch's data file is written, its manifest (what makes it visible) not
        "capture.manifest_written",  # a batch is visible, the registry and the checkpoint do not know it
        "capture.registry_saved",  # the registry names the batch's tables, the checkpoint is not past it
        "capture.schemas_written",  # the table shapes at the batch's end are written, the checkpoint names the old
        "capture.checkpoint_saved",  # the checkpoint is past a batch, the next batch is not read yet
        # change-log stage (cdc_assets/stages/changes/run.py, change_log.py, change_plan.py)
        "changes.before_commit",  # a table's append: watermark read, commit not yet made
        "changes.log_rewritten",  # a column's type changed: the log is rewritten to the wider type, not appended to
        "changes.table_appended",  # one table's append is committed, other tables of the run not yet
        "changes.appended_before_progress",  # every table's append of a chunk is committed, no progress saved
        "changes.progress_partly_saved",  # one table's change-log progress is saved, others not yet
        "changes.compacting",  # a change log's append is committed, its small files not compacted yet
        # current-state stage (cdc_assets/stages/current/run.py, apply.py)
        "current.table_merged",  # one table's merge is committed, other tables' steps not yet
        "current.keyless_before_commit",  # a keyless table's copies are counted against a version, not committed
        "current.truncate_before_commit",  # a merge that also removes the rows before a TRUNCATE, not committed
        "current.alter_before_commit",  # an ALTER's rewrite of the table is written, not committed
        "current.altered",  # an ALTER's rewrite is committed, the table's later steps and progress not yet
        "current.drop_log_removed",  # a DROP: the Delta log of the table is removed, its data files not yet
        "current.compacting",  # a merge is committed, the table's small files not compacted yet
        "current.merged_before_progress",  # every step of the run is committed, no progress saved
        "current.progress_partly_saved",  # one table's current-state progress is saved, others not yet
        "history.before_commit",  # a history table's new versions are computed, their commit not yet made
        "history.before_seed_commit",  # a snapshot's rows compared with the open versions, a seed commit not yet made
        # snapshots (cdc_assets/stages/snapshot/run.py on Arrow; on_spark.py and spark_tasks.py there on Spark)
        "snapshot.reading",  # a snapshot has spooled a chunk of a table's rows, the rest is unread
        "snapshot.captured",  # the rows are read and capture has reached the snapshot's position, nothing loaded
        "snapshot.overwritten",  # a table's current state is overwritten at the snapshot's seq, its progress not saved
        "snapshot.chunk_written",  # a Spark snapshot task has written and recorded a chunk (in the executor)
        # a table's rows rewritten in every layer (cdc_assets/stages/rewrite, lake/raw_batches.py): `cdc-lakehouse forget`
        "rewrite.raw_data_written",  # a raw batch's new data file is written, its manifest still names the old one
        "rewrite.raw_manifest_switched",  # a raw batch's manifest names the new data, the old data file not deleted
        "rewrite.layer_committed",  # a Delta table's rewrite is committed, its old versions' files and log not purged
        "rewrite.layer_vacuumed",  # a Delta table's old files are vacuumed, its log before a new checkpoint not removed
        "forget.layers_rewritten",  # every layer of a forget is rewritten, its record not yet marked done
        # the rest of the product
        "sinks.published_unconfirmed",  # RabbitMQ: a window is published, its confirms not yet received
        "sinks.window_acknowledged",  # a sink's window is acknowledged by the broker, its checkpoint not yet saved
        "verify.in_snapshot",  # the source's consistent snapshot is open, its tables not read yet
    }
)


@dataclass
class _Armed:
    action: str | Callable[[], None]
    on_hit: int = 1
    hits: int = 0


_armed: dict[str, _Armed] = {}


def _parse(text: str) -> dict[str, _Armed]:
    armed = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if name not in FAILPOINTS or not action:
            raise ValueError(f"{ENV}: {item!r} is not name=action for a known failpoint")
        armed[name] = _Armed(action, int(nth) if nth else 1)
    return armed


_armed.update(_parse(os.environ.get(ENV, "")))


def arm_from(variable: str) -> None:
    """Arm, in this process, the failpoints the environment variable `variable` names (e.g. CHILD_ENV in a child)."""
    _armed.update(_parse(os.environ.get(variable, "")))


def is_armed(name: str) -> bool:
    return name in _armed


def hit(name: str) -> None:
    """The pipeline passes failpoint `name`: nothing happens unless it is armed."""
    if not _armed:
        return
    armed = _armed.get(name)
    if armed is None:
        return
    armed.hits += 1
    if armed.hits != armed.on_hit:
        return
    action = armed.action
    if callable(action):
        action()
    elif action == "exit":
        os._exit(EXIT_CODE)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "ioerror":
        raise OSError(errno.EIO, f"Input/output error (failpoint {name})")
    elif action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (failpoint {name})")
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    else:
        raise ValueError(f"failpoint {name}: unknown action {action!r}")


@contextmanager
def arm(name: str, action: str | Callable[[], None], on_hit: int = 1) -> Iterator[_Armed]:
    """Arm one failpoint in this process for the block; yields its state (`hits`)."""
    if name not in FAILPOINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    armed = _Armed(action, on_hit)
    _armed[name] = armed
    try:
        yield armed
    finally:
        if _armed.get(name) is armed:
            del _armed[name]
