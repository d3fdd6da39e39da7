"""Spark session resource and the set-based transforms of the pipeline (on Spark, or on Arrow for small runs)."""

from spark_resources.engine import Transforms, TransformsFor, on_spark
from spark_resources.session import SparkSessionResource, spark_session

__all__ = ["SparkSessionResource", "Transforms", "TransformsFor", "on_spark", "spark_session"]
