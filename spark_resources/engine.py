"""Which engine runs a stage: Spark, whose jobs read and write the lakehouse's files, or Arrow in the run's process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_SPARK_MIN_ROWS = 1_000_000  # changes in one stage run from which it goes to Spark (a local master)


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
