"""The current-state stage: every change log's pending changes applied to current/<schema>/<table>, in `_cdc_seq` order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core import failpoints
from cdc_assets.core.arrow import release_unused_memory, sorted_rows, where
from cdc_assets.core.errors import TableUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import CREATE, SCHEMA_OPS, TRUNCATE
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.progress import CURRENT_STATE, Update
from cdc_assets.core.progress import report as report_progress
from cdc_assets.core.shapes import TableShape, renamed_partners, with_rename_partners
from cdc_assets.lake.delta import APPLIED_SEQ_KEY, max_seq, row_count
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE, CURRENT, CURRENT_LOCK, CURRENT_STAGE, HISTORY
from cdc_assets.lake.locks import Lease, lakehouse_lock
from cdc_assets.lake.quarantine import TablesFailed, describe, of_the_table, quarantined_tables, run_isolated, settle
from cdc_assets.lake.state import TableProgress, known_tables, load_progress, save_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.rows import DDL_COLUMN
from cdc_assets.stages.current import apply as current_state
from cdc_assets.stages.current.apply import (
    ApplyResult,
    PendingTable,
    applied_seq,
    apply_changes,
    apply_keyless_changes,
    apply_schema_change,
    pending_at_most,
    read_pending,
)
from cdc_assets.stages.current.steps import (
    CurrentReport,
    SchemaStep,
    Step,
    independent_chains,
    record_outcomes,
    table_plan,
)
from cdc_assets.stages.history.run import keep_history
from spark_resources.engine import Transforms, TransformsFor, spark_phase


def table_steps(pending: PendingTable) -> list[Step]:
    """A table's pending changes split at its schema changes, each part under the version then in force
    (steps.table_plan, as on Spark)."""
    changes = sorted_rows(pending.changes, "_cdc_seq")
    if DDL_COLUMN not in changes.column_names:  # a log that never saw a schema change
        changes = changes.append_column(DDL_COLUMN, pa.nulls(changes.num_rows, pa.string()))
    seqs = changes.column("_cdc_seq")
    is_event = pc.is_in(changes.column("_cdc_op"), pa.array([*SCHEMA_OPS, TRUNCATE]))
    events = where(changes, is_event).select(["_cdc_seq", "_cdc_op", "_cdc_commit_ts", DDL_COLUMN]).to_pylist()
    data = where(changes, pc.invert(pc.is_in(changes.column("_cdc_op"), pa.array(SCHEMA_OPS))))
    after = pending.applied_seq if pending.applied_seq is not None else -1
    upto = int(pc.max(seqs).as_py()) if len(seqs) else after
    steps: list[Step] = []
    data_seqs = data.column("_cdc_seq")

    def holds_changes(lower: int, upper: int) -> bool:
        return bool(pc.any(pc.and_(pc.greater(data_seqs, lower), pc.less_equal(data_seqs, upper))).as_py() or False)

    for item in table_plan(events, pending.shape, after, upto, holds_changes):
        if isinstance(item, SchemaStep):
            steps.append(Step(item.seq, pending.table, change=item.change, commit_ts=item.commit_ts))
            continue
        seq = data.column("_cdc_seq")
        part = where(data, pc.and_(pc.greater(seq, item.after), pc.less_equal(seq, item.upto)))
        steps += _segment_steps(pending, item.shape, part, item.after)
    return steps


def _segment_steps(pending: PendingTable, version: TableShape, part: pa.Table, after: int) -> list[Step]:
    """Changes under one version: one step, or (index only) one per MAX_CHANGES_PER_MERGE changes, read later. A
    step sorts just after the event before it, as on Spark (its changes all come after `after`)."""
    if not part.num_rows:
        return []
    if not pending.index_only:
        segment = PendingTable(pending.table, version, part, pending.applied_seq)
        return [Step(after + 0.5, pending.table, segment=segment)]
    seqs = part.column("_cdc_seq")
    steps = []
    size = current_state.MAX_CHANGES_PER_MERGE
    for offset in range(0, len(seqs), size):
        window = seqs.slice(offset, size)
        low, high = int(window[0].as_py()), int(window[-1].as_py())
        segment = PendingTable(pending.table, version, part.slice(0, 0), pending.applied_seq, bounds=(low, high))
        steps.append(Step(low - 0.5, pending.table, segment=segment))
    return steps


def pending_tables(
    lakehouse: Lakehouse, changes_progress: dict[str, TableProgress], current_progress: dict[str, TableProgress]
) -> list[PendingTable]:
    """Tables whose change log has changes their current state has not taken in."""

    def read(name: str) -> PendingTable | None:
        shape = changes_progress[name].shape
        if shape is None:  # no change log yet
            return None
        return read_pending(lakehouse, TableRef.parse(name), shape, current_progress.get(name))

    return [p for p in for_each_table(changes_progress, read) if p is not None]


def _rename_partners(pending: list[PendingTable]) -> set[str]:
    """The other side of every RENAME among the pending schema changes."""
    details = (p.changes.column(DDL_COLUMN).drop_null().to_pylist() for p in pending if DDL_COLUMN in p.changes.column_names)
    return renamed_partners(json.loads(detail) for part in details for detail in part)


def apply_pending(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    tables: Collection[str] | None = None,
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
) -> CurrentReport:
    """Apply the pending changes of `tables` (default: all) to their current state, on the engine their size
    chooses.

    Holds the lakehouse's current-state lock so two runs never merge into the same table at once.
    A renamed table's rows move with it, so both sides of a RENAME are taken in together.
    """
    began = time.monotonic()
    report = CurrentReport()
    store = lakehouse.store
    wait = lakehouse.lock_wait_seconds
    with (
        lakehouse.faults_are_user_errors(),
        lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", owner, wait, log=log) as lease,
    ):
        targets = set(known_tables(lakehouse.store, tables))
        reached: dict[str, TableProgress] = {}
        current: dict[str, TableProgress] = {}
        dropped: dict[str, int | None] = {}

        def work(group: set[str]) -> None:
            _apply_to(lakehouse, transforms, group, reached, current, dropped, report, lease, log)

        # one table whose changes cannot be applied is quarantined; the others go on (lake/quarantine)
        failed = run_isolated(targets, quarantined_tables(store, (CURRENT,)), work, log)
        failed |= _keep_histories(lakehouse, targets - set(failed), lease, log)
        report.quarantined = settle(
            store, CURRENT, targets, failed, lambda t: applied_seq(lakehouse, TableRef.parse(t)), log
        )
        targets -= set(failed)
        failpoints.hit("current.merged_before_progress")
        lease.check()

        def saved(item: tuple[str, TableProgress]) -> None:
            table, progress = item
            before = current[table]
            floor = dropped[table] if table in dropped else before.dropped_seq
            present = lakehouse.has_table(CURRENT, TableRef.parse(table))
            # a drop empties the table for good: a table created after it owes nothing to an earlier snapshot
            snapshot = None if dropped.get(table) is not None else before.snapshot_seq
            save_progress(
                store, CURRENT_STAGE, table, TableProgress(progress.batch, None, floor, present, snapshot if present else None)
            )
            failpoints.hit("current.progress_partly_saved")

        # a quarantined table's progress stays where it was: every run tries it again from its applied seq
        for_each_table([(t, p) for t, p in reached.items() if p.batch is not None and t not in failed], saved)
        report.tables = sorted(targets)
    report.seconds = time.monotonic() - began
    return report


def _apply_to(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    targets: set[str],
    reached: dict[str, TableProgress],
    current: dict[str, TableProgress],
    dropped: dict[str, int | None],
    report: CurrentReport,
    lease: Lease,
    log: Any | None,
) -> None:
    """The pending changes of `targets` (and their rename partners) applied, on the engine their size chooses."""
    store = lakehouse.store
    pending: list[PendingTable] = []
    engine = transforms(_pending_estimate(lakehouse, targets))
    if engine.session is not None and any(t in lakehouse.soft_deletes for t in targets):
        engine = Transforms(None)  # soft deletes are applied by the Arrow merge only (docs/history.md: Soft deletes)
        if log is not None:
            log.info("current state: on Arrow, as CDC_SOFT_DELETES selects some of the run's tables")
    if engine.session is not None:  # on Spark no pending row is read here
        from cdc_assets.stages.current.on_spark import apply_on_spark  # pyspark loads only for a Spark run

        with spark_phase(engine.session, "current state", log) as session:
            apply_on_spark(lakehouse, session, targets, reached, current, report, lease, log, dropped)
        return

    def take_in(new: list[str]) -> set[str]:
        # What the change logs hold now; recorded as this stage's progress once it is applied.
        reached.update({t: load_progress(store, CHANGES_STAGE, t) for t in new})
        current.update({t: load_progress(store, CURRENT_STAGE, t) for t in new})
        pending.extend(pending_tables(lakehouse, {t: reached[t] for t in new}, current))
        return _rename_partners(pending)

    with_rename_partners(targets, take_in)
    if pending:
        _apply(lakehouse, pending, report, lease, log, dropped)


def _keep_histories(lakehouse: Lakehouse, targets: Collection[str], lease: Lease, log: Any | None) -> dict[str, BaseException]:
    """The history tables of the run's tables that CDC_HISTORY_TABLES selects, moved forward in the same run
    (before its progress is saved, so a crash in between applies them again: see stages/history). A history that
    cannot take in its table's changes holds back that table only (returned with its error), as its merge would."""
    selected = sorted(t for t in targets if t in lakehouse.history)
    failed: dict[str, BaseException] = {}

    def keep(name: str) -> str:
        lease.check()
        try:
            return keep_history(lakehouse, TableRef.parse(name), log)
        except Exception as exc:
            if not of_the_table(exc):
                raise
            failed[name] = TableUserError(
                f"its history could not take in its changes ({describe(exc)}); the history table "
                f"{HISTORY}/{TableRef.parse(name).path} is made again from the change log once it is removed"
            )
            return "not kept: quarantined"

    outcomes = for_each_table(selected, keep)
    if log is not None and selected:
        log.info("history: " + ", ".join(f"{t}: {o}" for t, o in zip(selected, outcomes, strict=True)))
    return failed


