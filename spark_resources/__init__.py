"""Spark for the pipeline: the transforms on Spark and on Arrow, the choice between them, dagster-pyspark's
session resource and a local Spark Connect server."""
