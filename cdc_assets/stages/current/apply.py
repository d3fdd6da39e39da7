"""Current-state tables: `current/<schema>/<table>`, one row per source row (docs/lakehouse.md: Lakehouse layout; docs/overview.md).

A run applies, per key, only the newest pending change (stages.current.rules.newest_rows): upserts write the row,
deletes remove it, a key-changing update does both. A change not newer than the row's `_cdc_seq` is ignored
(stages.current.rules.merged_with_outcomes, the seq guard), so replaying changes is a no-op.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableMerger

from cdc_assets.core import failpoints
from cdc_assets.core.arrow import sorted_by_key, where
from cdc_assets.core.errors import TableUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ALTER, CREATE, DROP, SCHEMA_OPS, TRUNCATE, UNLOGGED_ROWS
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.shapes import SchemaChange, TableShape
from cdc_assets.lake.delta import (
    APPLIED_SEQ_KEY,
    compact_small_files,
    fenced,
    file_actions,
    files_past,
    max_seq,
    plain_schema,
    read_query,
    seq_commit,
    seq_landed,
    writer_properties,
)
from cdc_assets.lake.files import (
    add_actions,
    commit_files,
    conformed,
    read_files,
    read_rows_after,
    remove_actions,
    write_files,
)
from cdc_assets.lake.layout import CHANGES, CURRENT, CURRENT_STAGE
from cdc_assets.lake.repair_marks import mark_for_repair
from cdc_assets.lake.state import TableProgress, load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.rows import DDL_COLUMN
from cdc_assets.stages.current.rows import (
    CURRENT_FILE_BYTES,
    DELETED_COLUMN,
    DUP_COLUMN,
    LIVE_ROWS,
    current_configuration,
    current_schema,
    file_ranges,
    home_files,
    pieces,
    range_groups,
    reshape_rows,
    touched_by,
)
from cdc_assets.stages.current.rules import (
    ACTION_COLUMN,
    DELETE_ACTION,
    OUTCOME_COLUMN,
    UPSERT_ACTION,
    after_truncate,
    copy_changes,
    copy_moves,
    merge_rows,
    newest_rows,
)


def quote(name: str) -> str:
    """A SQL identifier for delta-rs predicates (case and odd characters preserved)."""
    return '"' + name.replace('"', '""') + '"'


MAX_CHANGES_PER_MERGE = 200_000  # changes read and merged at once: bounds memory when a table has millions pending
# Rows of the files a copy on write by file (`_rewrite_touched_files`) reads at once, at most: beyond, changes spread
# over most of a large table (a catch-up), and delta-rs's MERGE, which streams, takes them.
REWRITE_MAX_ROWS = 2_000_000


@dataclass
class PendingTable:
    """Changes of one table not yet applied to its current state.

    When there are more than MAX_CHANGES_PER_MERGE, `changes` holds only their `_cdc_seq`, `_cdc_op`,
    `_cdc_commit_ts` and `_cdc_ddl` (`index_only`), and each part of at most that many changes is read
    when it is applied (`bounds`, `load`).
    """

    table: TableRef
    shape: TableShape
    changes: pa.Table
    applied_seq: int | None
    index_only: bool = False
    bounds: tuple[int, int] | None = None  # the first and last `_cdc_seq` of a part still to be read

    def load(self, lakehouse: Lakehouse) -> PendingTable:
        """This part with its rows read from the change log (itself when they are there already)."""
        if self.bounds is None:
            return self
        low, high = self.bounds
        log = lakehouse.open(CHANGES, self.table)
        assert log is not None
        ops = ", ".join(f"'{op}'" for op in SCHEMA_OPS)
        sql = f"SELECT * FROM changes WHERE _cdc_seq >= {low} AND _cdc_seq <= {high} AND _cdc_op NOT IN ({ops})"
        return PendingTable(self.table, self.shape, read_query(log, sql, "changes"), self.applied_seq)

    @property
    def truncate_seq(self) -> int | None:
        """`_cdc_seq` of the last pending TRUNCATE: every row written before it goes."""
        seqs = self.changes.filter(pc.equal(self.changes.column("_cdc_op"), TRUNCATE)).column("_cdc_seq")
        return None if len(seqs) == 0 else int(pc.max(seqs).as_py())


def applied_floor(lakehouse: Lakehouse, table: TableRef, current: DeltaTable | None, progress: TableProgress | None) -> int | None:
    """The `_cdc_seq` up to which the table's current state has taken changes in (None: all are pending).

    A table whose current state was dropped has taken in everything up to its DROP (`dropped_seq`). One whose
    current state should exist (`present`) but is gone was removed behind the pipeline's back: it is rebuilt
    from its whole change log, unless a snapshot loaded it (its rows are then not all in the log), which only
    a new snapshot can mend. One whose change log ends in a DROP (after any snapshot) was being dropped when a
    crash came (the failpoints `current.drop_log_removed`, `current.merged_before_progress`): it is taken from
    just before that DROP.
    """
    applied = max_seq(current, APPLIED_SEQ_KEY)
    if current is None and progress is not None and progress.present:
        # A DROP whose removal of the table (or the progress recording it) a crash cut short: nothing before the
        # DROP matters any more, snapshot rows included, and the change log holds everything after it.
        last_drop = _last_drop(lakehouse, table)
        if last_drop is not None and (progress.snapshot_seq is None or last_drop > progress.snapshot_seq):
            return last_drop - 1
    if current is None and progress is not None:
        if progress.present and progress.snapshot_seq is not None:
            raise TableUserError(  # that table's alone: the others go on (lake/quarantine)
                f"The current state of {table} is missing from the lakehouse ({lakehouse.table_key(CURRENT, table)}) "
                f"and was loaded by a snapshot, so its change log cannot rebuild it: run `cdc-lakehouse snapshot {table}`."
            )
        applied = None if progress.present else progress.dropped_seq
    return applied


def _last_drop(lakehouse: Lakehouse, table: TableRef) -> int | None:
    """`_cdc_seq` of the table's newest DROP (or RENAME away) in its change log."""
    log = lakehouse.open(CHANGES, table)
    if log is None or "_cdc_op" not in [f.name for f in log.schema().fields]:
        return None
    found = read_query(log, f"SELECT max(_cdc_seq) AS s FROM changes WHERE _cdc_op = '{DROP}'", "changes")
    value = found.column(0)[0].as_py() if found.num_rows else None
    return None if value is None else int(value)


