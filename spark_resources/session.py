"""Spark settings for dagster-pyspark's session resource: local by default, a cluster (`spark://…`) or a Spark
Connect server (`sc://…`) by CDC_SPARK_MASTER, plus any settings of the user's (CDC_SPARK_CONF). Both come from the
pipeline's settings (cdc_assets.core.settings.EngineSettings), given by whoever builds a session."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from spark_resources import class_archive

DEFAULT_SPARK_MASTER = "local[*]"  # core.settings' too (test_settings holds them equal)
# The JIT's first tier only (C1, no optimizing C2), for a driver whose executors are JVMs of their own: it schedules
# tasks and takes their results, and a run never lasts long enough for C2's compiles to pay for the cores they take.
# A local master's driver runs the tasks too, whose rows C2's code moves faster (benchmarks/README.md, "The JVMs' JIT").
# A user's `-XX:TieredStopAtLevel=4` in CDC_SPARK_CONF, added after ours, undoes it.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
LOCAL_DRIVER_MEMORY = "640m"
SHUFFLE_PARTITIONS = 4


def spark_config(master: str = DEFAULT_SPARK_MASTER, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The session's settings: `spark.remote` for a Connect server (PySpark's builder then makes a Connect
    client, no JVM here), else `spark.master` with the settings a driver on this machine needs; `extra` (the
    user's CDC_SPARK_CONF) wins over ours, but for JVM options, which are added to ours."""
    if master.startswith("sc://"):
        config: dict[str, Any] = {"spark.remote": master}
    else:
        archive = class_archive.driver_options()  # one look for both JVMs: it stats every jar of pyspark
        config = {
            "spark.master": master,
            "spark.app.name": "cdc-lakehouse",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",  # progress bars would garble the CLI's output
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            # the driver's classes mapped from an archive when `make install` built one (spark_resources.class_archive)
            "spark.driver.extraJavaOptions": " ".join(
                filter(None, ["-Duser.timezone=UTC", None if master.startswith("local") else QUICK_JIT, archive])
            ),
            # the JVM's heap: a job handles at most 200k changes; the default 1 GB put a run's Python process
            # and its JVM together just past 2 GB (benchmarks/README.md, huge transaction)
            "spark.driver.memory": LOCAL_DRIVER_MEMORY,
        }
        # The tasks' Python (mapInArrow) must have the project installed. On this machine that is this
        # interpreter; a cluster elsewhere runs its workers' own (their PYSPARK_PYTHON, or python3 on their PATH),
        # unless the user names one here with PYSPARK_PYTHON (see docs/spark.md).
        if _on_this_machine(master):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if os.environ.get("PYSPARK_PYTHON"):
            config["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
        if _on_this_machine(master):  # executors on other machines must reach the driver at its own address
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            config |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
            if not master.startswith("local"):
                # executors of a cluster on this machine share its cores with the driver (C1 only, as it) and run the
                # same jars: they map the same archive (elsewhere the file is not there, and a JVM told of a missing
                # archive maps none, not even the JDK's own; executors on machines of their own keep their JIT)
                config["spark.executor.extraJavaOptions"] = " ".join(filter(None, [QUICK_JIT, archive]))
    return {**config, **(extra or {}), **_joined_java_options(config, extra or {})}


JVM_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def _joined_java_options(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, str]:
    """A user's JVM options go after ours instead of replacing them: a user's `-XX:+UseG1GC` must not drop the
    driver's `-Duser.timezone=UTC` or its class archive. A JVM takes the last of two same options, so theirs win."""
    return {
        name: " ".join(filter(None, [str(ours[name]), str(theirs[name])]))
        for name in JVM_OPTIONS
        if name in ours and name in theirs
    }


_early_start: threading.Thread | None = None
_early_began: float | None = None  # time.monotonic() of start_session_early's call
_early_lock = threading.Lock()


def start_session_early(config: dict[str, Any]) -> None:
    """Start the session `config` describes in a thread of its own, once per process. A driver JVM's start and the
    application's registration with a cluster take seconds (benchmarks/README.md, "Where a cluster sync's seconds
    go"); a process that knows it will take Spark spends them beside its other work (Dagster's import, the run's
    start, the capture) instead of before its first Spark stage. A start that fails here is not reported: the run,
    asking for the session, starts it again and fails with the cause."""
    global _early_start, _early_began
    with _early_lock:
        if _early_start is not None:
            return
        _early_began = time.monotonic()
        _early_start = threading.Thread(target=_start_session, args=(config,), name="spark-session-start", daemon=True)
        _early_start.start()


def _start_session(config: dict[str, Any]) -> None:
    try:
        from pyspark.sql import SparkSession

        SparkSession.builder.config(map=config).getOrCreate()
    except Exception:
        pass  # the run's own start says why (see start_session_early)


def early_start_began() -> float | None:
    """When this process began starting its session ahead of the run (time.monotonic()), if it did."""
    return _early_began


def wait_for_early_start() -> None:
    """Let an early start (start_session_early) finish before the session is asked for: the run then takes the
    session it started, or, when it failed, starts one itself."""
    with _early_lock:
        started = _early_start
    if started is not None:
        started.join()


def _on_this_machine(master: str) -> bool:
    """A local master, or a standalone one on this machine's loopback (the tests' and `make spark-cluster-start`'s)."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].split(",")[0].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost")
