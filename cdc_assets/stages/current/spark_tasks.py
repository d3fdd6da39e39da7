"""The current-state stage on Spark, with no row passing through the run process.

Tasks read a table's pending change-log rows from its files; Spark picks the newest change per key; tasks read
the current-state files whose key range holds a changed key, join them with those changes and write the
result sorted by key (copy on write, as delta-rs's own MERGE does); the run process gets back the files' add
actions and commits them with the removes of the files they replace, in one Delta commit
(cdc_assets/stages/current/run.py). A keyless table is rewritten whole: its copies of a row are counted across
all of its files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_assets.core.ops import ROW_OPS, SCHEMA_OPS, TRUNCATE
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.files import (
    FILE_ACTION_SCHEMA,
    FILE_ROWS,
    FileAccess,
    conformed,
    read_files,
    write_files,
)
from cdc_assets.stages.changes.rows import cast_column
from cdc_assets.stages.current.rows import (
    current_schema,
    file_ranges,
    touched_by,
)
from cdc_assets.stages.current.rules import (
    ACTION_COLUMN,
    KEY_COLUMN,
    OUTCOME_COLUMN,
    WEIGHT_COLUMN,
    after_truncate,
    copy_changes,
    copy_moves,
    image_schema,
    key_images,
    merge_rows,
    merged_with_outcomes,
    newest_per_key,
    newest_rows,
    written_rows,
)
from spark_resources.transforms import arrow_frame, item_tasks, spark_schema

SPARK_FILE_ROWS = FILE_ROWS
ACTION = ACTION_COLUMN
OUTCOME = OUTCOME_COLUMN  # kept, inserted, updated, deleted: counted by the writers, never written
BUCKET = "_cdc_bucket"  # a merge's group of rows: those of some keys (of some distinct rows, keyless), both sides
WRITTEN_SCHEMA = pa.schema(
    list(FILE_ACTION_SCHEMA)
    + [pa.field(f"{o}_rows", pa.int64(), nullable=False) for o in ("inserted", "updated", "deleted")]
)
EVENT_OPS = (*SCHEMA_OPS, TRUNCATE)


def q(name: str) -> str:
    """A column name as Spark reads it, whatever it holds (dots, backticks)."""
    return "`" + name.replace("`", "``") + "`"


def _col(name: str, frame: DataFrame | None = None) -> Column:
    return frame[q(name)] if frame is not None else F.col(q(name))


# -- reading a table's files ------------------------------------------------------------------------------------


def table_frame(
    spark: SparkSession, access: FileAccess, table_key: str, paths: list[str], schema: pa.Schema, after_seq: int | None = None
) -> DataFrame:
    """The rows of some of a table's files, read by tasks, in the table's schema now (older files widened),
    only those past `after_seq` when it is given."""
    if not paths:
        return arrow_frame(spark, schema.empty_table())

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in read_files(access, table_key, batch.column("path").to_pylist()):
                rows = conformed(part, schema)
                if after_seq is not None:
                    rows = rows.filter(pc.greater(rows.column("_cdc_seq"), after_seq))
                yield from rows.to_batches()

    return item_tasks(spark, pa.table({"path": paths}), read, schema)


@dataclass
class PendingSummary:
    """What the run process learns of a table's pending changes: their events (TRUNCATE and schema changes,
    one row each) and how many changes there are, up to which seq. Nothing of the rows themselves."""

    events: list[dict[str, Any]] = field(default_factory=list)  # _cdc_seq, _cdc_op, _cdc_commit_ts, _cdc_ddl
    changes: int = 0
    max_seq: int | None = None
    first_change: int | None = None  # the lowest and highest seq of a row change or TRUNCATE: spans outside
    last_change: int | None = None  # them hold nothing to apply


# -- the rules, applied by tasks (stages.current.rows: the same functions the Arrow engine calls) ----------------------


def _typed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows as Spark hands them to a task, in `schema`'s Arrow types (Spark has no unsigned or JSON types)."""
    return pa.Table.from_arrays([cast_column(rows.column(f.name), f.type) for f in schema], schema=schema)