def read_pending(
    lakehouse: Lakehouse, table: TableRef, version: TableShape, progress: TableProgress | None = None
) -> PendingTable | None:
    """Changes newer than the current-state table's applied `_cdc_seq` (`applied_floor`), or None when it is
    up to date; `progress` is the stage's saved progress of the table."""
    log = lakehouse.open(CHANGES, table)
    log_max = max_seq(log)
    applied = applied_floor(lakehouse, table, lakehouse.open(CURRENT, table), progress)
    if log is None or log_max is None or (applied is not None and log_max <= applied):
        return None
    where = "" if applied is None else f" WHERE _cdc_seq > {int(applied)}"
    if (  # the file statistics' bound first; the exact count only when the bound is too high
        pending_at_most(log, applied) <= MAX_CHANGES_PER_MERGE
        or read_query(log, f"SELECT count(*) AS n FROM changes{where}", "changes").column(0)[0].as_py()
        <= MAX_CHANGES_PER_MERGE
    ):
        changes = read_rows_after(lakehouse.file_access(), lakehouse.table_key(CHANGES, table), log, applied)
        return PendingTable(table, version, changes, applied)
    names = [f.name for f in log.schema().fields]
    index = ["_cdc_seq", "_cdc_op", "_cdc_commit_ts"] + ([DDL_COLUMN] if DDL_COLUMN in names else [])
    changes = read_query(log, f"SELECT {', '.join(index)} FROM changes{where}", "changes")
    if DDL_COLUMN not in names:
        changes = changes.append_column(DDL_COLUMN, pa.nulls(changes.num_rows, pa.string()))
    return PendingTable(table, version, changes, applied, index_only=True)


def current_expected(lakehouse: Lakehouse, table: TableRef, progress: TableProgress) -> bool:
    """Whether the current-state stage left a current-state table for `table` (so one missing was removed
    behind its back). Progress saved before `present` was recorded: applied, not dropped, with a change log."""
    if progress.present is not None:
        return progress.present
    return progress.batch is not None and progress.dropped_seq is None and lakehouse.has_table(CHANGES, table)


