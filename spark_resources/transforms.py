"""Spark-side transforms over the generic form of a change (table, `_cdc_seq`, operation, row images as canonical
texts, keys as JSON texts), so one job covers every table whatever its columns; and the frames of rows held
here. spark_resources.arrow_transforms does the same on Arrow: both must key a change identically, since a
change log may be written by either engine over time (`test_spark_transforms`)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType


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
