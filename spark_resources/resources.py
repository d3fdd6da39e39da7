"""The transforms' engine as a Dagster resource, on a lazily started session built by dagster-pyspark."""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource
from pydantic import Field, PrivateAttr

from spark_resources.engine import DEFAULT_SPARK_MIN_ROWS, Transforms, choose_transforms
from spark_resources.session import start_session_early, wait_for_early_start


class LazySparkResource(ConfigurableResource):
    """dagster-pyspark's LazyPySparkResource (same config, same `spark_session` and `spark_context`), except that
    dagster-pyspark and pyspark are imported only when a run asks for the session: every command loads the
    definitions, and importing them cost ~0.15 s of each, Arrow runs included."""

    spark_config: dict[str, Any]
    _spark_session: Any = PrivateAttr(default=None)

    @property
    def spark_session(self) -> Any:
        if self._spark_session is None:
            from dagster_pyspark.resources import spark_session_from_config

            wait_for_early_start()  # a session begun before the run (start_session_early) is the one it takes
            self._spark_session = spark_session_from_config(self.spark_config)
        return self._spark_session

    @property
    def spark_context(self) -> Any:
        return self.spark_session.sparkContext


class TransformsResource(ConfigurableResource):
    """Spark (LazySparkResource: no session until a run picks Spark) or Arrow, by run size."""

    pyspark: LazySparkResource
    min_rows: int = Field(
        default=DEFAULT_SPARK_MIN_ROWS,
        description=(
            "A stage run with at least this many changes runs its transforms on Spark (CDC_SPARK_MIN_ROWS); smaller "
            "runs take the same transforms on Arrow in the run's process, as a Spark job's fixed cost exceeds them."
        ),
    )

    def start_session_if_spark_takes_every_run(self) -> None:
        """A long-lived run whose every stage run with a change takes Spark (`min_rows` 0: the default on a
        cluster or a Connect server) starts the session now, in the background, not in its first cycle."""
        if self.min_rows == 0:
            start_session_early(self.pyspark.spark_config)

    def for_changes(self, changes: int) -> Transforms:
        """The engine for a stage run that processes `changes` changes."""
        return choose_transforms(changes, self.min_rows, lambda: self.pyspark.spark_session)
