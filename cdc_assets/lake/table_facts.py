"""What a current-state table's own asset records about it, from its Delta log alone (no data read), as plain values:
so the pipeline's driver reads them right after it applies a table (cdc_assets/pipeline/driver.py), for the run that
records them, in a sync's forked child off the run's path, or in the continuous mode's follower."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import row_count
from cdc_assets.lake.layout import CURRENT, CURRENT_STAGE
from cdc_assets.lake.state import load_progress
from cdc_assets.lake.store import Lakehouse

Column = tuple[str, str, bool]  # name, Delta type, nullable


@dataclass(frozen=True)
class TableFacts:
    """A current-state table as it is now: its columns, rows and Delta version, or the DROP that removed it."""

    columns: tuple[Column, ...] | None  # None: there is no current-state table
    rows: int = 0
    version: int | None = None
    dropped_seq: int | None = None  # when there is none: the seq of the DROP that removed it, if one did


def delta_columns(schema: Any) -> tuple[Column, ...]:
    """A Delta schema's columns: each one's name, Delta type and nullability."""
    return tuple(
        (field.name, str(getattr(field.type, "type", None) or field.type.to_json()), bool(field.nullable))
        for field in schema.fields
    )


def table_facts(house: Lakehouse, table: str) -> TableFacts:
    dt = house.open(CURRENT, TableRef.parse(table))
    if dt is None:
        return TableFacts(None, dropped_seq=load_progress(house.store, CURRENT_STAGE, table).dropped_seq)
    return TableFacts(delta_columns(dt.schema()), row_count(dt), dt.version())
