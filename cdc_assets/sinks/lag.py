"""How far a sink is behind the change logs: the changes above its checkpoint and the age of the oldest of them.
(How far the change logs are behind the source is the pipeline's own lag: the `table_lag` check.)"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import max_seq, read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.store import Lakehouse
from cdc_assets.sinks.checkpoint import SinkCheckpoint, load_checkpoint
from cdc_assets.sinks.feed import sink_tables
from cdc_assets.sinks.settings import SinkSettings


@dataclass(frozen=True)
class SinkLag:
    seconds: float  # age of the oldest change not yet acknowledged (0 when none is pending)
    pending: int  # changes in the change logs above the checkpoint
    tables: dict[str, float] = field(default_factory=dict)  # per table behind: the age of its oldest pending change


def sink_lag(
    sink: SinkSettings,
    lakehouse: Lakehouse,
    checkpoint: SinkCheckpoint | None,
    now: float,
    opened: dict[TableRef, tuple[DeltaTable, int]] | None = None,
) -> SinkLag:
    """The sink's lag over every change log it publishes, or over `opened` only (the logs a publish run found
    behind, as it found them: the others were caught up when it began)."""
    checkpoint = checkpoint or load_checkpoint(lakehouse.store, sink.name)
    pending = 0
    ages: dict[str, float] = {}
    tables = sink_tables(lakehouse, sink) if opened is None else sorted(opened)
    for table in tables:
        log, top = opened[table] if opened is not None else (lakehouse.open(CHANGES, table), None)
        top = max_seq(log) if top is None else top
        after = checkpoint.seq_of(str(table))
        if log is None or top is None or top <= after:
            continue
        found = read_query(
            log, f"SELECT min(_cdc_commit_ts) AS oldest, count(*) AS n FROM changes WHERE _cdc_seq > {after}", "changes"
        )
        oldest = pc.cast(found.column("oldest"), pa.int64()).to_pylist()[0]
        count = int(found.column("n").to_pylist()[0] or 0)
        if count:
            pending += count
            ages[str(table)] = max(now - (oldest or 0) / 1e6, 0.0)
    return SinkLag(max(ages.values(), default=0.0), pending, ages)
