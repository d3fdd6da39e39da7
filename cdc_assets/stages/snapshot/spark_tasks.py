"""Snapshots on Spark: tasks read a table's rows from the source one primary-key range at a time (each task its
own PyMySQL connection) and write them as current-state files; the run process only plans the ranges and
commits (cdc_assets/stages/snapshot/on_spark.py). No task takes a lock on the source."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from cdc_assets.core import failpoints
from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.files import FILE_ACTION_SCHEMA, FileAccess, put_object, write_files
from cdc_assets.source import server as source
from cdc_assets.source.rows import key_range_select, read_query_rows, read_source_chunks
from cdc_assets.stages.current.rows import DUP_COLUMN, current_schema, number_duplicates
from spark_resources.transforms import TaskWork, item_tasks

READ_ROWS = 100_000  # rows a task holds at once
CHUNK_SCHEMA = pa.schema(list(FILE_ACTION_SCHEMA) + [pa.field("chunk", pa.int64(), nullable=False)])
WHOLE_SCHEMA = pa.schema(
    list(CHUNK_SCHEMA)
    + [pa.field(f"{end}_{part}", pa.string() if part == "file" else pa.int64(), nullable=False)
       for end in ("low", "high") for part in ("file", "pos")]
    + [pa.field(f"committed_{when}", pa.string(), nullable=True) for when in ("before", "after")]
)  # fmt: skip


@dataclass(frozen=True)
class ChunkRead:
    """One task's work: the rows of `shape`'s table whose key is in [low, high) (None: unbounded), written
    under `table_key` with `_cdc_seq` = `seq`, through the column policy (core/column_policy).

    The policy, hash key included, reaches the executors inside the task's pickled closure only: never in the
    Spark configuration, the environment or a log, which Spark shows or writes out (its `repr` leaves the key out)."""

    table_key: str
    shape: TableShape
    low: tuple | None
    high: tuple | None
    seq: int
    taken_at: dt.datetime
    done_key: str = ""  # where the task records the chunk once its files are complete (keyed chunks)
    policy: ColumnPolicy = field(default_factory=ColumnPolicy)

    @property
    def lake(self) -> TableShape:
        """The shape the lakehouse keeps the rows in."""
        return self.policy.lake_shape(self.shape)

    def lake_rows(self, rows: pa.Table) -> pa.Table:
        """Source rows as current-state rows: policed, with the snapshot's seq and time."""
        return with_snapshot_columns(self.policy.lake_rows(self.shape, rows), self.lake, self.seq, self.taken_at)


def with_snapshot_columns(rows: pa.Table, shape: TableShape, seq: int, taken_at: dt.datetime) -> pa.Table:
    """Source rows as current-state rows: every row the snapshot's seq and time."""
    rows = rows.append_column("_cdc_seq", pa.array([seq] * rows.num_rows, pa.int64())).append_column(
        "_cdc_commit_ts", pa.array([taken_at] * rows.num_rows, pa.timestamp("us", tz="UTC"))
    )
    if not shape.primary_key:  # identical rows of a keyless table are told apart by their ordinal
        rows = rows.append_column(DUP_COLUMN, number_duplicates(rows, shape.column_names))
    return rows.cast(current_schema(shape))


def with_seq(rows: pa.Table, seq: int) -> pa.Table:
    """Snapshot rows given the seq of their position, once capture has reached it (keyless tables)."""
    index = rows.schema.get_field_index("_cdc_seq")
    return rows.set_column(index, rows.schema.field(index), pa.array([seq] * rows.num_rows, pa.int64()))


def _one_task_each(spark: SparkSession, ids: list[int], work: TaskWork, schema: pa.Schema) -> DataFrame:
    return item_tasks(spark, pa.table({"chunk": pa.array(ids, pa.int64())}), work, schema, tasks=len(ids))


def read_chunks(
    spark: SparkSession, url: MySQLUrl, access: FileAccess, chunks: dict[int, ChunkRead], piece_bytes: int
) -> list[dict]:
    """Every chunk read by a task of its own and written as files (one SELECT each: one consistent read), then
    recorded at its `done_key`; the files' add actions, each with its chunk's id, in key order as current state's
    pieces of `piece_bytes` (the lakehouse's)."""
    if not chunks:
        return []

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        conn = source.connect(url)
        try:
            for batch in batches:
                for chunk in batch.column("chunk").to_pylist():
                    work = chunks[chunk]
                    sql = key_range_select(conn, work.shape, work.low, work.high)
                    rows = (work.lake_rows(part) for part in read_query_rows(conn, list(work.shape.columns), sql, READ_ROWS))
                    # in key order: current state's pieces, so a change rewrites about one piece
                    actions = list(write_files(access, work.table_key, str(work.shape.table), rows, piece_bytes))
                    # the chunk is done only once this object exists: a snapshot started again skips it
                    put_object(access, work.done_key, json.dumps(actions).encode())
                    failpoints.hit("snapshot.chunk_written")
                    for action in actions:
                        yield pa.RecordBatch.from_pylist([{**action, "chunk": chunk}], schema=CHUNK_SCHEMA)
        finally:
            conn.close()

    written = _one_task_each(spark, sorted(chunks), read, CHUNK_SCHEMA)
    return [r.asDict() for r in written.collect()]


def read_whole_tables(
    spark: SparkSession, url: MySQLUrl, server: source.ServerInfo, access: FileAccess, tables: dict[int, ChunkRead],
    global_read_lock: bool = False,
) -> dict[int, tuple[list[dict], source.SnapshotPoint]]:
    """Each table read whole by one task inside a consistent snapshot of its own, for keyless tables: their
    copies of a row are numbered over the whole table, and changes can only be replayed over them from exactly
    the snapshot's binlog position. Returns each table's files and where its snapshot lies in the binlog (lock-free
    on MySQL: between two watermarks, which the run process settles)."""
    if not tables:
        return {}

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for chunk in batch.column("chunk").to_pylist():
                work = tables[chunk]
                conn = source.connect(url)
                try:
                    settle = source.MYSQL_SETTLE_SECONDS
                    with source.consistent_snapshot(conn, server, global_read_lock, settle) as point:
                        parts = list(read_source_chunks(conn, work.shape.table, list(work.shape.columns), READ_ROWS))
                finally:
                    conn.close()
                rows = work.lake_rows(pa.concat_tables(parts))
                where = {"chunk": chunk, "low_file": point.low.log_file, "low_pos": point.low.log_pos,
                         "high_file": point.high.log_file, "high_pos": point.high.log_pos,
                         "committed_before": point.committed_before, "committed_after": point.committed_after}  # fmt: skip
                actions = list(write_files(access, work.table_key, str(work.shape.table), [rows]))
                none = {"table": str(work.shape.table), "path": "", "size": 0, "rows": 0, "stats": "", "modification_time": 0}
                for action in actions or [none]:  # an empty table still reports its position
                    yield pa.RecordBatch.from_pylist([{**action, **where}], schema=WHOLE_SCHEMA)

    found: dict[int, tuple[list[dict], source.SnapshotPoint]] = {}
    for row in _one_task_each(spark, sorted(tables), read, WHOLE_SCHEMA).collect():
        action = row.asDict()
        point = source.SnapshotPoint(
            BinlogPosition(action["low_file"], int(action["low_pos"])),
            BinlogPosition(action["high_file"], int(action["high_pos"])),
            action["committed_before"],
            action["committed_after"],
        )
        files, _ = found.setdefault(action["chunk"], ([], point))
        if action["path"]:
            files.append(action)
    return found
