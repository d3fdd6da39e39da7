"""Spark session resource and the Spark-side transforms of the pipeline."""

from spark_resources.session import SparkSessionResource, spark_session

__all__ = ["SparkSessionResource", "spark_session"]