def missing_current_tables(lakehouse: Lakehouse, tables: list[str]) -> list[str]:
    """Tables whose current state the stage left in place and that are gone: the next apply rebuilds them."""

    def missing(name: str) -> bool:
        table = TableRef.parse(name)
        progress = load_progress(lakehouse.store, CURRENT_STAGE, name)
        return current_expected(lakehouse, table, progress) and not lakehouse.has_table(CURRENT, table)

    return [name for name, gone in zip(tables, for_each_table(tables, missing), strict=True) if gone]


def pending_at_most(log: DeltaTable, applied: int | None) -> int:
    """An upper bound of the changes past `applied`, from the files' statistics (no data read): the rows of
    every file whose highest `_cdc_seq` is past it."""
    return int(pc.sum(files_past(file_actions(log), applied).column("num_records")).as_py() or 0)


@dataclass(frozen=True)
class ApplyResult:
    table: TableRef
    changes_in: int
    upserted: int
    deleted: int
    inserted: int
    updated: int
    removed: int
    applied_seq: int

    def __add__(self, later: ApplyResult) -> ApplyResult:
        """Two steps applied to one table in a run, as one."""
        return ApplyResult(
            later.table,
            self.changes_in + later.changes_in,
            self.upserted + later.upserted,
            self.deleted + later.deleted,
            self.inserted + later.inserted,
            self.updated + later.updated,
            self.removed + later.removed,
            later.applied_seq,
        )


def _open_or_create(lakehouse: Lakehouse, pending: PendingTable) -> DeltaTable:
    """The table's current state, created empty (with its statistics settings) the first time."""
    target = lakehouse.open(CURRENT, pending.table)
    if target is None:
        schema = current_schema(pending.shape)
        target = DeltaTable.create(
            lakehouse.table_uri(CURRENT, pending.table),
            schema=schema,
            storage_options=lakehouse.storage_options(),
            configuration=current_configuration(schema),
        )
    return target


def apply_changes(lakehouse: Lakehouse, pending: PendingTable) -> ApplyResult:
    """Merge the newest change per key (stages.current.rules.newest_rows) into current state.

    With soft deletes (CDC_SOFT_DELETES) a delete keeps the row, flagged `_cdc_deleted` with the delete's seq
    and time (a delete of a row not there yet writes it so), and a later write of the key revives it."""
    target = lakehouse.open(CURRENT, pending.table)
    newest = newest_rows(pending.changes, pending.shape, pending.truncate_seq)
    deleting = pc.equal(newest.column(ACTION_COLUMN), DELETE_ACTION)
    upserts = where(newest, pc.invert(deleting))
    deletes = where(newest, deleting)
    soft = pending.table in lakehouse.soft_deletes
    source = newest.append_column(DELETED_COLUMN, deleting) if soft else newest
    new_applied = int(pc.max(pending.changes.column("_cdc_seq")).as_py())
    keys = list(pending.shape.primary_key)
    if target is None or not target.file_uris():  # a new or empty table: no row to match, each upsert is a new row
        written = source if soft else upserts
        rows = sorted_by_key(written.drop_columns([ACTION_COLUMN]), keys)
        landed = seq_landed(lakehouse.table_uri(CURRENT, pending.table), lakehouse.storage_options(), APPLIED_SEQ_KEY, new_applied)
        with fenced(lakehouse.table_key(CURRENT, pending.table), landed):
            write_deltalake(
                target if target is not None else lakehouse.table_uri(CURRENT, pending.table),
                rows,
                mode="append",
                schema_mode="merge",
                storage_options=None if target is not None else lakehouse.storage_options(),
                configuration=None if target is not None else current_configuration(rows.schema),
                commit_properties=seq_commit(APPLIED_SEQ_KEY, new_applied),
                writer_properties=writer_properties(rows),
            )
        return ApplyResult(
            pending.table, pending.changes.num_rows, upserts.num_rows, deletes.num_rows, rows.num_rows, 0, 0, new_applied
        )

    if not soft and pending.truncate_seq is None:
        counts = _rewrite_touched_files(lakehouse, pending, target, source, new_applied)
        if counts is not None:
            return ApplyResult(
                pending.table, pending.changes.num_rows, upserts.num_rows, deletes.num_rows,
                counts["inserted"], counts["updated"], counts["deleted"], new_applied,
            )  # fmt: skip
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)  # keyless tables: apply_keyless_changes
    assignments = {quote(f.name): f"s.{quote(f.name)}" for f in current_schema(pending.shape)}
    newer = "s._cdc_seq > t._cdc_seq"
    merge = _merge_into(target, source, on, new_applied)
    if soft:
        assignments[DELETED_COLUMN] = f"s.{DELETED_COLUMN}"
        flagged = {DELETED_COLUMN: "true", "_cdc_seq": "s._cdc_seq", "_cdc_commit_ts": "s._cdc_commit_ts"}
        merge = (
            merge.when_matched_update(updates=flagged, predicate=f"s._cdc_action = '{DELETE_ACTION}' AND {newer}")
            .when_matched_update(updates=assignments, predicate=f"s._cdc_action = '{UPSERT_ACTION}' AND {newer}")
            .when_not_matched_insert(updates=assignments)
        )
    else:
        merge = (
            merge.when_matched_delete(predicate=f"s._cdc_action = '{DELETE_ACTION}' AND {newer}")
            .when_matched_update(updates=assignments, predicate=f"s._cdc_action = '{UPSERT_ACTION}' AND {newer}")
            .when_not_matched_insert(updates=assignments, predicate=f"s._cdc_action = '{UPSERT_ACTION}'")
        )
    metrics = _execute(lakehouse, pending, target, merge, soft)
    return ApplyResult(
        table=pending.table,
        changes_in=pending.changes.num_rows,
        upserted=upserts.num_rows,
        deleted=deletes.num_rows,
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
        removed=int(metrics.get("num_target_rows_deleted", 0)),
        applied_seq=new_applied,
    )