def _whole_partition(rule: Callable[[pa.Table], pa.Table]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task's function that applies `rule` to all of its partition's rows at once (a rule over groups of rows
    needs every row of a group, and a partition arrives in batches)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [pa.Table.from_batches([b]) for b in batches]
        if rows:
            yield from rule(pa.concat_tables(rows)).to_batches()

    return run


def latest_changes(changes: DataFrame, shape: TableShape, truncate_seq: int | None) -> DataFrame:
    """Per key, the newest change (stages.current.rules.newest_rows): tasks turn changes into key images, Spark puts
    every image of a key in one partition, and tasks keep the newest of each key."""
    images = image_schema(shape).append(pa.field(KEY_COLUMN, pa.string())).append(pa.field(ACTION, pa.string()))

    def imaged(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from key_images(after_truncate(pa.Table.from_batches([batch]), truncate_seq), shape).to_batches()

    newest = pa.schema([f for f in images if f.name != KEY_COLUMN])
    keyed = changes.where(F.col("_cdc_op").isin(*ROW_OPS)).mapInArrow(imaged, spark_schema(images))
    rule = _whole_partition(lambda rows: newest_per_key(_typed(rows, images)))
    return keyed.repartition(KEY_COLUMN).mapInArrow(rule, spark_schema(newest))


def _bucketed(frame: DataFrame, columns: list[str], buckets: int) -> DataFrame:
    """The frame with the bucket of its rows' `columns` (their hash: equal values, equal bucket on either side)."""
    return frame.withColumn(BUCKET, F.pmod(F.hash(*[_col(c) for c in columns]), F.lit(buckets)))


def _by_bucket(
    rows: DataFrame, changes: DataFrame, columns: list[str], buckets: int,
    rule: Callable[[pa.Table, pa.Table], pa.Table], out: pa.Schema,
) -> DataFrame:  # fmt: skip
    """A table's rows and its changes with the same values of `columns` handed to `rule` together, a task call per
    bucket of them (cogroup): the shuffle that lets a rule written for Arrow batches run over a large table."""
    grouped = _bucketed(rows, columns, buckets).groupBy(BUCKET)
    return grouped.cogroup(_bucketed(changes, columns, buckets).groupBy(BUCKET)).applyInArrow(rule, spark_schema(out))


# -- which files a change may touch -----------------------------------------------------------------------------


def touched_files(latest: DataFrame, key: list[str], ranges: list[dict[str, Any]]) -> list[str]:
    """The current-state files whose key range (their statistics) holds a changed key (stages.current.rows.touched_by,
    a task per part of the changes)."""

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found: set[str] = set()
        for batch in batches:
            found |= touched_by(pa.Table.from_batches([batch]), [f for f in ranges if f["path"] not in found])
        yield pa.RecordBatch.from_pydict({"path": sorted(found)}, schema=pa.schema([("path", pa.string())]))

    rows = latest.select(*[_col(k) for k in key]).mapInArrow(probe, "path string").distinct().collect()
    return sorted(r["path"] for r in rows)


# -- merging and writing ---------------------------------------------------------------------------------------


def _write_counting(access: FileAccess, table_key: str, table_text: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task's writer of merged rows: counts their outcomes, drops the deleted ones and the outcome column,
    writes the rest as files; the last file's action carries the task's counts (they are added up)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts = {"inserted": 0, "updated": 0, "deleted": 0}

        def rows() -> Iterator[pa.Table]:
            for batch in batches:
                table = pa.Table.from_batches([batch])
                outcome = table.column(OUTCOME)
                for name in counts:
                    counts[name] += int(pc.sum(pc.equal(outcome, name)).as_py() or 0)
                yield table.filter(pc.not_equal(outcome, "deleted")).drop_columns([OUTCOME])

        actions = list(write_files(access, table_key, table_text, rows()))
        if not actions:  # nothing left to write: the counts still count
            actions = [{"table": table_text, "path": "", "size": 0, "rows": 0, "stats": "", "modification_time": 0}]
        for n, action in enumerate(actions):
            last = n == len(actions) - 1
            action.update({f"{k}_rows": counts[k] if last else 0 for k in counts})
            yield pa.RecordBatch.from_pylist([action], schema=WRITTEN_SCHEMA)

    return write


@dataclass(frozen=True)
class Rewritten:
    """What a merge wrote: the new files' add actions, the files they replace, and what happened to rows."""

    adds: list[dict]
    removed: list[str]
    inserted: int
    updated: int
    deleted: int


def _collect(written: DataFrame, removed: list[str]) -> Rewritten:
    rows = [r.asDict() for r in written.collect()]
    return Rewritten(
        [r for r in rows if r["path"]],
        removed,
        sum(r["inserted_rows"] for r in rows),
        sum(r["updated_rows"] for r in rows),
        sum(r["deleted_rows"] for r in rows),
    )


def merge_keyed(
    spark: SparkSession,
    access: FileAccess,
    table_key: str,
    table_text: str,
    latest: DataFrame,
    shape: TableShape,
    actions: pa.Table,
    truncate_seq: int | None,
    expected_rows: int,
) -> Rewritten:
    """Copy on write of a keyed table: the files whose key range holds a changed key (every file after a
    TRUNCATE) read by tasks and joined with the newest changes; a change not newer than the row is ignored."""
    key = list(shape.primary_key)
    schema = current_schema(shape)
    paths = actions.column("path").to_pylist() if actions.num_rows else []
    touched = paths if truncate_seq is not None else touched_files(latest, key, file_ranges(actions, key))
    existing = table_frame(spark, access, table_key, touched, schema)
    parts = max(1, min(64, len(touched) + expected_rows // SPARK_FILE_ROWS + 1))
    newest = image_schema(shape).append(pa.field(ACTION, pa.string()))
    marked = schema.append(pa.field(OUTCOME_COLUMN, pa.string()))

    def merge(rows: pa.Table, changes: pa.Table) -> pa.Table:
        kept = after_truncate(_typed(rows, schema), truncate_seq)  # the rows written before a TRUNCATE go
        return merged_with_outcomes(kept, _typed(changes, newest), key)

    merged = _by_bucket(existing, latest, key, parts, merge, marked)
    ordered = merged.repartitionByRange(parts, *[_col(k) for k in key]).sortWithinPartitions(*[_col(k) for k in key])
    written = ordered.mapInArrow(_write_counting(access, table_key, table_text), spark_schema(WRITTEN_SCHEMA))
    return _collect(written, touched)


def merge_keyless(
    spark: SparkSession,
    access: FileAccess,
    table_key: str,
    table_text: str,
    changes: DataFrame,
    shape: TableShape,
    actions: pa.Table,
    truncate_seq: int | None,
) -> Rewritten:
    """A keyless table rewritten whole: per distinct row, the changes add or remove copies (an update removes
    one copy of its before-image and adds one of its after-image); copies beyond what is left go, new ones
    get the next `_cdc_dup` numbers and the newest change's seq and time."""
    schema = current_schema(shape)
    names = shape.column_names
    paths = actions.column("path").to_pylist() if actions.num_rows else []
    existing = table_frame(spark, access, table_key, paths, schema)
    moves_schema = image_schema(shape).append(pa.field(WEIGHT_COLUMN, pa.int64()))

    def moved(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from copy_moves(after_truncate(pa.Table.from_batches([batch]), truncate_seq), shape).to_batches()

    moves = changes.where(F.col("_cdc_op").isin(*ROW_OPS)).mapInArrow(moved, spark_schema(moves_schema))
    parts = max(1, min(64, len(paths) + 1))

    def count(rows: pa.Table, changes: pa.Table) -> pa.Table:
        kept = after_truncate(_typed(rows, schema), truncate_seq)  # the copies written before a TRUNCATE go
        return copy_changes(kept, _typed(changes, moves_schema), shape)

    merged = _by_bucket(existing, moves, names, parts, count, schema.append(pa.field(OUTCOME_COLUMN, pa.string())))
    written = merged.mapInArrow(_write_counting(access, table_key, table_text), spark_schema(WRITTEN_SCHEMA))
    return _collect(written, paths)





# -- many tables at once: what is pending, and small tables merged a task each -------------------------------------

SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("_cdc_seq", pa.int64()),  # an event's (NULL on a file's count row)
        pa.field("_cdc_op", pa.string()),
        pa.field("_cdc_commit_ts", pa.timestamp("us", tz="UTC")),
        pa.field("_cdc_ddl", pa.string()),
        pa.field("changes", pa.int64()),  # a file's count of pending changes (NULL on an event row)
        pa.field("max_seq", pa.int64()),
        pa.field("first_change", pa.int64()),
        pa.field("last_change", pa.int64()),
    ]
)


SUMMARY_COLUMNS = ["_cdc_seq", "_cdc_op", "_cdc_commit_ts", "_cdc_ddl"]


@dataclass(frozen=True)
class PendingFiles:
    """A table's change-log files that may hold changes past `after` (its applied seq)."""

    table_key: str
    paths: list[str]
    after: int | None


def summarize_tables(spark: SparkSession, access: FileAccess, tables: dict[str, PendingFiles]) -> dict[str, PendingSummary]:
    """What is pending in many tables, in one Spark job, a task per group of files: each task reads only the
    columns that say what a change is, and returns the events and a count per file."""
    work = [(t, p) for t, files in sorted(tables.items()) for p in files.paths]
    found = {t: PendingSummary() for t in tables}
    if not work:
        return found

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for table, path in zip(batch.column("table").to_pylist(), batch.column("path").to_pylist(), strict=True):
                files = tables[table]
                for part in read_files(access, files.table_key, [path], SUMMARY_COLUMNS):
                    rows = part if files.after is None else part.filter(pc.greater(part.column("_cdc_seq"), files.after))
                    if not rows.num_rows:
                        continue
                    events = rows.filter(pc.is_in(rows.column("_cdc_op"), pa.array(EVENT_OPS)))
                    out = [
                        {
                            "table": table,
                            "_cdc_seq": e["_cdc_seq"],
                            "_cdc_op": e["_cdc_op"],
                            "_cdc_commit_ts": e["_cdc_commit_ts"],
                            "_cdc_ddl": e.get("_cdc_ddl"),
                        }
                        for e in events.to_pylist()
                    ]
                    seqs = rows.column("_cdc_seq")
                    applied = rows.filter(pc.invert(pc.is_in(rows.column("_cdc_op"), pa.array(SCHEMA_OPS)))).column("_cdc_seq")
                    out.append(
                        {
                            "table": table, "changes": rows.num_rows, "max_seq": pc.max(seqs).as_py(),
                            "first_change": pc.min(applied).as_py(), "last_change": pc.max(applied).as_py(),
                        }
                    )  # fmt: skip
                    yield pa.RecordBatch.from_pylist(out, schema=SUMMARY_SCHEMA)

    items = pa.table({"table": [t for t, _ in work], "path": [p for _, p in work]})
    rows = item_tasks(spark, items, read, SUMMARY_SCHEMA).collect()
    for row in (r.asDict() for r in rows):
        summary = found[row["table"]]
        if row["changes"] is not None:
            summary.changes += int(row["changes"])
            summary.max_seq = max(summary.max_seq or 0, int(row["max_seq"]))
            if row["first_change"] is not None:
                low, high = int(row["first_change"]), int(row["last_change"])
                summary.first_change = low if summary.first_change is None else min(summary.first_change, low)
                summary.last_change = high if summary.last_change is None else max(summary.last_change, high)
        else:
            summary.events.append({k: row[k] for k in ("_cdc_seq", "_cdc_op", "_cdc_commit_ts", "_cdc_ddl")})
    for summary in found.values():
        summary.events.sort(key=lambda e: e["_cdc_seq"])
    return found


@dataclass(frozen=True)
class SmallMerge:
    """A table whose pending changes (in (`after`, `upto`], under one shape, the last TRUNCATE among them at
    `truncate_seq`) one task applies whole, with the rules' Arrow functions: its change-log files, and its
    current-state files with their key ranges."""

    table_text: str
    shape: TableShape
    log: PendingFiles
    log_schema: pa.Schema
    upto: int
    current_key: str
    ranges: list[dict[str, Any]]
    truncate_seq: int | None = None


MERGED_SCHEMA = pa.schema(
    list(FILE_ACTION_SCHEMA)
    + [
        pa.field("work", pa.int64(), nullable=False),
        pa.field("removed", pa.list_(pa.string())),  # on the table's last row: the files its new ones replace
    ]
    + [pa.field(f"{o}_rows", pa.int64(), nullable=False) for o in ("inserted", "updated", "deleted")]
)


def _merged_whole(access: FileAccess, w: SmallMerge, changes: pa.Table) -> tuple[pa.Table, dict[str, int], list[str]]:
    """A small table's changes applied in one task, by the rules both engines share: a keyed table's files that
    hold a changed key (all of them after a TRUNCATE) merged with the newest change per key; a keyless table's
    files all rewritten with its copies counted. Returns the rows to write, the counts and the files replaced."""
    schema = current_schema(w.shape)
    key = list(w.shape.primary_key)
    every = [r["path"] for r in w.ranges]
    if key:
        newest = newest_rows(changes, w.shape, w.truncate_seq)
        touched = every if w.truncate_seq is not None else sorted(touched_by(newest.select(key), w.ranges))
    else:
        touched = every
    parts = [conformed(p, schema) for p in read_files(access, w.current_key, touched)]
    existing = after_truncate(pa.concat_tables(parts) if parts else schema.empty_table(), w.truncate_seq)
    if key:
        merged, counts = merge_rows(existing, newest, key)
        return merged, counts, touched
    marked = copy_changes(existing, copy_moves(after_truncate(changes, w.truncate_seq), w.shape), w.shape)
    return *written_rows(marked), touched


def merge_small_tables(spark: SparkSession, access: FileAccess, work: list[SmallMerge]) -> list[Rewritten]:
    """Each table's changes applied in one task of one Spark job (`_merged_whole`, by stages.current.rules): a job per table costs its fixed overhead hundreds of times over when a
    run touches hundreds of small tables. Returns each table's new files, the files they replace and counts."""
    if not work:
        return []

    def merge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column("work").to_pylist():
                w = work[i]
                parts = [conformed(p, w.log_schema) for p in read_files(access, w.log.table_key, w.log.paths)]
                changes = pa.concat_tables(parts) if parts else w.log_schema.empty_table()
                seqs = changes.column("_cdc_seq")
                window = pc.less_equal(seqs, w.upto)
                if w.log.after is not None:
                    window = pc.and_(window, pc.greater(seqs, w.log.after))
                merged, counts, touched = _merged_whole(access, w, changes.filter(window))
                actions = list(write_files(access, w.current_key, w.table_text, [merged]))
                none = {"table": w.table_text, "path": "", "size": 0, "rows": 0, "stats": "", "modification_time": 0}
                for n, action in enumerate(actions or [none]):
                    last = n == max(len(actions), 1) - 1
                    action.update(work=i, removed=touched if last else None)
                    action.update({f"{k}_rows": counts[k] if last else 0 for k in counts})
                    yield pa.RecordBatch.from_pylist([action], schema=MERGED_SCHEMA)

    items = pa.table({"work": pa.array(range(len(work)), pa.int64())})
    rows = [r.asDict() for r in item_tasks(spark, items, merge, MERGED_SCHEMA).collect()]
    done = []
    for i in range(len(work)):
        mine = [r for r in rows if r["work"] == i]
        done.append(
            Rewritten(
                [{k: r[k] for k in FILE_ACTION_SCHEMA.names} for r in mine if r["path"]],
                [p for r in mine if r["removed"] for p in r["removed"]],
                sum(r["inserted_rows"] for r in mine),
                sum(r["updated_rows"] for r in mine),
                sum(r["deleted_rows"] for r in mine),
            )
        )
    return done
