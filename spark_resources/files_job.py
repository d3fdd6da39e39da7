"""Spark jobs over a Delta table's own data files: each task reads some of them with pyarrow (a local directory or
S3, no Hadoop jars), transforms the rows and writes new files; the run process commits the swap. Used to
compact small files, to rewrite a change log whose column type changed, and to reshape a current-state table
after an ALTER: no row passes through the run process."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.lake.delta import max_seq, small_files
from cdc_assets.lake.files import (
    FILE_ACTION_SCHEMA,
    FileAccess,
    add_actions,
    commit_files,
    conformed,
    read_files,
    remove_actions,
    write_files,
)
from cdc_assets.lake.store import Lakehouse
from spark_resources.transforms import item_tasks


def rewrite_files(
    spark: SparkSession,
    access: FileAccess,
    table_key: str,
    table_text: str,
    groups: list[list[str]],
    transform: Callable[[pa.Table], pa.Table],
    target_key: str | None = None,
    whole: bool = False,
) -> list[dict]:
    """Each group of the table's files (paths relative to its directory) read by one task, its rows passed
    through `transform` (a row group at a time, or the whole group at once with `whole`) and written as new
    files (in `target_key`'s directory: a renamed table's); returns their add actions."""
    if not groups:
        return []
    tasks = pa.table({"group": pa.array(groups, pa.list_(pa.string()))})

    def rewrite(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for paths in batch.column("group").to_pylist():
                parts = read_files(access, table_key, paths)
                if whole:
                    read = list(parts)
                    parts = iter([pa.concat_tables(read, promote_options="permissive")] if read else [])
                rows = (transform(part) for part in parts)
                for action in write_files(access, target_key or table_key, table_text, rows):
                    yield pa.RecordBatch.from_pylist([action], schema=FILE_ACTION_SCHEMA)

    return [row.asDict() for row in item_tasks(spark, tasks, rewrite, FILE_ACTION_SCHEMA).collect()]


def small_file_groups(paths_and_sizes: list[tuple[str, int]], target_bytes: int) -> list[list[str]]:
    """Files grouped so that each group adds up to about `target_bytes`: one task, one new file each."""
    groups: list[list[str]] = []
    size = 0
    for path, bytes_ in sorted(paths_and_sizes):
        if not groups or size + bytes_ > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(path)
        size += bytes_
    return [g for g in groups if g]


def compact_tables(
    lakehouse: Lakehouse, spark: SparkSession, layer: str, tables: list[TableRef], target_bytes: int, seq_key: str
) -> list[TableRef]:
    """`lake.delta.compact_small_files` for many tables in one Spark job (a job per table would cost Spark's fixed
    overhead once per table): each table's small files (`lake.delta.small_files`) rewritten by tasks as files of
    about `target_bytes`, then each table's swap committed here, side by side, as a change of layout, not of data.
    Returns the tables compacted."""
    due = []
    for table, existing in zip(tables, for_each_table(tables, lambda t: lakehouse.open(layer, t)), strict=True):
        if existing is None:
            continue
        small = small_files(existing, target_bytes)
        if small:
            due.append((table, existing, small, pa.schema(existing.schema().to_arrow())))
    if not due:
        return []
    access = lakehouse.file_access()
    keys = [lakehouse.table_key(layer, table) for table, _, _, _ in due]
    schemas = [schema for _, _, _, schema in due]
    work = [(i, group) for i, (_, _, small, _) in enumerate(due) for group in small_file_groups(small, target_bytes)]
    tasks = pa.table({"table": pa.array([i for i, _ in work], pa.int32()), "group": pa.array([g for _, g in work], pa.list_(pa.string()))})

    def rewrite(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i, paths in zip(batch.column("table").to_pylist(), batch.column("group").to_pylist(), strict=True):
                rows = (conformed(part, schemas[i]) for part in read_files(access, keys[i], paths))
                for action in write_files(access, keys[i], str(i), rows):
                    yield pa.RecordBatch.from_pylist([action], schema=FILE_ACTION_SCHEMA)

    written = [r.asDict() for r in item_tasks(spark, tasks, rewrite, FILE_ACTION_SCHEMA).collect()]

    def commit(i: int) -> TableRef:
        table, existing, small, schema = due[i]
        mine = [{**w, "table": str(table)} for w in written if w["table"] == str(i)]
        seq = max_seq(existing, seq_key) or 0
        commit_files(
            existing, lakehouse.table_uri(layer, table), lakehouse.storage_options(), keys[i], schema,
            add_actions(mine, data_change=False), remove_actions(existing, [p for p, _ in small], data_change=False),
            seq_key, seq, {},
        )  # fmt: skip
        return table

    return for_each_table(list(range(len(due))), commit)
