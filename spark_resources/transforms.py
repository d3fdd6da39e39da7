"""Spark-side transforms: each is one Spark job over every table at once.

Tables differ in columns, so these jobs work on the generic form of a change (table, `_cdc_seq`,
operation, row images as canonical texts, keys as JSON texts). Typing columns per table happens
afterwards, vectorised in Arrow.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

KEY_EVENTS_SCHEMA = pa.schema(
    [
        pa.field("table_id", pa.int32(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("key", pa.string()),
        pa.field("before_key", pa.string()),
    ]
)


def spark_schema(schema: pa.Schema) -> StructType:
    """A Spark schema for an Arrow one (mapInArrow's output, a frame's columns)."""
    return from_arrow_schema(schema)


def arrow_frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    """A frame of rows held here, typed from their Arrow schema: Spark Connect cannot infer a schema from an
    empty table, and inference could widen or rename a type where the Arrow schema is exact."""
    return spark.createDataFrame(rows, schema=spark_schema(rows.schema))


def _key_json(image: Column) -> Column:
    """The row's key as a JSON array of canonical texts: equal keys, equal text."""
    return F.when(image.isNull(), F.lit(None)).otherwise(
        F.to_json(F.transform(F.col("key_idx"), lambda i: F.element_at(image, i + 1)))
    )


def keyed_frame(changes: DataFrame, table_keys: DataFrame) -> DataFrame:
    """Raw rows (the raw batch columns plus `batch`) with `key` / `before_key`: `table_keys` maps (batch,
    table_version) to the 0-based positions of the key columns (`key_idx`)."""
    return changes.join(F.broadcast(table_keys), on=["batch", "table_version"], how="inner").select(
        *[F.col(c) for c in changes.columns],
        _key_json(F.coalesce(F.col("after"), F.col("before"))).alias("key"),
        _key_json(F.col("before")).alias("before_key"),
    )


def keyed_changes(spark: SparkSession, rows: pa.Table, table_keys: pa.Table) -> pa.Table:
    """`keyed_frame` of rows held here, back as Arrow ordered by table and seq."""
    keyed = keyed_frame(arrow_frame(spark, rows), arrow_frame(spark, table_keys))
    return keyed.orderBy("schema", "table", "seq").toArrow()


def latest_frame(events: DataFrame) -> DataFrame:
    """For every (table, key) touched, the newest change: `upsert` its row or `delete` it.

    An update that changes the key both deletes the old key and upserts the new one, so the row
    moves. Returns (table_id, key, seq, action).
    """
    upserts = events.where(F.col("op").isin("insert", "update")).select(
        "table_id", "key", "seq", F.lit("upsert").alias("action")
    )
    deletes = events.where(
        (F.col("op") == "delete") | ((F.col("op") == "update") & (F.col("before_key") != F.col("key")))
    ).select("table_id", F.col("before_key").alias("key"), "seq", F.lit("delete").alias("action"))
    newest_first = Window.partitionBy("table_id", "key").orderBy(F.col("seq").desc())
    return (
        upserts.unionByName(deletes)
        .withColumn("rank", F.row_number().over(newest_first))
        .where(F.col("rank") == 1)
        .drop("rank")
    )


def latest_change_per_key(spark: SparkSession, key_events: pa.Table) -> pa.Table:
    """`latest_frame` of key events held here, back as Arrow ordered by table and seq."""
    latest = latest_frame(arrow_frame(spark, key_events.cast(KEY_EVENTS_SCHEMA)))
    return latest.orderBy("table_id", "seq").toArrow()