def _pending_estimate(lakehouse: Lakehouse, tables: Collection[str]) -> int:
    """An upper bound of the changes pending in the tables, from their change logs' file statistics: what
    decides the engine before any change is read."""

    def estimate(name: str) -> int:
        table = TableRef.parse(name)
        log = lakehouse.open(CHANGES, table)
        return 0 if log is None else pending_at_most(log, max_seq(lakehouse.open(CURRENT, table), APPLIED_SEQ_KEY))

    return sum(for_each_table(sorted(tables), estimate))


def _apply(
    lakehouse: Lakehouse,
    pending: list[PendingTable],
    report: CurrentReport,
    lease: Lease,
    log: Any | None,
    dropped: dict[str, int | None],
) -> None:
    steps = sorted((s for p in pending for s in table_steps(p)), key=lambda s: s.seq)
    segments = {i: s.segment for i, s in enumerate(steps) if s.segment is not None}

    def outcome(chain: list[tuple[int, Step]], n: int) -> str | ApplyResult:
        """What the chain's `n`th step does, committed."""
        i, step = chain[n]
        if step.change is not None:
            assert step.commit_ts is not None
            following = chain[n + 1][1] if n + 1 < len(chain) else None
            if _created_with_its_rows(lakehouse, step, following):
                return "created"
            return apply_schema_change(lakehouse, step.change, step.seq, step.commit_ts)
        segment = segments[i]
        segment = segment.load(lakehouse)  # a part of a table with millions pending is read when its turn comes
        if segment.shape.primary_key:
            return apply_changes(lakehouse, segment)
        return apply_keyless_changes(lakehouse, segment)  # no primary key: duplicates are counted, not keyed

    errors: dict[str, BaseException] = {}
    chains = independent_chains(steps)
    merged = _Count(len(chains))

    def run(chain: list[tuple[int, Step]]) -> list[tuple[Step, str | ApplyResult]]:
        """One table's steps (with its rename partners'), in `_cdc_seq` order; a table's own error ends its chain
        only (the steps before it are committed, each with its applied seq)."""
        done: list[tuple[Step, str | ApplyResult]] = []
        for n, (_, step) in enumerate(chain):
            lease.check()  # on S3 a lease lost to another run means: merge nothing more
            try:
                done.append((step, outcome(chain, n)))
            except Exception as exc:
                if not of_the_table(exc):
                    raise
                errors.update({str(s.table): exc for _, s in chain[n:]})
                break
            failpoints.hit("current.table_merged")
            release_unused_memory()
        merged.add()
        return done

    report_progress(Update(CURRENT_STATE, 0, len(chains), "tables"))
    record_outcomes(for_each_table(chains, run), report, dropped, log, len(steps), "arrow")
    if errors:
        raise TablesFailed(errors)


class _Count:
    """Tables merged so far by the stage's threads, reported as they finish."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self._lock = total, 0, threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.done += 1
            done = self.done
        report_progress(Update(CURRENT_STATE, done, self.total, "tables"))


def _created_with_its_rows(lakehouse: Lakehouse, step: Step, following: Step | None) -> bool:
    """A new table whose first rows come in the very next step is created by that step, rows and all: one
    Delta commit instead of an empty table and then its rows."""
    change = step.change
    return (
        change is not None
        and change.action == CREATE
        and change.renamed_from is None
        and change.after is not None
        and following is not None
        and following.segment is not None
        and following.table == step.table
        and following.segment.shape.columns == change.after.columns
        and following.segment.shape.primary_key == change.after.primary_key
        and applied_seq(lakehouse, step.table) is None
    )


def current_row_count(lakehouse: Lakehouse, table: str) -> int | None:
    """Rows in a current-state table, from the Delta log's file statistics (no data read)."""
    dt = lakehouse.open(CURRENT, TableRef.parse(table))
    return None if dt is None else row_count(dt)