def _rewrite_touched_files(
    lakehouse: Lakehouse, pending: PendingTable, target: DeltaTable, source: pa.Table, new_applied: int
) -> dict[str, int] | None:
    """Copy on write of exactly the files whose key range (their statistics) holds a changed key, plus, for new
    rows, the file whose range they extend (stages.current.rows.home_files); the rows of those files with the
    changes applied (stages.current.rules.merge_rows, as the Spark engine's tasks do), sorted by key and written
    back as pieces of the lakehouse's current_piece_bytes (CDC_CURRENT_FILE_KB), committed with the removes of the files they replace in one Delta
    commit that records `new_applied`. Returns the inserted, updated and deleted counts.

    Why not delta-rs's MERGE: it narrows the files it reads only to the changed keys' overall min and max, so a
    few changes spread over a large table read and rewrite most of it (10M rows: seconds a cycle), and it writes
    the rows back in join order, so the files' key ranges widen with every merge. None (the caller MERGEs) for a
    table whose columns differ from its shape's (a column added by a soft-delete setting) or whose bounds do not
    compare."""
    schema = plain_schema(target)
    expected = current_schema(pending.shape)
    if [(f.name, f.type) for f in schema] != [(f.name, f.type) for f in expected]:
        return None
    key = list(pending.shape.primary_key)
    actions = pa.table(target.get_add_actions(flatten=True))
    try:
        ranges = file_ranges(actions, key)
        changed = source.select(key)
        paths = _in_key_order(touched_by(changed, ranges) | home_files(changed, ranges), ranges, key)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
        return None
    rewritten = set(paths)
    chosen = pc.is_in(actions.column("path"), value_set=pa.array(paths, pa.string()))
    if int(pc.sum(actions.filter(chosen).column("num_records")).as_py() or 0) > REWRITE_MAX_ROWS:
        return None  # most of a large table: delta-rs's MERGE streams it instead of holding it here
    access, table_key = lakehouse.file_access(), lakehouse.table_key(CURRENT, pending.table)


    def read(path: str) -> list[pa.Table]:
        return [conformed(rows, schema) for rows in read_files(access, table_key, [path])]

    parts = [part for parts in for_each_table(paths, read) for part in parts]  # small files: a few at a time
    existing = pa.concat_tables(parts) if parts else schema.empty_table()
    merged, counts = merge_rows(existing, source, key)
    del parts, existing  # what `merged` took of them is its own: the files' rows go before the pieces are written
    sample = actions.filter(chosen) if paths else actions
    rows = int(pc.sum(sample.column("num_records")).as_py() or 0)
    row_bytes = (int(pc.sum(sample.column("size_bytes")).as_py() or 0) / rows) if rows else 100.0
    slices = [
        group.slice(offset, length)
        for group in range_groups(merged, key, [r for r in ranges if r["path"] in rewritten])
        for offset, length in pieces(group.num_rows, row_bytes, lakehouse.current_piece_bytes)
    ]

    def write(rows: pa.Table) -> list[dict]:
        return list(write_files(access, table_key, str(pending.table), [rows]))

    adds = [done for written in for_each_table(slices, write) for done in written]
    commit_files(
        target, lakehouse.table_uri(CURRENT, pending.table), lakehouse.storage_options(), table_key, schema,
        add_actions(adds), remove_actions(target, paths), APPLIED_SEQ_KEY, new_applied, current_configuration(schema),
    )  # fmt: skip
    target.update_incremental()
    # only fragments (deletes thinned them, new rows of a many-column key) are binned: never the pieces
    compact_small_files(target, lakehouse.current_piece_bytes // 2, failpoint="current.compacting")
    return counts


def _in_key_order(paths: set[str], ranges: list[dict[str, Any]], key: list[str]) -> list[str]:
    """The files in the order of their lowest key (by name when that does not compare), so their rows read one
    after the other are in key order when their ranges are disjoint (merge_rows then needs no sort)."""
    lows = {r["path"]: r["min"].get(key[0]) for r in ranges if r["path"] in paths}
    try:
        return sorted(paths, key=lambda p: (lows.get(p) is None, lows.get(p), p))
    except TypeError:
        return sorted(paths)


def _merge_into(target: DeltaTable, source: pa.Table, predicate: str, new_applied: int) -> TableMerger:
    """A merge of `source` (alias s) into the current state (alias t) that records `new_applied`."""
    return target.merge(
        source,
        predicate=predicate,
        source_alias="s",
        target_alias="t",
        merge_schema=True,
        streamed_exec=False,  # lets delta-rs prune target files by the source's key range first
        commit_properties=seq_commit(APPLIED_SEQ_KEY, new_applied),
        writer_properties=writer_properties(source),
    )


def _execute(
    lakehouse: Lakehouse, pending: PendingTable, target: DeltaTable, merge: TableMerger, soft: bool = False
) -> dict[str, Any]:
    """Run a merge, fenced, with a pending TRUNCATE's removal of older rows in the same commit (with soft
    deletes: their flagging, at the TRUNCATE's seq and time); then compact the table's small files when there
    are enough. Returns delta-rs's metrics."""
    truncated = pending.truncate_seq
    if truncated is not None and soft:
        at = pending.changes.filter(pc.equal(pending.changes.column("_cdc_seq"), truncated)).column("_cdc_commit_ts")[0]
        stamp = at.as_py().strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        merge = merge.when_not_matched_by_source_update(
            updates={
                DELETED_COLUMN: "true",
                "_cdc_seq": str(int(truncated)),
                "_cdc_commit_ts": f"arrow_cast('{stamp}', 'Timestamp(Microsecond, Some(\"UTC\"))')",
            },
            predicate=f"t._cdc_seq < {int(truncated)}"
            + (f" AND t.{LIVE_ROWS}" if DELETED_COLUMN in pa.schema(target.schema().to_arrow()).names else ""),
        )
    elif truncated is not None:  # in the same commit: the rows written before the TRUNCATE go
        merge = merge.when_not_matched_by_source_delete(predicate=f"t._cdc_seq < {int(truncated)}")
    if truncated is not None:
        failpoints.hit("current.truncate_before_commit")
    seq = int(pc.max(pending.changes.column("_cdc_seq")).as_py())  # what _merge_into records as applied
    landed = seq_landed(lakehouse.table_uri(CURRENT, pending.table), lakehouse.storage_options(), APPLIED_SEQ_KEY, seq)
    metrics: dict[str, Any] = {}  # none when the commit's answer was lost (it landed: see lake.delta.fenced)
    with fenced(lakehouse.table_key(CURRENT, pending.table), landed):
        metrics = merge.execute()
    compact_small_files(target, CURRENT_FILE_BYTES, failpoint="current.compacting")
    return metrics


def apply_keyless_changes(lakehouse: Lakehouse, pending: PendingTable) -> ApplyResult:
    """Apply a keyless table's changes with duplicates kept as the source keeps them.

    Per distinct row, the pending changes add or remove copies (an update removes one copy of its
    before-image and adds one of its after-image); the current state then holds exactly that many
    copies, told apart by `_cdc_dup`. A TRUNCATE first empties the table: only changes after it count.

    Counting is not idempotent as a keyed upsert is, so the changes are taken against the very table version
    the merge commits on: those its applied seq already holds are left out (a run that took over after this
    one's lock expired may have applied them), and the commit is fenced from that version on.
    """
    schema = current_schema(pending.shape)
    target = _open_or_create(lakehouse, pending)
    done = max_seq(target, APPLIED_SEQ_KEY)
    if done is not None and pending.changes.num_rows:
        pending = PendingTable(
            pending.table,
            pending.shape,
            where(pending.changes, pc.greater(pending.changes.column("_cdc_seq"), done)),
            done,
        )
        if not pending.changes.num_rows:
            return ApplyResult(pending.table, 0, 0, 0, 0, 0, 0, done)
    columns = pending.shape.column_names
    truncated = pending.truncate_seq
    moves = copy_moves(after_truncate(pending.changes, truncated), pending.shape)
    existing = schema.empty_table()
    if truncated is None and moves.num_rows:  # after a TRUNCATE no copy before it counts (the merge removes them)
        existing = read_query(target, f"SELECT {', '.join(quote(f.name) for f in schema)} FROM current", "current")
    marked = copy_changes(existing, moves, pending.shape)
    outcome = marked.column(OUTCOME_COLUMN)
    inserts = where(marked, pc.equal(outcome, "inserted"))
    deletes = where(marked, pc.equal(outcome, "deleted"))
    source = pa.concat_tables(
        [
            part.drop_columns([OUTCOME_COLUMN]).append_column(ACTION_COLUMN, pa.array([action] * part.num_rows, pa.string()))
            for part, action in ((inserts, UPSERT_ACTION), (deletes, DELETE_ACTION))
        ]
    )
    new_applied = int(pc.max(pending.changes.column("_cdc_seq")).as_py())
    # each term in parentheses: DataFusion would otherwise parse `a IS NOT DISTINCT FROM b AND c ...` wrongly
    same_row = " AND ".join(f"(t.{quote(c)} IS NOT DISTINCT FROM s.{quote(c)})" for c in columns)
    merge = (
        _merge_into(target, source, f"{same_row} AND t.{DUP_COLUMN} = s.{DUP_COLUMN}", new_applied)
        .when_matched_delete(predicate=f"s._cdc_action = '{DELETE_ACTION}'")
        # a copy written again after a TRUNCATE matches its old self: it takes the new change's seq and time
        .when_matched_update(
            updates={"_cdc_seq": "s._cdc_seq", "_cdc_commit_ts": "s._cdc_commit_ts"},
            predicate=f"s._cdc_action = '{UPSERT_ACTION}'",
        )
        .when_not_matched_insert(
            updates={quote(f.name): f"s.{quote(f.name)}" for f in schema}, predicate=f"s._cdc_action = '{UPSERT_ACTION}'"
        )
    )
    failpoints.hit("current.keyless_before_commit")
    metrics = _execute(lakehouse, pending, target, merge)
    return ApplyResult(
        table=pending.table,
        changes_in=pending.changes.num_rows,
        upserted=inserts.num_rows,
        deleted=deletes.num_rows,
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=0,
        removed=int(metrics.get("num_target_rows_deleted", 0)),
        applied_seq=new_applied,
    )


def read_current(lakehouse: Lakehouse, table: TableRef, columns: list[str] | None = None) -> pa.Table | None:
    """The current-state rows of a table (None when it does not exist yet)."""
    dt = lakehouse.open(CURRENT, table)
    if dt is None:
        return None
    select = "*" if columns is None else ", ".join(quote(c) for c in columns)
    return read_query(dt, f"SELECT {select} FROM current", "current")


# -- schema changes -------------------------------------------------------------------------------------------


def applied_seq(lakehouse: Lakehouse, table: TableRef) -> int | None:
    """The `_cdc_seq` up to which the table's current state has taken changes in (None: no table)."""
    return max_seq(lakehouse.open(CURRENT, table), APPLIED_SEQ_KEY)


def replace_current(
    lakehouse: Lakehouse,
    table: TableRef,
    rows: pa.Table | pa.RecordBatchReader,
    seq: int,
    existing: DeltaTable | None,
) -> None:
    """The table's current state replaced by `rows` (in key order) in one Delta commit that records `seq` as
    applied (an ALTER's rewrite, a created table, a snapshot).

    Written through `existing` (the version the caller read its applied seq from), so the commit is fenced
    against any other writer's commit since (see lake.delta.seq_commit). The table properties only apply
    when the table is created: delta-rs keeps an existing table's."""
    landed = seq_landed(lakehouse.table_uri(CURRENT, table), lakehouse.storage_options(), APPLIED_SEQ_KEY, seq)
    with fenced(lakehouse.table_key(CURRENT, table), landed):
        write_deltalake(
            existing if existing is not None else lakehouse.table_uri(CURRENT, table),
            rows,
            mode="overwrite",
            schema_mode="overwrite",
            storage_options=None if existing is not None else lakehouse.storage_options(),
            configuration=current_configuration(rows.schema),
            commit_properties=seq_commit(APPLIED_SEQ_KEY, seq),
            writer_properties=writer_properties(rows),
        )


def replace_current_in_pieces(
    lakehouse: Lakehouse, table: TableRef, parts: Iterable[pa.Table], schema: pa.Schema, seq: int, existing: DeltaTable | None
) -> None:
    """`replace_current` for a keyed table's rows in key order: written as pieces (lake.files.write_files), so its first
    merges rewrite only the pieces holding changed keys, committed in one Delta commit that records `seq`."""
    key = lakehouse.table_key(CURRENT, table)
    adds = list(write_files(lakehouse.file_access(), key, str(table), parts, piece_bytes=lakehouse.current_piece_bytes))
    commit_files(
        existing, lakehouse.table_uri(CURRENT, table), lakehouse.storage_options(), lakehouse.table_key(CURRENT, table),
        schema, add_actions(adds), [], APPLIED_SEQ_KEY, seq, current_configuration(schema), overwrite=existing is not None,
    )  # fmt: skip


def settle_schema_change(lakehouse: Lakehouse, change: SchemaChange, seq: int) -> tuple[str | None, DeltaTable | None]:
    """What a schema change at `seq` needs no rows for, on either engine: a repeat after a crash (the table
    has taken `seq` in already), a DROP, a shape only the row events will tell (CREATE TABLE ... SELECT, LIKE
    an unknown table), an ALTER of a table with no current state. Returns what was done, or None when the
    rows must be written (a CREATE, a RENAME's new side, an ALTER), and the table as it is."""
    existing = lakehouse.open(CURRENT, change.table)
    applied = max_seq(existing, APPLIED_SEQ_KEY)
    if applied is not None and applied >= seq:
        return "already applied", existing
    if change.action in UNLOGGED_ROWS:  # rows changed without row events: only a repair makes up for them
        mark = mark_for_repair(lakehouse.store, str(change.table), seq, change.action)
        return ("made up for by a repair" if mark.settled(seq) else "marked for repair"), existing
    if change.action == DROP:
        if applied is None:
            return "no current state", existing
        lakehouse.delete_table(CURRENT, change.table)
        return ("dropped" if change.renamed_to is None else f"renamed to {change.renamed_to}"), None
    if change.after is None:
        return "shape unknown", existing
    if change.action != CREATE and (existing is None or applied is None):
        return "no current state", existing
    return None, existing


def apply_schema_change(lakehouse: Lakehouse, change: SchemaChange, seq: int, commit_ts: dt.datetime) -> str:
    """Apply one table's schema change at `seq` to its current state; returns what was done. Idempotent
    (settle_schema_change): a repeat after a crash changes nothing twice."""
    done, existing = settle_schema_change(lakehouse, change, seq)
    if done is not None:
        return done
    table, after = change.table, change.after
    assert after is not None
    if change.action == CREATE:
        rows = read_current(lakehouse, change.renamed_from) if change.renamed_from is not None else None
        if rows is None:
            rows = current_schema(after).empty_table()
        else:
            rows = reshape_rows(rows, SchemaChange(table, ALTER, after, after), after, commit_ts, table)
        replace_current(lakehouse, table, sorted_by_key(rows, after.primary_key), seq, existing)
        return f"created from {change.renamed_from}" if change.renamed_from else "created"
    assert existing is not None
    rows = read_query(existing, "SELECT * FROM current", "current")
    reshaped = sorted_by_key(reshape_rows(rows, change, after, commit_ts, table), after.primary_key)
    failpoints.hit("current.alter_before_commit")
    replace_current(lakehouse, table, reshaped, seq, existing)
    failpoints.hit("current.altered")
    return "altered"
