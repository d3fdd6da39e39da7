"""The current-state stage on Spark: the run process plans and commits, Spark tasks read and write every row.

Per table, tasks read the pending part of its change log (the files past its applied seq); the run process
learns only the pending events (TRUNCATE and schema changes, one row each) and the count and highest seq of
the changes. The changes between two schema changes are one segment, applied by cdc_assets.stages.current.spark_tasks
(copy on write of the files their keys fall in) and committed in one Delta commit whose app transaction is the
segment's last seq; schema changes are applied in `_cdc_seq` order between them. Tables are applied side by
side, the two sides of a RENAME together, as on the Arrow engine (stages/current/run.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ALTER, CREATE
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.shapes import SchemaChange, TableShape, renamed_partners, with_rename_partners
from cdc_assets.lake.delta import APPLIED_SEQ_KEY, file_actions, file_paths, files_past, max_seq, row_count
from cdc_assets.lake.files import FileAccess, add_actions, commit_files, remove_actions
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE, CURRENT, CURRENT_STAGE
from cdc_assets.lake.locks import Lease
from cdc_assets.lake.state import TableProgress, load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.current.apply import ApplyResult, applied_floor, settle_schema_change
from cdc_assets.stages.current.rows import (
    DUP_COLUMN,
    current_configuration,
    current_schema,
    reshape_rows,
)
from cdc_assets.stages.current.spark_tasks import (
    PendingFiles,
    Rewritten,
    SmallMerge,
    file_ranges,
    latest_changes,
    merge_keyed,
    merge_keyless,
    merge_small_tables,
    summarize_tables,
    table_frame,
)
from cdc_assets.stages.current.steps import (
    CurrentReport,
    SchemaStep,
    SparkSegment,
    Step,
    independent_chains,
    record_outcomes,
    table_plan,
)
from spark_resources.files_job import compact_tables, rewrite_files


@dataclass
class _Pending:
    table: TableRef
    frame: Callable[[], Any]  # its pending rows as a Spark DataFrame, planned on first use
    events: list[dict[str, Any]]
    changes: int
    max_seq: int
    applied: int | None
    shape: TableShape
    log: PendingFiles
    log_schema: pa.Schema
    first_change: int | None = None
    last_change: int | None = None


@dataclass(frozen=True)
class _LogFiles:
    """A table's change-log files that may hold pending changes: what one job summarizes for every table."""

    files: PendingFiles
    schema: pa.Schema
    applied: int | None
    shape: TableShape


def _log_files(lakehouse: Lakehouse, table: TableRef, shape: TableShape, progress: TableProgress) -> _LogFiles | None:
    log = lakehouse.open(CHANGES, table)
    log_max = max_seq(log)
    applied = applied_floor(lakehouse, table, lakehouse.open(CURRENT, table), progress)
    if log is None or log_max is None or (applied is not None and log_max <= applied):
        return None
    paths = files_past(file_actions(log), applied).column("path").to_pylist()  # files wholly taken in are not read
    files = PendingFiles(lakehouse.table_key(CHANGES, table), paths, applied)
    return _LogFiles(files, pa.schema(log.schema().to_arrow()), applied, shape)


def _pending(lakehouse: Lakehouse, spark: Any, logs: dict[str, _LogFiles]) -> list[_Pending]:
    """The tables' pending changes: what they are learnt in one Spark job over every table's files (its events,
    counts, newest seq), each table's rows left to the tasks that apply them."""
    access = lakehouse.file_access()
    summaries = summarize_tables(spark, access, {t: log.files for t, log in logs.items()})
    found = []
    for name, log in logs.items():
        summary = summaries[name]
        if not summary.changes:
            continue
        found.append(
            _Pending(
                TableRef.parse(name), _frame_on_first_use(spark, access, log), summary.events, summary.changes, int(summary.max_seq or 0),
                log.applied, log.shape, log.files, log.schema, summary.first_change, summary.last_change,
            )  # fmt: skip
        )
    return found


