"""The transforms' engine as a Dagster resource, on dagster-pyspark's lazily started session."""

from __future__ import annotations

from dagster import ConfigurableResource
from dagster_pyspark import LazyPySparkResource
from pydantic import Field

from spark_resources.engine import DEFAULT_SPARK_MIN_ROWS, Transforms, choose_transforms


class TransformsResource(ConfigurableResource):
    """Spark (dagster-pyspark's LazyPySparkResource: no session until a run picks Spark) or Arrow, by run size."""

    pyspark: LazyPySparkResource
    min_rows: int = Field(
        default=DEFAULT_SPARK_MIN_ROWS,
        description=(
            "A stage run with at least this many changes runs its transforms on Spark (CDC_SPARK_MIN_ROWS); smaller "
            "runs take the same transforms on Arrow in the run's process, as a Spark job's fixed cost exceeds them."
        ),
    )

    def for_changes(self, changes: int) -> Transforms:
        """The engine for a stage run that processes `changes` changes."""
        return choose_transforms(changes, self.min_rows, lambda: self.pyspark.spark_session)
