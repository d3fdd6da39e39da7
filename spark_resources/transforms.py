"""Generic Spark helpers every stage's Spark half uses: frames of Arrow rows held in the run process, and Spark
schemas for Arrow ones (what mapInArrow and applyInArrow return)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType


def spark_schema(schema: pa.Schema) -> StructType:
    """A Spark schema for an Arrow one (mapInArrow's output, a frame's columns)."""
    return from_arrow_schema(schema)


def arrow_frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    """A frame of rows held here, typed from their Arrow schema: Spark Connect cannot infer a schema from an
    empty table, and inference could widen or rename a type where the Arrow schema is exact."""
    return spark.createDataFrame(rows, schema=spark_schema(rows.schema))


MAX_TASKS = 64  # tasks of one job over many small items (tables, batches, file groups), on a cluster of any size
TASKS_PER_CORE = 2  # per executor core: enough to even out unequal items, few enough that each pays its start once


def task_count(spark: SparkSession, items: int) -> int:
    """How many tasks a job over `items` small items (each a table's merge, a batch's read, a group of files) gets:
    a few per executor core, not one per item. Each task pays a fixed start (scheduling, its closure with every
    item's plan, a Python worker's round trip), so 64 tasks over 200 tables on two cores cost seconds of start
    alone (benchmarks/README.md, "Where a cluster sync's seconds go"). A Connect session has no SparkContext here:
    it keeps MAX_TASKS (item_tasks gives it the server's default parallelism instead)."""
    cores = spark._sc.defaultParallelism if sees_its_cores(spark) else MAX_TASKS
    return max(1, min(items, MAX_TASKS, cores * TASKS_PER_CORE))


def sees_its_cores(spark: SparkSession) -> bool:
    """Whether the session's SparkContext is in this process (local or a cluster), so task_count knows its cores;
    a Connect session's is on its server."""
    return getattr(spark, "_sc", None) is not None


TaskWork = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def item_tasks(spark: SparkSession, items: pa.Table, work: TaskWork, schema: pa.Schema, tasks: int | None = None) -> DataFrame:
    """`work` run by `tasks` tasks (default `task_count`), each given its share of `items` (small rows held here:
    tables, batches, file groups, chunks) and returning rows of `schema`. The tasks are a range's partitions and
    the items travel in the closure: spreading a frame of the items with a repartition costs a shuffle, a Spark
    job of its own before every such job (benchmarks/README.md, "Jobs without a shuffle of their work list")."""
    def run(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        taken = [batch.column(0) for batch in ids if batch.num_rows]
        if taken:
            yield from work(iter(items.take(pa.concat_arrays(taken)).to_batches()))

    if tasks is None and not sees_its_cores(spark):
        # a Connect session: task_count cannot see the server's cores from here, a range without a count has as many
        # partitions as they are (its default parallelism; empty ones for fewer items cost next to nothing)
        return spark.range(0, items.num_rows).mapInArrow(run, spark_schema(schema))
    count = max(1, tasks if tasks is not None else task_count(spark, items.num_rows))
    return spark.range(0, items.num_rows, 1, count).mapInArrow(run, spark_schema(schema))