def _frame_on_first_use(spark: Any, access: FileAccess, log: _LogFiles) -> Callable[[], Any]:
    """The table's pending rows as a DataFrame, planned when first asked for: planning one costs the driver ~30 ms
    of round trips (6 s for 200 tables), and only a table merged in jobs of its own needs it (small tables are
    merged by one job over their files)."""
    files = log.files
    return functools.cache(lambda: table_frame(spark, access, files.table_key, files.paths, log.schema, log.applied))


def _steps(pending: _Pending) -> list[Step]:
    """The table's segments and schema changes in `_cdc_seq` order (steps.table_plan, as on Arrow)."""
    after = pending.applied if pending.applied is not None else -1
    steps: list[Step] = []
    first, last = pending.first_change, pending.last_change

    def holds_changes(lower: int, upper: int) -> bool:  # what the summary knows: the range of the table's changes
        return first is not None and last is not None and lower < last and upper >= first

    for item in table_plan(pending.events, pending.shape, after, pending.max_seq, holds_changes):
        if isinstance(item, SchemaStep):
            steps.append(Step(item.seq, pending.table, change=item.change, commit_ts=item.commit_ts))
        else:
            segment = SparkSegment(item.shape, pending.frame, item.after, item.upto, item.truncate_seq, pending.changes)
            steps.append(Step(item.after + 0.5, pending.table, segment=segment))
    return steps


def _apply_segment(lakehouse: Lakehouse, spark: Any, table: TableRef, segment: SparkSegment) -> ApplyResult:
    access = lakehouse.file_access()
    key = lakehouse.table_key(CURRENT, table)
    existing = lakehouse.open(CURRENT, table)  # the version the merge reads: its commit is fenced from it
    actions = pa.table(existing.get_add_actions(flatten=True)) if existing is not None else pa.table({"path": pa.array([], pa.string())})
    window = segment.frame().where((F.col("_cdc_seq") > segment.after) & (F.col("_cdc_seq") <= segment.upto))
    if segment.shape.primary_key:
        latest = latest_changes(window, segment.shape, segment.truncate_seq)
        done = merge_keyed(spark, access, key, str(table), latest, segment.shape, actions, segment.truncate_seq, segment.changes)
    else:
        done = merge_keyless(spark, access, key, str(table), window, segment.shape, actions, segment.truncate_seq)
    _commit_segment(lakehouse, table, segment, existing, done)
    return _result(table, segment, done)


def _commit_segment(lakehouse: Lakehouse, table: TableRef, segment: SparkSegment, existing: Any, done: Rewritten) -> None:
    """A segment's new files and the files they replace, in one Delta commit from the version the merge read."""
    if not (done.adds or done.removed or existing is None):
        return
    schema = current_schema(segment.shape)
    commit_files(
        existing, lakehouse.table_uri(CURRENT, table), lakehouse.storage_options(), lakehouse.table_key(CURRENT, table),
        schema, add_actions(done.adds), remove_actions(existing, done.removed) if existing is not None else [],
        APPLIED_SEQ_KEY, segment.upto, current_configuration(schema),
    )  # fmt: skip


def _result(table: TableRef, segment: SparkSegment, done: Rewritten) -> ApplyResult:
    upserted = done.inserted + done.updated
    return ApplyResult(table, segment.changes, upserted, done.deleted, done.inserted, done.updated, done.deleted, segment.upto)


