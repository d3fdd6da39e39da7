"""Spark settings for dagster-pyspark's session resource: local by default, a cluster (`spark://…`) or a Spark
Connect server (`sc://…`) by CDC_SPARK_MASTER, plus any settings of the user's (CDC_SPARK_CONF)."""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_SPARK_MASTER = "local[*]"
LOCAL_DRIVER_MEMORY = "640m"
SHUFFLE_PARTITIONS = 4


def spark_config(master: str = DEFAULT_SPARK_MASTER, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The session's settings: `spark.remote` for a Connect server (PySpark's builder then makes a Connect
    client, no JVM here), else `spark.master` with the settings a driver on this machine needs; `extra` (the
    user's CDC_SPARK_CONF) wins over ours."""
    if master.startswith("sc://"):
        config: dict[str, Any] = {"spark.remote": master}
    else:
        config = {
            "spark.master": master,
            "spark.app.name": "cdc-lakehouse",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",  # progress bars would garble the CLI's output
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            # the JVM's heap: a job handles at most 200k changes; the default 1 GB put a run's Python process
            # and its JVM together just past 2 GB (benchmarks/README.md, huge transaction)
            "spark.driver.memory": LOCAL_DRIVER_MEMORY,
        }
        # The tasks' Python (mapInArrow) must have the project installed. On this machine that is this
        # interpreter; a cluster elsewhere runs its workers' own (their PYSPARK_PYTHON, or python3 on their PATH),
        # unless the user names one here with PYSPARK_PYTHON (see the README, "Running on a Spark cluster").
        if _on_this_machine(master):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if os.environ.get("PYSPARK_PYTHON"):
            config["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
        if _on_this_machine(master):  # executors on other machines must reach the driver at its own address
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            config |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    return {**config, **(extra or {})}


def _on_this_machine(master: str) -> bool:
    """A local master, or a standalone one on this machine's loopback (the tests' and `make spark-cluster-start`'s)."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].split(",")[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost")
