"""The continuous mode's loop, free of Dagster: capture what the binlog gained, take it into the change logs, apply
it to current state, and again, in one warm process.

Each cycle calls the very functions a batch run calls (`capture`, `process_new_batches`, `apply_pending`), so the
exactly-once argument is theirs: the checkpoint moves only past a durable batch, each change log keeps only changes
above its `_cdc_seq` watermark, each current-state table only changes above its applied seq. The follower holds the
capture, change-log and current-state locks for its whole life (the locks are re-entrant per thread and owner, so the stage
functions take them again for free): no scheduled capture, sensor run or `sync` runs beside it, and none of them
has to start a run to find that out. A stop is honoured only between cycles, so what was started is finished.
The follower keeps the Delta tables it opens open between cycles (Lakehouse.keeping_tables_open: each open reads
only the commits since, and a table made again is opened afresh).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pymysql

from cdc_assets.capture.run import CaptureReport, capture
from cdc_assets.capture.spool import remove_orphaned_spools
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import SourceSettings
from cdc_assets.lake.layout import CAPTURE_LOCK, CHANGES_LOCK, CURRENT_LOCK, CURRENT_STAGE, RAW
from cdc_assets.lake.locks import LockHolder, lakehouse_lock, read_holder
from cdc_assets.lake.state import load_checkpoint, tables_behind
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.run import apply_pending
from cdc_assets.stages.current.steps import CurrentReport
from spark_resources.engine import TransformsFor

CONTINUOUS_OWNER = "continuous mode"  # how the locks name the follower: what `sync` and the sensors look for
DEFAULT_POLL_SECONDS = 0.5


@dataclass
class Cycle:
    """What one cycle did: the capture, and the change logs and current-state tables it touched."""

    number: int
    capture: CaptureReport | None = None
    changes: ChangesReport | None = None
    current: CurrentReport | None = None
    tables: list[str] = field(default_factory=list)
    seconds: float = 0.0


def continuous_owner(run_id: str) -> str:
    """The lock owner text of a continuous run: starts with CONTINUOUS_OWNER."""
    return f"{CONTINUOUS_OWNER} (dagster run {run_id[:8]})"


def continuous_holder(lakehouse: Lakehouse) -> LockHolder | None:
    """The continuous mode holding this lakehouse now, or None."""
    holder = read_holder(lakehouse, CAPTURE_LOCK)
    return holder if holder is not None and holder.owner.startswith(CONTINUOUS_OWNER) else None


def refuse_beside_continuous(lakehouse: Lakehouse) -> None:
    """Raise one sentence when the continuous mode holds the lakehouse: a batch run would only wait for its locks."""
    holder = continuous_holder(lakehouse)
    if holder is not None:
        since = datetime.fromtimestamp(holder.acquired_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        where = f"{holder.owner} on host {holder.host}, pid {holder.pid}" if holder.pid > 0 else holder.owner
        raise CdcUserError(
            f"continuous mode is running (started {since} UTC, {where}): stop it with `cdc-lakehouse stop` or "
            "terminate its run in the UI, then retry."
        )


def follow(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    should_stop: Callable[[], bool],
    on_cycle: Callable[[Cycle], None],
    owner: str = CONTINUOUS_OWNER,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    log: Any | None = None,
    wake: threading.Event | None = None,
    on_idle: Callable[[str], None] | None = None,
) -> int:
    """Follow the binlog until `should_stop()` says so between two cycles; returns the number of cycles that did work.

    A cycle captures from the checkpoint to the binlog end (when the binlog grew), takes the new batches into the
    change logs of the tables they touched and applies them to those tables' current state; `on_cycle` hears what
    it did. The first cycle also takes in every table a stopped or killed run left behind. When the binlog has not
    grown, it waits `poll_seconds` (cut short once `wake` is set: the event a stop request sets) and looks again;
    `on_idle` then hears the binlog position everything is captured up to (the quiet tables are current through it).
    """
    if not owner.startswith(CONTINUOUS_OWNER):
        raise ValueError(f"a continuous run's lock owner must start with {CONTINUOUS_OWNER!r}, not {owner!r}")
    wait = lakehouse.lock_wait_seconds
    wake = wake or threading.Event()
    worked = 0
    with ExitStack() as held:
        for name, purpose in ((CAPTURE_LOCK, "capture"), (CHANGES_LOCK, "change-log update"), (CURRENT_LOCK, "current-state update")):
            held.enter_context(lakehouse_lock(lakehouse, name, purpose, owner, wait, log=log))
        # What a capture killed earlier left behind, once: the cycles' captures skip the look (tidy=False).
        removed = len(remove_orphaned_spools()) + lakehouse.store.remove_partial_writes(RAW)
        if removed and log is not None:
            log.info(f"removed {removed} spool directories and partial uploads left by a capture that was stopped")
        watcher = _BinlogWatcher(settings)
        held.callback(watcher.close)
        # the same Delta tables every cycle: kept open and brought up to date, not opened afresh each time
        lakehouse = held.enter_context(lakehouse.keeping_tables_open())
        number = 0
        while not should_stop():
            began = time.monotonic()
            number += 1
            cycle = Cycle(number)
            behind: set[str] = set(tables_behind(lakehouse.store, CURRENT_STAGE)) if number == 1 else set()
            if number == 1 or watcher.grew(lakehouse):
                cycle.capture = capture(settings, lakehouse, log=log, owner=owner, tidy=False)
                watcher.reached(cycle.capture.end)
            tables = sorted(behind | set(cycle.capture.tables if cycle.capture else []))
            if tables:
                cycle.changes = process_new_batches(lakehouse, transforms, tables=tables, log=log, owner=owner)
                cycle.current = apply_pending(lakehouse, transforms, tables=tables, log=log, owner=owner)
                cycle.tables = sorted(set(tables) | set(cycle.current.tables))
            cycle.seconds = time.monotonic() - began
            if cycle.tables or (cycle.capture is not None and cycle.capture.batches):
                worked += 1
                on_cycle(cycle)
            else:
                if on_idle is not None and watcher.end is not None:
                    on_idle(str(watcher.end))
                wake.wait(poll_seconds)
    return worked


class _BinlogWatcher:
    """Whether the source's binlog grew past what the last capture reached: one query on a kept connection,
    so an idle follower costs the source almost nothing."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self.conn: pymysql.Connection | None = None
        self.end: BinlogPosition | None = None

    def reached(self, end: BinlogPosition | None) -> None:
        self.end = end

    def grew(self, lakehouse: Lakehouse) -> bool:
        if self.end is None:
            checkpoint = load_checkpoint(lakehouse.store)
            self.end = checkpoint.position if checkpoint else None
        try:
            if self.conn is None:
                self.conn = source.connect(self.settings.url)
            now = source.binlog_end(self.conn)
        except pymysql.err.MySQLError:
            self.close()
            return True  # let the capture say what is wrong, in its own words
        return self.end is None or now != self.end

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except pymysql.err.Error:
                pass
            self.conn = None
