"""Spark for the pipeline: the transforms on Spark and on Arrow, the choice between them, and dagster-pyspark's
session resource (the local Spark servers are cdc_assets.local_spark's)."""
