"""The current-state stage on Spark, with no row passing through the run process.

Tasks read a table's pending change-log rows from its files; Spark picks the newest change per key; tasks read
the current-state files whose key range holds a changed key, join them with those changes and write the
result sorted by key (copy on write, as delta-rs's own MERGE does); the run process gets back the files' add
actions and commits them with the removes of the files they replace, in one Delta commit
(cdc_assets/stages/current.py). A keyless table is rewritten whole: its copies of a row are counted across
all of its files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cdc_assets.core.ops import REMOVES, ROW_OPS, SCHEMA_OPS, UPDATE, WRITES
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.change_rows import cast_column
from cdc_assets.lake.current_rows import (
    DUP_COLUMN,
    current_schema,
    file_ranges,
    merge_rows,
    newest_rows,
    touched_by,
)
from cdc_assets.lake.files import (
    FILE_ACTION_SCHEMA,
    FILE_ROWS,
    FileAccess,
    conformed,
    read_files,
    write_files,
)
from spark_resources.transforms import arrow_frame, spark_schema

SPARK_FILE_ROWS = FILE_ROWS
ACTION = "_cdc_action"
OUTCOME = "_cdc_outcome"  # kept, inserted, updated, deleted: counted by the writers, never written
WRITTEN_SCHEMA = pa.schema(
    list(FILE_ACTION_SCHEMA)
    + [pa.field(f"{o}_rows", pa.int64(), nullable=False) for o in ("inserted", "updated", "deleted")]
)
EVENT_OPS = (*SCHEMA_OPS, "truncate")


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
    tasks = arrow_frame(spark, pa.table({"path": paths}))

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in read_files(access, table_key, batch.column("path").to_pylist()):
                rows = conformed(part, schema)
                if after_seq is not None:
                    rows = rows.filter(pc.greater(rows.column("_cdc_seq"), after_seq))
                yield from rows.to_batches()

    return tasks.repartition(min(len(paths), 64)).mapInArrow(read, spark_schema(schema))


@dataclass
class PendingSummary:
    """What the run process learns of a table's pending changes: their events (TRUNCATE and schema changes,
    one row each) and how many changes there are, up to which seq. Nothing of the rows themselves."""

    events: list[dict[str, Any]] = field(default_factory=list)  # _cdc_seq, _cdc_op, _cdc_commit_ts, _cdc_ddl
    changes: int = 0
    max_seq: int | None = None


# -- the newest change per key, in the current state's types ----------------------------------------------------


def _images(changes: DataFrame, shape: TableShape) -> tuple[DataFrame, DataFrame]:
    """Row changes as the rows they write (`after`: inserts and updates) and remove (`before`: deletes, and
    the old key of an update that moved a row), with the change's seq and time."""
    names = shape.column_names
    meta = [F.col("_cdc_seq"), F.col("_cdc_commit_ts")]
    op = F.col("_cdc_op")
    writes = changes.where(op.isin(*WRITES)).select(
        F.col("_cdc_key").alias("_cdc_k"), *[_col(n).alias(n) for n in names], *meta
    )
    moved = (op == UPDATE) & (F.col("_cdc_before_key") != F.col("_cdc_key"))
    removes = changes.where(op.isin(*REMOVES) | moved).select(
        F.col("_cdc_before_key").alias("_cdc_k"), *[F.col("_cdc_before").getField(n).alias(n) for n in names], *meta
    )
    return writes, removes


