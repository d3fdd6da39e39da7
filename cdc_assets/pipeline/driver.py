"""The one driver of the pipeline: capture → change logs → current state → checks (→ sinks), free of Dagster.

Every way the lakehouse is brought up to date runs `drive`: `cdc-lakehouse sync` (its run, and the child it forks
before Dagster is imported), the continuous mode (`until=Forever(...)`), the asset runs the schedule, the sensors
and the UI launch, the new-tables job, and a rewrite's catch-up. Each step is the stage's own function
(`capture`, `process_new_batches`, `apply_pending`, the checks' comparisons, `publish`), so the exactly-once
argument is theirs: the checkpoint moves only past a durable batch, each change log keeps only changes above its
`_cdc_seq` watermark, each current-state table only changes above its applied seq. A run stopped between two
steps is resumed by another from the lakehouse's own progress (what a sync's run does for the steps its child did
not report: `remaining`).

The blocking rules (`blocking=True`, a sync's and the asset runs'): a broken raw-batch chain stops the run before
the stages, a duplicate `_cdc_seq` in a change log stops it before current state; the report of the step that
found it says so (`blocks`) and is the last one.

`drive` yields a report after each step, plain dataclasses the callers record (the Dagster layer as materializations,
check evaluations and metadata; a sync's child sends them to its run through a pipe): `Captured`, `Pending` (the
tables the stages take), `ChangesLogged`, `CurrentApplied` (with each applied table's facts), `Checked`, `Published`;
run for ever, also `CycleEnded` after a cycle that did work and `Idle` after one that found nothing to do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pymysql

from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.capture.run import CaptureReport, capture
from cdc_assets.capture.spool import remove_orphaned_spools
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import SourceSettings
from cdc_assets.lake.layout import CAPTURE_LOCK, CHANGES_LOCK, CURRENT_LOCK, CURRENT_STAGE, RAW
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.quarantine import quarantined_tables
from cdc_assets.lake.state import known_tables, load_checkpoint, tables_behind
from cdc_assets.lake.store import Lakehouse
from cdc_assets.lake.table_facts import TableFacts, table_facts
from cdc_assets.repair.run import repaired_after
from cdc_assets.sinks.settings import SinkSettings
from cdc_assets.source import server as source_server
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.changes.run import missing_change_logs, process_new_batches
from cdc_assets.stages.current.apply import missing_current_tables
from cdc_assets.stages.current.run import apply_pending
from cdc_assets.stages.current.steps import CurrentReport
from cdc_assets.stages.follow import CONTINUOUS_OWNER
from cdc_assets.verification.changed_keys import compare_changed
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.integrity import chain_checked_from, duplicate_seqs
from cdc_assets.verification.lag import lags_now
from cdc_assets.verification.schema_match import schema_differences
from spark_resources.engine import Transforms, TransformsFor

CAPTURE, CHANGES, CURRENT, CHECKS, SINKS = "capture", "changes", "current", "checks", "sinks"
STEPS = (CAPTURE, CHANGES, CURRENT, CHECKS, SINKS)  # the order every run takes them in
SYNC_STEPS = (CAPTURE, CHANGES, CURRENT, CHECKS)  # a sync's (the sinks publish in runs of their own)
TABLE_STEPS = (CHANGES, CURRENT, CHECKS, SINKS)  # the steps that work on the tables pending
DEFAULT_POLL_SECONDS = 0.5


def on_arrow(_changes: int) -> Transforms:
    """The engine choice of a run that stays in its process whatever its size (a rewrite's catch-up)."""
    return Transforms()


# -- when a run stops ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToBinlogEnd:
    """One pass: capture up to the binlog end as of the run's start, then the steps after it once."""


@dataclass(frozen=True)
class ToPosition:
    """One pass: capture up to `position` (a transaction boundary, such as a snapshot's), then the steps after it."""

    position: BinlogPosition


@dataclass(frozen=True)
class Forever:
    """Cycles until `should_stop()` says so, asked only between two cycles (what was started is finished). A cycle
    with nothing to do waits `poll_seconds`, cut short once `wake` is set (the event a stop request sets)."""

    should_stop: Callable[[], bool]
    poll_seconds: float = DEFAULT_POLL_SECONDS
    wake: threading.Event = field(default_factory=threading.Event)


Until = ToBinlogEnd | ToPosition | Forever
TO_BINLOG_END = ToBinlogEnd()


# -- what each step reports ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """The capture: its report, and with the blocking rules, raw_batches_contiguous's findings from `chain_from`
    (the run's first batch, or the last one when it added none; None: the lakehouse has none)."""

    capture: CaptureReport
    chain_from: str | None = None
    breaks: list[str] | None = None  # None: not looked at (no blocking rules)
    step: ClassVar[str] = CAPTURE

    @property
    def blocks(self) -> bool:
        return bool(self.breaks)


@dataclass(frozen=True)
class Pending:
    """The tables the stages take, in the lakehouse's order (none: the run is over)."""

    tables: list[str]
    step: ClassVar[str] = "pending"
    blocks: ClassVar[bool] = False


@dataclass(frozen=True)
class ChangesLogged:
    """The change-log stage over `tables`, and with the blocking rules the duplicate `_cdc_seq`s per table
    (change_log_seq_unique; None: not looked at)."""

    tables: list[str]
    changes: ChangesReport
    duplicates: dict[str, int] | None = None
    step: ClassVar[str] = CHANGES

    @property
    def blocks(self) -> bool:
        return bool(self.duplicates)


@dataclass(frozen=True)
class CurrentApplied:
    """The current-state stage, and the facts of each table it applied (read from its Delta log right after:
    what its own asset records)."""

    current: CurrentReport
    facts: dict[str, TableFacts]
    step: ClassVar[str] = CURRENT
    blocks: ClassVar[bool] = False


@dataclass(frozen=True)
class Checked:
    """The checks of `tables` against the source: the comparisons of the keys changed since each was last found
    equal, the schemas that differ (by table), and every table's lag in seconds."""

    tables: list[str]
    comparisons: list[ConsistentComparison]
    schema_problems: dict[str, str]
    lags: dict[str, float]
    step: ClassVar[str] = CHECKS
    blocks: ClassVar[bool] = False


@dataclass(frozen=True)
class Published:
    """What each sink published (sinks.publish.PublishReport)."""

    reports: list[Any]
    step: ClassVar[str] = SINKS
    blocks: ClassVar[bool] = False


@dataclass(frozen=True)
class CycleEnded:
    """A cycle of a run for ever that did work: its number, the tables it brought up to date, its seconds."""

    number: int
    tables: list[str]
    seconds: float
    step: ClassVar[str] = "cycle"
    blocks: ClassVar[bool] = False


@dataclass(frozen=True)
class Idle:
    """A cycle of a run for ever that found nothing to do, and the binlog position everything is captured up to
    (the quiet tables are current through it; None before the first capture)."""

    position: str | None
    step: ClassVar[str] = "idle"
    blocks: ClassVar[bool] = False


StepReport = Captured | Pending | ChangesLogged | CurrentApplied | Checked | Published | CycleEnded | Idle


# -- the driver -------------------------------------------------------------------------------------------------------


def drive(
    source: SourceSettings | None,
    lakehouse: Lakehouse,
    *,
    owner: str,
    steps: Collection[str] = SYNC_STEPS,
    until: Until = TO_BINLOG_END,
    tables: Collection[str] | None = None,
    current_tables: Collection[str] | None = None,
    transforms: TransformsFor = on_arrow,
    log: Any | None = None,
    blocking: bool = True,
    journal: CaptureJournal | None = None,
    repairs_owed: bool = False,
    captured: CaptureReport | None = None,
    sinks: Sequence[SinkSettings] = (),
) -> Iterator[StepReport]:
    """Run `steps` in the pipeline's order, yielding a report after each.

    `source` and `lakehouse` are the pipeline's settings as a run holds them: `Settings.source` (capture and the
    checks read it; None for a run of the stages alone) and the Lakehouse built from `Settings.lakehouse`, which
    carries those to every stage (a Dagster run gets both from its resources, a sync's child from its Settings). `tables`:
    the tables the stages take (default: those pending, `pending_tables`; run for ever, those a stopped run left
    behind at the first cycle and those each capture touched after); `current_tables`, a subset of them whose
    current state is applied (default: all). `transforms`: the engine for each stage run, by its size. `blocking`:
    the blocking rules. The capture step: `journal` lists its batches for a recorder (capture/journal.py),
    `repairs_owed` repairs the tables that owe one after it (a sync's, repair/run.py), `captured` is a capture done
    already (a repair's) that the step takes as its own. `sinks`: the sinks the sinks step publishes to.
    """
    chosen = set(steps)
    unknown = chosen - set(STEPS)
    if unknown:
        raise ValueError(f"unknown pipeline steps {sorted(unknown)}: the steps are {', '.join(STEPS)}")
    if chosen & {CAPTURE, CHECKS} and source is None:
        raise ValueError("capture and the checks read the source: give its settings")
    if isinstance(until, Forever):
        if CAPTURE not in chosen or tables is not None or captured is not None:
            raise ValueError("a run for ever captures each cycle and takes the tables each capture touched")
        yield from _forever(source, lakehouse, until, chosen, transforms, owner, log, blocking, sinks)
        return
    run = _Run(source, lakehouse, chosen, transforms, owner, log, blocking, sinks)
    position = until.position if isinstance(until, ToPosition) else None
    if CAPTURE in chosen:
        assert source is not None
        report = captured if captured is not None else capture(source, lakehouse, log=log, until=position, owner=owner, journal=journal)
        if repairs_owed:
            report = repaired_after(source, lakehouse, report, owner, log, journal)
        done = run.captured(report)
        yield done
        if done.blocks:
            return
    if not chosen & set(TABLE_STEPS):
        return
    taken = list(tables) if tables is not None else pending_tables(lakehouse, known_tables(lakehouse.store))
    yield from run.stages(taken, None if current_tables is None else list(current_tables))


def pending_tables(house: Lakehouse, ordered: list[str]) -> list[str]:
    """The tables with changes captured and not yet in current state, and those whose change log or current state
    was removed by hand, in the order of `ordered`."""
    pending = set(tables_behind(house.store, CURRENT_STAGE))
    pending |= set(quarantined_tables(house.store))  # in every run while held back, so that their own checks fail
    pending |= set(missing_current_tables(house, sorted(set(ordered) - pending)))
    pending |= set(missing_change_logs(house, sorted(set(ordered) - pending)))
    return [t for t in ordered if t in pending]


def remaining(reports: Iterable[StepReport], steps: Collection[str]) -> tuple[list[str], list[str] | None] | None:
    """What a run of `steps` that yielded `reports` (and stopped: killed, failed, or left the rest) did not get to:
    the steps left, in order, and the tables it was taking (None: not chosen yet). None when nothing is left: it
    was blocked, found no table pending, or did every step. Another run of the driver with those steps and tables
    resumes it from the lakehouse's own progress."""
    reports = list(reports)
    if any(r.blocks for r in reports):
        return None
    tables = next((r.tables for r in reports if isinstance(r, Pending)), None)
    if tables == []:
        return None
    done = {r.step for r in reports}
    rest = [s for s in STEPS if s in steps and s not in done]
    return (rest, tables) if rest else None


def bring_up_to_date(source: SourceSettings, lakehouse: Lakehouse, tables: Collection[str], owner: str, log: Any | None = None) -> None:
    """Capture, then the change logs and current state of `tables`, on Arrow and without the blocking rules: what
    a rewrite of a table's layers takes in first (stages/rewrite/run.py)."""
    for _ in drive(source, lakehouse, owner=owner, steps=(CAPTURE, CHANGES, CURRENT), tables=tables, log=log, blocking=False):
        pass


@dataclass
class _Run:
    """One run's settings, shared by its steps."""

    source: SourceSettings | None
    lakehouse: Lakehouse
    steps: set[str]
    transforms: TransformsFor
    owner: str
    log: Any | None
    blocking: bool
    sinks: Sequence[SinkSettings]

    def captured(self, report: CaptureReport) -> Captured:
        """The capture's report, with the raw batches' chain checked from the earliest batch it holds (those taken
        over from runs that ended before recording them too) when the blocking rules hold."""
        if not self.blocking:
            return Captured(report)
        names = [*(b.name for b in report.batches), *report.taken_over]
        since, breaks = chain_checked_from(self.lakehouse, min(names) if names else None)
        return Captured(report, since, breaks)

    def stages(self, tables: list[str], current_tables: list[str] | None) -> Iterator[StepReport]:
        """The steps after capture over `tables`, in order, each report yielded as the step is done."""
        log, owner = self.log, self.owner
        yield Pending(tables)
        if not tables:
            return
        house = self._kept_open()
        with self._write_locks():
            if CHANGES in self.steps:
                changes = process_new_batches(house, self.transforms, tables=tables, log=log, owner=owner)
                duplicates = duplicate_seqs(house, known_tables(house.store, tables)) if self.blocking else None
                logged = ChangesLogged(tables, changes, duplicates)
                yield logged
                if logged.blocks:
                    return  # change_log_seq_unique fails: nothing is applied past a duplicate
            if CURRENT in self.steps:
                applied = tables if current_tables is None else current_tables
                current = apply_pending(house, self.transforms, tables=applied, log=log, owner=owner)
                names = sorted(current.tables)
                facts = for_each_table(names, lambda t: table_facts(house, t))
                yield CurrentApplied(current, dict(zip(names, facts, strict=True)))
        if CHECKS in self.steps:  # no lock: a table kept open reads the commits since, another writer's too
            assert self.source is not None
            checked = known_tables(house.store, tables)
            comparisons = compare_changed(self.source, house, [TableRef.parse(t) for t in checked])
            yield Checked(checked, comparisons, schema_differences(self.source, house, checked), lags_now(self.source, house))
        if SINKS in self.steps and self.sinks:  # on the run's own lakehouse (tables kept open only when continuous)
            # the brokers' clients, imported only by a run that publishes
            from cdc_assets.sinks.publish import publish, publisher_for

            house = self.lakehouse
            yield Published([publish(sink, house, publisher_for(sink), owner=owner, log=log) for sink in self.sinks])


    def _kept_open(self) -> Lakehouse:
        """The lakehouse of one pass over the tables, each Delta table kept open from step to step
        (`Lakehouse.keeping_tables_open`: a table opened again reads only the commits since, not its whole log;
        issue 45): the change-log and current-state steps' and then the checks'. A continuous run keeps its tables
        open across its cycles already."""
        return self.lakehouse if self.lakehouse.keeps_tables_open else self.lakehouse.with_tables_kept_open()

    @contextmanager
    def _write_locks(self) -> Iterator[None]:
        """The change-log and current-state steps' locks, held across both steps (each stage takes its own again for
        free: they are re-entrant per thread and owner): no other writer commits to a table while they are held, so
        a table kept open moves only with this run's own commits. A continuous run holds them already."""
        writes = [(lock, purpose) for step, lock, purpose in WRITE_LOCKS if step in self.steps]
        if not writes or self.lakehouse.keeps_tables_open:
            yield
            return
        with ExitStack() as held:
            held.enter_context(self.lakehouse.faults_are_user_errors())  # a lock's storage down: one sentence
            for name, purpose in writes:
                held.enter_context(
                    lakehouse_lock(self.lakehouse, name, purpose, self.owner, self.lakehouse.lock_wait_seconds, log=self.log)
                )
            yield


# The locks of the steps that write Delta tables, in the order every holder of both takes them.
WRITE_LOCKS = ((CHANGES, CHANGES_LOCK, "change-log update"), (CURRENT, CURRENT_LOCK, "current-state update"))


def _forever(
    source: SourceSettings | None,
    lakehouse: Lakehouse,
    until: Forever,
    steps: set[str],
    transforms: TransformsFor,
    owner: str,
    log: Any | None,
    blocking: bool,
    sinks: Sequence[SinkSettings],
) -> Iterator[StepReport]:
    """The continuous mode's cycles: capture from the checkpoint to the binlog end when the binlog grew, then the
    stages of the tables the new batches touched (at the first cycle also every table a stopped or killed run left
    behind), until `until.should_stop()` says so between two cycles.

    The run holds the capture, change-log and current-state locks for its whole life (the locks are re-entrant per
    thread and owner, so the stage functions take them again for free): no scheduled capture, sensor run or `sync`
    runs beside it, and none of them has to start a run to find that out (`continuous_holder`: the owner names the
    continuous mode). It keeps the Delta tables it opens open between cycles (Lakehouse.keeping_tables_open: each
    open reads only the commits since, and a table made again is opened afresh)."""
    assert source is not None
    if not owner.startswith(CONTINUOUS_OWNER):
        raise ValueError(f"a continuous run's lock owner must start with {CONTINUOUS_OWNER!r}, not {owner!r}")
    wait = lakehouse.lock_wait_seconds
    with ExitStack() as held:
        with lakehouse.faults_are_user_errors():  # a lock's storage down: one sentence, as in `_Run._write_locks`
            for name, purpose in ((CAPTURE_LOCK, "capture"), *((lock, purpose) for _, lock, purpose in WRITE_LOCKS)):
                held.enter_context(lakehouse_lock(lakehouse, name, purpose, owner, wait, log=log))
        # What a capture killed earlier left behind, once: the cycles' captures skip the look (tidy=False).
        removed = len(remove_orphaned_spools()) + lakehouse.store.remove_partial_writes(RAW)
        if removed and log is not None:
            log.info(f"removed {removed} spool directories and partial uploads left by a capture that was stopped")
        watcher = _BinlogWatcher(source)
        held.callback(watcher.close)
        # the same Delta tables every cycle: kept open and brought up to date, not opened afresh each time
        lakehouse = held.enter_context(lakehouse.keeping_tables_open())
        run = _Run(source, lakehouse, steps, transforms, owner, log, blocking, sinks)
        number = 0
        while not until.should_stop():
            began = time.monotonic()
            number += 1
            behind: set[str] = set(tables_behind(lakehouse.store, CURRENT_STAGE)) if number == 1 else set()
            report: CaptureReport | None = None
            if number == 1 or watcher.grew(lakehouse):
                report = capture(source, lakehouse, log=log, owner=owner, tidy=False)
                watcher.reached(report.end)
                done = run.captured(report)
                yield done
                if done.blocks:
                    return
            tables = sorted(behind | set(report.tables if report else []))
            touched: set[str] = set()
            if tables:
                touched = set(tables)
                for step in run.stages(tables, None):
                    if isinstance(step, CurrentApplied):
                        touched |= set(step.current.tables)
                    yield step
                    if step.blocks:
                        return
            if touched or (report is not None and report.batches):
                yield CycleEnded(number, sorted(touched), time.monotonic() - began)
            else:
                yield Idle(None if watcher.end is None else str(watcher.end))
                until.wake.wait(until.poll_seconds)


class _BinlogWatcher:
    """Whether the source's binlog grew past what the last capture reached: one query on a kept connection,
    so an idle run for ever costs the source almost nothing."""

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
                self.conn = source_server.connect(self.settings.url)
            now = source_server.binlog_end(self.conn)
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
