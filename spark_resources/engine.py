"""Which engine runs a stage: Spark, whose jobs read and write the lakehouse's files, or Arrow in the run's process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from spark_resources.session import early_start_began

DEFAULT_SPARK_MIN_ROWS = 1_000_000  # changes in one stage run from which it goes to Spark (a local master); core.settings' too


@dataclass(frozen=True)
class Transforms:
    """The engine of one stage run: Spark when `session` is given (asked for only then: a JVM started, or a
    Connect server reached), else Arrow in the run's process (cdc_assets.stages.changes.keys)."""

    session: Callable[[], Any] | None = None

    @property
    def engine(self) -> str:
        return "spark" if self.session is not None else "arrow"


TransformsFor = Callable[[int], Transforms]  # the engine for a stage run that processes this many changes


def choose_transforms(changes: int, min_rows: int, session: Callable[[], Any]) -> Transforms:
    """Spark from `min_rows` changes on, Arrow below: a Spark job's fixed cost (a JVM, a job's start) is seconds,
    more than a few hundred thousand changes take on Arrow."""
    return Transforms(session if changes >= min_rows else None)


@contextmanager
def spark_phase(session: Callable[[], Any], phase: str, log: Any | None = None) -> Iterator[Callable[[], Any]]:
    """`session`, whose jobs carry the description `cdc-lakehouse: <phase>` (Spark's UI, REST API and event log
    show it), so a run's Spark jobs are attributable to its stages; the session is still started only when asked
    for. The description is a property of the asking thread (jobs submitted from the per-table threads have none);
    a Connect session has no SparkContext here and its jobs go undescribed. `log` gets the phase's wall time and how
    much of it went to getting the session (a driver JVM's start, or reaching a Connect server)."""
    began = time.monotonic()
    asked: list[Any] = []  # the SparkContext (None on Connect), once the session was asked for
    waited: list[float] = []

    def described() -> Any:
        asking = time.monotonic()
        spark = session()
        if not asked:
            waited.append(time.monotonic() - asking)
        context = getattr(spark, "_sc", None)  # a classic session's SparkContext (Connect: none)
        if context is not None and not asked:
            context.setLocalProperty("spark.job.description", f"cdc-lakehouse: {phase}")
        asked.append(context)
        return spark

    try:
        yield described
    finally:
        if asked and asked[0] is not None:
            asked[0].setLocalProperty("spark.job.description", None)
        if log is not None:
            early = early_start_began() if asked else None
            ahead = f" (its start begun {began - early:.2f} s before the stage)" if early is not None and early < began else ""
            log.info(f"{phase} on spark: {time.monotonic() - began:.2f} s, {sum(waited):.2f} s of them to get the session{ahead}")