def _typed(frame: DataFrame, schema: pa.Schema) -> DataFrame:
    """A change-log frame in the current state's types (the log may hold a wider type: MODIFY COLUMN)."""

    def cast(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = pa.Table.from_batches([batch])
            arrays = [cast_column(rows.column(f.name), f.type) for f in schema]
            yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()

    return frame.mapInArrow(cast, spark_schema(schema))


def latest_changes(changes: DataFrame, shape: TableShape, truncate_seq: int | None) -> DataFrame:
    """Per key, the newest change: the row it upserts or the key it deletes (`_cdc_action`), in the current
    state's types. After a TRUNCATE only the changes that follow it decide a key's row."""
    if truncate_seq is not None:
        changes = changes.where(F.col("_cdc_seq") > truncate_seq)
    writes, removes = _images(changes.where(F.col("_cdc_op").isin(*ROW_OPS)), shape)
    both = writes.withColumn(ACTION, F.lit("upsert")).unionByName(removes.withColumn(ACTION, F.lit("delete")))
    newest_first = Window.partitionBy("_cdc_k").orderBy(F.col("_cdc_seq").desc())
    latest = both.withColumn("_cdc_rank", F.row_number().over(newest_first)).where(F.col("_cdc_rank") == 1)
    schema = pa.schema(
        [f for f in current_schema(shape) if f.name != DUP_COLUMN] + [pa.field(ACTION, pa.string(), nullable=False)]
    )
    return _typed(latest.drop("_cdc_rank", "_cdc_k"), schema)


# -- which files a change may touch -----------------------------------------------------------------------------


def touched_files(latest: DataFrame, key: list[str], ranges: list[dict[str, Any]]) -> list[str]:
    """The current-state files whose key range (their statistics) holds a changed key (lake.current_rows.touched_by,
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
    if truncate_seq is not None:  # the rows written before the TRUNCATE go
        existing = existing.where(F.col("_cdc_seq") > truncate_seq)
    t, s = existing.alias("t"), latest.alias("s")
    on = reduce(lambda a, b: a & b, [t[q(k)] == s[q(k)] for k in key])
    joined = t.join(s, on, "full_outer")
    absent, fresh = t[q(key[0])].isNull(), s[q(key[0])].isNull()
    newer = ~absent & ~fresh & (s["_cdc_seq"] > t["_cdc_seq"])
    take_change = absent | newer
    outcome = (
        F.when(fresh, F.lit("kept"))
        .when(take_change & (s[ACTION] == "delete"), F.lit("deleted"))
        .when(absent & (s[ACTION] == "upsert"), F.lit("inserted"))
        .when(newer, F.lit("updated"))
        .otherwise(F.lit("kept"))
    )
    columns = [F.when(take_change, s[q(f.name)]).otherwise(t[q(f.name)]).alias(f.name) for f in schema]
    merged = joined.select(*columns, outcome.alias(OUTCOME)).where(
        ~(absent & (s[ACTION] == "delete"))  # a delete of a row that is not there: nothing
    )
    parts = max(1, min(64, len(touched) + expected_rows // SPARK_FILE_ROWS + 1))
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
    if truncate_seq is not None:
        existing = existing.where(F.col("_cdc_seq") > truncate_seq)
        changes = changes.where(F.col("_cdc_seq") > truncate_seq)
    writes, removes = _images(changes.where(F.col("_cdc_op").isin(*ROW_OPS)), shape)
    image_schema = pa.schema([f for f in schema if f.name != DUP_COLUMN] + [pa.field("_cdc_weight", pa.int64())])
    moves = _typed(writes.drop("_cdc_k").withColumn("_cdc_weight", F.lit(1)), image_schema).unionByName(
        _typed(removes.drop("_cdc_k").withColumn("_cdc_weight", F.lit(-1)), image_schema)
    )
    net = moves.groupBy(*[_col(n) for n in names]).agg(
        F.sum("_cdc_weight").alias("_cdc_net"),
        F.max("_cdc_seq").alias("_cdc_new_seq"),
        F.max("_cdc_commit_ts").alias("_cdc_new_ts"),
    )
    have = existing.groupBy(*[_col(n) for n in names]).agg(F.count(F.lit(1)).alias("_cdc_have"))
    n_, h_ = net.alias("n"), have.alias("h")
    counts = n_.join(h_, reduce(lambda a, b: a & b, [n_[q(c)].eqNullSafe(h_[q(c)]) for c in names]), "left").select(
        *[n_[q(c)].alias(c) for c in names],
        F.coalesce(h_["_cdc_have"], F.lit(0)).alias("_cdc_have"),
        "_cdc_net",
        "_cdc_new_seq",
        "_cdc_new_ts",
    )
    counts = counts.withColumn("_cdc_want", F.greatest(F.col("_cdc_have") + F.col("_cdc_net"), F.lit(0)))
    e_, c_ = existing.alias("e"), counts.alias("c")
    matched = reduce(lambda a, b: a & b, [e_[q(c)].eqNullSafe(c_[q(c)]) for c in names])
    kept = (
        e_.join(c_, matched, "left")
        .where(c_["_cdc_want"].isNull() | (e_[q(DUP_COLUMN)] < c_["_cdc_want"]))
        .select(*[e_[q(f.name)].alias(f.name) for f in schema], F.lit("kept").alias(OUTCOME))
    )
    removed = (
        e_.join(c_, matched, "inner")
        .where(e_[q(DUP_COLUMN)] >= c_["_cdc_want"])
        .select(*[e_[q(f.name)].alias(f.name) for f in schema], F.lit("deleted").alias(OUTCOME))
    )
    added = (
        counts.where(F.col("_cdc_want") > F.col("_cdc_have"))
        .withColumn("_cdc_new_dup", F.explode(F.sequence(F.col("_cdc_have"), F.col("_cdc_want") - 1)))
        .withColumn(DUP_COLUMN, F.col("_cdc_new_dup").cast("int"))
        .select(
            *[_col(n) for n in names],
            F.col("_cdc_new_seq").alias("_cdc_seq"),
            F.col("_cdc_new_ts").alias("_cdc_commit_ts"),
            _col(DUP_COLUMN),
            F.lit("inserted").alias(OUTCOME),
        )
    )
    merged = kept.unionByName(removed).unionByName(added)
    parts = max(1, min(64, len(paths) + 1))
    written = merged.repartition(parts).mapInArrow(
        _write_counting(access, table_key, table_text), spark_schema(WRITTEN_SCHEMA)
    )
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
                    out.append({"table": table, "changes": rows.num_rows, "max_seq": pc.max(seqs).as_py()})
                    yield pa.RecordBatch.from_pylist(out, schema=SUMMARY_SCHEMA)

    frame = arrow_frame(spark, pa.table({"table": [t for t, _ in work], "path": [p for _, p in work]}))
    rows = frame.repartition(min(len(work), 64)).mapInArrow(read, spark_schema(SUMMARY_SCHEMA)).collect()
    for row in (r.asDict() for r in rows):
        summary = found[row["table"]]
        if row["changes"] is not None:
            summary.changes += int(row["changes"])
            summary.max_seq = max(summary.max_seq or 0, int(row["max_seq"]))
        else:
            summary.events.append({k: row[k] for k in ("_cdc_seq", "_cdc_op", "_cdc_commit_ts", "_cdc_ddl")})
    for summary in found.values():
        summary.events.sort(key=lambda e: e["_cdc_seq"])
    return found


@dataclass(frozen=True)
class SmallMerge:
    """A keyed table whose pending changes (in (`after`, `upto`], under one shape, no TRUNCATE among them) one
    task applies whole, on Arrow: its change-log files, and its current-state files with their key ranges."""

    table_text: str
    shape: TableShape
    log: PendingFiles
    log_schema: pa.Schema
    upto: int
    current_key: str
    ranges: list[dict[str, Any]]


MERGED_SCHEMA = pa.schema(
    list(FILE_ACTION_SCHEMA)
    + [
        pa.field("work", pa.int64(), nullable=False),
        pa.field("removed", pa.list_(pa.string())),  # on the table's last row: the files its new ones replace
    ]
    + [pa.field(f"{o}_rows", pa.int64(), nullable=False) for o in ("inserted", "updated", "deleted")]
)


def merge_small_tables(spark: SparkSession, access: FileAccess, work: list[SmallMerge]) -> list[Rewritten]:
    """Each table's copy on write in one task of one Spark job (lake.current_rows: the newest change per key,
    the files it touches, the merge): a job per table costs its fixed overhead hundreds of times over when a
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
                newest = newest_rows(changes.filter(window), w.shape, None)
                key = list(w.shape.primary_key)
                touched = sorted(touched_by(newest.select(key), w.ranges))
                schema = current_schema(w.shape)
                existing = [conformed(p, schema) for p in read_files(access, w.current_key, touched)]
                merged, counts = merge_rows(pa.concat_tables(existing) if existing else schema.empty_table(), newest, key)
                actions = list(write_files(access, w.current_key, w.table_text, [merged]))
                none = {"table": w.table_text, "path": "", "size": 0, "rows": 0, "stats": "", "modification_time": 0}
                for n, action in enumerate(actions or [none]):
                    last = n == max(len(actions), 1) - 1
                    action.update(work=i, removed=touched if last else None)
                    action.update({f"{k}_rows": counts[k] if last else 0 for k in counts})
                    yield pa.RecordBatch.from_pylist([action], schema=MERGED_SCHEMA)

    frame = arrow_frame(spark, pa.table({"work": pa.array(range(len(work)), pa.int64())}))
    rows = [r.asDict() for r in frame.repartition(min(len(work), 64)).mapInArrow(merge, spark_schema(MERGED_SCHEMA)).collect()]
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
