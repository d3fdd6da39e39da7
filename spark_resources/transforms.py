"""Generic Spark helpers every stage's Spark half uses: frames of Arrow rows held in the run process, and Spark
schemas for Arrow ones (what mapInArrow and applyInArrow return)."""

from __future__ import annotations

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
