"""Which engine runs a stage's transforms: Spark for large runs, Arrow in the run's process for the rest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_resources import arrow_transforms, transforms

DEFAULT_SPARK_MIN_ROWS = 1_000_000  # changes in one stage run from which its transforms go to Spark


@dataclass(frozen=True)
class Transforms:
    """The pipeline's two set-based transforms on one engine: Spark when `session` is given, else Arrow."""

    session: Callable[[], Any] | None = None

    @property
    def engine(self) -> str:
        return "spark" if self.session is not None else "arrow"

    def keyed_changes(self, rows: pa.Table, table_keys: pa.Table) -> pa.Table:
        if self.session is None:
            return arrow_transforms.keyed_changes(rows, table_keys)
        return transforms.keyed_changes(self.session(), rows, table_keys)

    def latest_change_per_key(self, key_events: pa.Table) -> pa.Table:
        if self.session is None:
            return arrow_transforms.latest_change_per_key(key_events)
        return transforms.latest_change_per_key(self.session(), key_events)


TransformsFor = Callable[[int], Transforms]  # the engine for a stage run that processes this many changes


def choose_transforms(changes: int, min_rows: int, session: Callable[[], Any]) -> Transforms:
    """Spark from `min_rows` changes on, Arrow below: a Spark job's fixed cost (a JVM, the rows sent to it and
    back) is seconds, more than the transforms take on Arrow for a few hundred thousand changes. The session
    is only asked for (a JVM started, or a Connect server reached) when Spark is chosen."""
    return Transforms(session if changes >= min_rows else None)