def apply_on_spark(
    lakehouse: Lakehouse,
    session: Callable[[], Any],
    targets: set[str],
    reached: dict[str, TableProgress],
    current: dict[str, TableProgress],
    report: CurrentReport,
    lease: Lease,
    log: Any | None,
    dropped: dict[str, int | None],
) -> None:
    """Every target table's pending changes applied on Spark; `targets` grows by rename partners, `reached`
    and `current` get each table's progress of both stages (for the caller to save)."""

    store = lakehouse.store
    spark = session()
    pending: list[_Pending] = []

    def log_files(name: str) -> tuple[str, _LogFiles | None]:
        shape = reached[name].shape
        assert shape is not None
        return name, _log_files(lakehouse, TableRef.parse(name), shape, current[name])

    def take_in(new: list[str]) -> set[str]:
        reached.update({t: load_progress(store, CHANGES_STAGE, t) for t in new})
        current.update({t: load_progress(store, CURRENT_STAGE, t) for t in new})
        shaped = [t for t in new if reached[t].shape is not None]
        logs = {name: log for name, log in for_each_table(shaped, log_files) if log is not None}
        pending.extend(_pending(lakehouse, spark, logs))
        return renamed_partners(json.loads(e["_cdc_ddl"]) for p in pending for e in p.events if e.get("_cdc_ddl"))

    with_rename_partners(targets, take_in)
    steps = sorted((s for p in pending for s in _steps(p)), key=lambda s: s.seq)
    chains = independent_chains(steps)
    candidates = [c for c in chains if _small_chain(c)]
    opened = for_each_table(candidates, lambda chain: lakehouse.open(CURRENT, chain[-1][1].table))
    small = [
        (chain, table)
        for chain, table in zip(candidates, opened, strict=True)
        if (table is None or row_count(table) <= SMALL_TABLE_ROWS) and (len(chain) == 1 or table is None)
    ]  # a chain that opens with a CREATE is small only when the table is new: its first commit creates it
    merged = _apply_small(lakehouse, spark, small, pending)
    taken = {id(chain) for chain, _ in small}

    def run(chain: list[tuple[int, Step]]) -> list[tuple[Step, str | ApplyResult]]:
        done: list[tuple[Step, str | ApplyResult]] = []
        for _, step in chain:
            lease.check()  # on S3 a lease lost to another run means: merge nothing more
            if step.change is not None:
                assert step.commit_ts is not None
                done.append((step, _apply_schema_change(lakehouse, spark, step.change, int(step.seq), step.commit_ts)))
                continue
            assert isinstance(step.segment, SparkSegment)
            done.append((step, _apply_segment(lakehouse, spark, step.table, step.segment)))
        return done

    rest = [c for c in chains if id(c) not in taken]
    outcomes = merged + for_each_table(rest, run)
    # the fragments merges left, binned for every table in one job
    touched = sorted({str(step.table) for chain in chains for _, step in chain})
    compact_tables(lakehouse, spark, CURRENT, [TableRef.parse(t) for t in touched], lakehouse.current_piece_bytes // 2, APPLIED_SEQ_KEY)
    record_outcomes(outcomes, report, dropped, log, len(steps), "spark")


# Compaction bins only fragments, as on Arrow: the key-range pieces of the lakehouse's current_piece_bytes an Arrow snapshot or merge
# wrote are not small, and binning them (in path order) would make every file span the whole key range.

# Tables whose pending changes one task applies whole (one job for all of them, however many tables): changes under
# one shape (after any CREATE of the table itself), at most this many, into at most this many rows. Others get jobs of
# their own (an ALTER, a RENAME, a large table).
SMALL_TABLE_CHANGES = 200_000
SMALL_TABLE_ROWS = 2_000_000


def _small_chain(chain: list[tuple[int, Step]]) -> bool:
    """A chain of one segment with few enough changes, maybe after CREATEs of the table (not a RENAME's): the
    table's size is asked next."""
    *creates, (_, last) = chain
    segment = last.segment
    return (
        isinstance(segment, SparkSegment)
        and segment.changes <= SMALL_TABLE_CHANGES
        and all(
            step.change is not None and step.change.action == CREATE and step.change.renamed_from is None
            and step.change.after == segment.shape
            for _, step in creates
        )
    )  # fmt: skip


def _apply_small(
    lakehouse: Lakehouse, spark: Any, chains: list[tuple[list[tuple[int, Step]], Any]], pending: list[_Pending]
) -> list[list[tuple[Step, str | ApplyResult]]]:
    """Small tables' segments (each with its table as read) applied in one Spark job, a task each
    (stages.current.spark_tasks.merge_small_tables), then committed here, each in one Delta commit from the
    version its task read (a new table's first commit creates it: its CREATE is done by it)."""
    if not chains:
        return []
    logs = {p.table: p for p in pending}
    work = []
    for chain, existing in chains:
        step = chain[-1][1]
        segment, table = step.segment, step.table
        assert isinstance(segment, SparkSegment)
        actions = pa.table(existing.get_add_actions(flatten=True)) if existing is not None else None
        ranges = file_ranges(actions, list(segment.shape.primary_key)) if actions is not None and actions.num_rows else []
        log = logs[table]
        files = PendingFiles(log.log.table_key, log.log.paths, segment.after)
        current_key = lakehouse.table_key(CURRENT, table)
        work.append(
            SmallMerge(str(table), segment.shape, files, log.log_schema, segment.upto, current_key, ranges, segment.truncate_seq)
        )
    rewritten = merge_small_tables(spark, lakehouse.file_access(), work)

    def commit(item: tuple[tuple[list[tuple[int, Step]], Any], Rewritten]) -> list[tuple[Step, str | ApplyResult]]:
        (chain, existing), done = item
        step = chain[-1][1]
        segment = step.segment
        assert isinstance(segment, SparkSegment)
        _commit_segment(lakehouse, step.table, segment, existing, done)
        return [*((create, "created") for _, create in chain[:-1]), (step, _result(step.table, segment, done))]

    return for_each_table(list(zip(chains, rewritten, strict=True)), commit)


def _apply_schema_change(
    lakehouse: Lakehouse, spark: SparkSession, change: SchemaChange, seq: int, commit_ts: dt.datetime
) -> str:
    """`apply.apply_schema_change` with the rows reshaped by Spark tasks: an ALTER rewrites
    every file of the table, a RENAME's new table is written from the old one's files; the run process commits.
    Idempotent in the same way: a table that has taken in `seq` already is left alone."""
    done, existing = settle_schema_change(lakehouse, change, seq)
    if done is not None:
        return done
    table, after = change.table, change.after
    assert after is not None
    schema = current_schema(after)
    key, uri, access = lakehouse.table_key(CURRENT, table), lakehouse.table_uri(CURRENT, table), lakehouse.file_access()
    if change.action == CREATE:
        source = lakehouse.open(CURRENT, change.renamed_from) if change.renamed_from is not None else None
        adds: list[dict] = []
        if source is not None:
            assert change.renamed_from is not None
            whole = SchemaChange(table, ALTER, after, after)
            paths = file_paths(source)
            adds = rewrite_files(
                spark, access, lakehouse.table_key(CURRENT, change.renamed_from), str(table), [[p] for p in paths],
                lambda rows: reshape_rows(rows, whole, after, commit_ts, table), target_key=key,
            )  # fmt: skip
        commit_files(
            existing, uri, lakehouse.storage_options(), key, schema, add_actions(adds), [], APPLIED_SEQ_KEY, seq,
            current_configuration(schema), overwrite=existing is not None,
        )  # fmt: skip
        return f"created from {change.renamed_from}" if source is not None else "created"
    assert existing is not None
    paths = file_paths(existing)
    # a table that loses its key numbers its identical rows over the whole table: one task reads it all
    whole = not after.primary_key and DUP_COLUMN not in existing.schema().to_arrow().names
    groups = [paths] if whole else [[p] for p in paths]
    adds = rewrite_files(
        spark, access, key, str(table), groups, lambda rows: reshape_rows(rows, change, after, commit_ts, table),
        whole=whole,
    )  # fmt: skip
    commit_files(
        existing, uri, lakehouse.storage_options(), key, schema, add_actions(adds), [], APPLIED_SEQ_KEY, seq,
        current_configuration(schema), overwrite=True,
    )  # fmt: skip
    return "altered"
