"""The Spark session resource: local by default, a cluster or a Spark Connect server by CDC_SPARK_MASTER."""

from __future__ import annotations

import os
import threading

from dagster import ConfigurableResource
from pydantic import Field
from pyspark.sql import SparkSession

from spark_resources.engine import DEFAULT_SPARK_MIN_ROWS, Transforms, by_size

DEFAULT_SPARK_MASTER = "local[*]"
LOCAL_DRIVER_MEMORY = "640m"
_lock = threading.Lock()
_sessions: dict[str, SparkSession] = {}


def spark_session(master: str = DEFAULT_SPARK_MASTER, shuffle_partitions: int = 4) -> SparkSession:
    """One session per process and master: starting a JVM costs seconds, so every run reuses it."""
    with _lock:
        session = _sessions.get(master)
        if session is not None and _alive(session):
            return session
        if master.startswith("sc://"):
            # A process is either a Spark Connect client or a local driver, never both.
            session = SparkSession.builder.remote(master).getOrCreate()
        else:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            session = (
                SparkSession.builder.master(master)
                .appName("cdc-lakehouse")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
                .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
                # the JVM's heap: a job handles at most 200k changes; the default 1 GB put a run's Python
                # process and its JVM together just past 2 GB (benchmarks/README.md, huge transaction)
                .config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
        _sessions[master] = session
        return session


def _alive(session: SparkSession) -> bool:
    """A stopped local session is replaced (Spark Connect sessions reconnect by themselves)."""
    from pyspark import SparkContext

    if hasattr(session, "sparkContext") and not session.__class__.__module__.startswith("pyspark.sql.connect"):
        return SparkContext._active_spark_context is not None
    return True


class SparkSessionResource(ConfigurableResource):
    """Spark for the change-log and current-state assets (`CDC_SPARK_MASTER`: local[*], spark://…, sc://…)."""

    master: str = Field(default=DEFAULT_SPARK_MASTER, description="Spark master URL or Spark Connect remote.")
    shuffle_partitions: int = Field(default=4, description="spark.sql.shuffle.partitions for the CDC jobs.")
    min_rows: int = Field(
        default=DEFAULT_SPARK_MIN_ROWS,
        description=(
            "A stage run with at least this many changes runs its transforms on Spark (CDC_SPARK_MIN_ROWS); smaller "
            "runs take the same transforms on Arrow in the run's process, as a Spark job's fixed cost exceeds them."
        ),
    )

    def get_session(self) -> SparkSession:
        return spark_session(self.master, self.shuffle_partitions)

    def transforms(self, rows: int) -> Transforms:
        """The engine for a stage run that processes `rows` changes."""
        return by_size(self.get_session, self.min_rows)(rows)
