"""What each table's current-state asset, `current/<schema>/<table>`, records: Dagster's table metadata (column
schema, row count, table name, where it lives) read from its Delta log, the run's figures beside it, and the
confirmations that a quiet table is up to date. The assets themselves are `lakehouse_tables.py`'s; the sync job,
the continuous mode and snapshots record the same materializations."""

from __future__ import annotations

import re
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetMaterialization,
    MetadataValue,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
)

from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.defs.keys import UNNAMED, SourceKeys
from cdc_assets.defs.table_checks import EQUALITY_CHECK, LAG_CHECK, SCHEMA_CHECK
from cdc_assets.lake.layout import CURRENT, CURRENT_STAGE
from cdc_assets.lake.state import load_progress, load_registry, needs_work
from cdc_assets.lake.store import Lakehouse
from cdc_assets.lake.table_facts import Column, TableFacts, delta_columns, table_facts

META_PREFIX = "_cdc_"
DATA_VERSION_TAG = "dagster/data_version"  # Dagster's tag; unchanged data keeps its version (no downstream rerun)
# what a confirmation carries over from the table's last materialization: its table metadata, not a run's figures
TABLE_METADATA_KEYS = (
    "dagster/table_name",
    "source_table",
    "delta_location",
    "dagster/column_schema",
    "dagster/row_count",
    "delta_version",
    "dropped",
    "dropped_seq",
)


def table_name(table: str) -> str:
    """`dagster/table_name`: the layer and the table, `current.shop.orders`."""
    return f"{CURRENT}.{table}"


def column_schema(schema: Any) -> TableSchema:
    """A Delta schema as Dagster's column schema: each column's Delta type, nullability, and which are ours."""
    return columns_schema(delta_columns(schema))


def columns_schema(columns: tuple[Column, ...]) -> TableSchema:
    """A table's columns (name, Delta type, nullable) as Dagster's column schema."""
    return TableSchema(
        columns=[
            TableColumn(
                name=name,
                type=kind,
                description="pipeline metadata" if name.startswith(META_PREFIX) else None,
                constraints=TableColumnConstraints(nullable=nullable),
            )
            for name, kind, nullable in columns
        ]
    )


def table_metadata(house: Lakehouse, table: str, facts: TableFacts | None = None) -> dict[str, Any]:
    """Dagster's standard table metadata of a current-state table as it is now (its Delta log only, no data read):
    column schema, row count, table name, and where it lives. `facts`: read already (by a sync's forked child)."""
    location = house.table_uri(CURRENT, TableRef.parse(table))
    metadata: dict[str, Any] = {
        "dagster/table_name": table_name(table),
        "source_table": table,
        "delta_location": MetadataValue.path(location),
    }
    facts = facts if facts is not None else table_facts(house, table)
    if facts.columns is None:
        metadata["dagster/row_count"] = 0
        metadata["dropped"] = facts.dropped_seq is not None
        if facts.dropped_seq is not None:
            metadata["dropped_seq"] = facts.dropped_seq
        return metadata
    metadata["dagster/column_schema"] = columns_schema(facts.columns)
    metadata["dagster/row_count"] = facts.rows
    metadata["delta_version"] = facts.version
    metadata["dropped"] = False
    return metadata


def data_version(metadata: dict[str, Any]) -> str:
    """A table's data version from its table metadata: its Delta version (every commit of new data makes one),
    or its DROP."""
    if metadata.get("dropped"):
        return f"dropped:{metadata.get('dropped_seq', '')}"
    return f"delta:{metadata.get('delta_version', 'none')}"


def table_materializations(
    house: Lakehouse,
    figures: dict[str, dict[str, Any]],
    facts: dict[str, TableFacts] | None = None,
    keys: SourceKeys = UNNAMED,
) -> dict[str, AssetMaterialization]:
    """A materialization of each table's own asset (of the source `keys` names), by table: its table metadata beside
    the run's figures for it. `facts`: the tables' facts read already (by a sync's forked child)."""
    names = sorted(figures)
    known = facts or {}
    metadata = for_each_table(names, lambda t: table_metadata(house, t, known.get(t)))
    return {
        name: AssetMaterialization(
            keys.table_asset_key(name),
            description=f"{name} dropped from the source" if meta.get("dropped") else None,
            metadata={**meta, **figures[name]},
            tags={DATA_VERSION_TAG: data_version(meta)},
        )
        for name, meta in zip(names, metadata, strict=True)
    }


def up_to_date_tables(house: Lakehouse) -> list[str]:
    """The tables with no captured change left to apply: their current state is the source's as of the
    checkpoint (a few reads at once, not one after another)."""
    registry = load_registry(house.store)
    names = sorted(registry)
    progress = for_each_table(names, lambda t: load_progress(house.store, CURRENT_STAGE, t))
    return [name for name, p in zip(names, progress, strict=True) if not needs_work(registry[name], p)]


def due_for_confirmation(last_materialized: dict[str, float | None], now: float, every_seconds: float) -> list[str]:
    """The tables whose asset was last materialized `every_seconds` ago or longer (or never), sorted."""
    return sorted(t for t, at in last_materialized.items() if at is None or now - at >= every_seconds)


def confirmations(
    instance: Any,
    house: Lakehouse,
    position: str,
    every_seconds: float,
    now: float,
    exclude: set[str] | frozenset[str] = frozenset(),
    keys: SourceKeys = UNNAMED,
) -> list[AssetMaterialization | AssetCheckEvaluation]:
    """Materializations of the quiet tables' assets: a table with no change pending through the binlog position
    capture has read to is up to date, although nothing was written to it.

    Dagster 1.13 judges a time-window freshness policy by the asset's last materialization alone (observations
    and `dagster/last_updated_timestamp` are not read), so without these a quiet table would fail its freshness
    while current. Each carries the table metadata of the table's last materialization and its data version (no
    Delta table is read, downstream assets that follow data versions do not run again), `unchanged: true`, and
    the position. Only tables last materialized `every_seconds` ago or more, so a busy table gets none; one
    query for every table's last materialization. `exclude`: tables the caller materializes itself. `keys`: the
    source's, whose table assets these are.

    Dagster shows a check's execution as the asset's current one only when it is newer than the asset's last
    materialization or from the same run, so each confirmation restates the table's latest check verdicts (see
    `carried_over`): the data they judged is the data confirmed."""
    tables = [t for t in up_to_date_tables(house) if t not in exclude]
    records = instance.get_asset_records([keys.table_asset_key(t) for t in tables])
    last = {r.asset_entry.asset_key: r.asset_entry.last_materialization for r in records}
    by_table = {t: last.get(keys.table_asset_key(t)) for t in tables}
    due = due_for_confirmation({t: e.timestamp if e else None for t, e in by_table.items()}, now, every_seconds)
    events = []
    for table in due:
        entry = by_table[table]
        previous = entry.asset_materialization if entry is not None else None
        if previous is not None:
            base = {k: v for k, v in previous.metadata.items() if k in TABLE_METADATA_KEYS}
            version = previous.tags.get(DATA_VERSION_TAG) if previous.tags else None
        else:  # never materialized (a lakehouse older than the per-table assets): read its Delta log once
            base = table_metadata(house, table)
            version = None
        events.append(
            AssetMaterialization(
                keys.table_asset_key(table),
                description=f"up to date: no change of {table} pending through {position}",
                metadata={**base, "unchanged": True, "changes_in": 0, "up_to_date_through": position},
                tags={DATA_VERSION_TAG: version or data_version(base)},
            )
        )
    up_to_date = [
        AssetCheckEvaluation(
            asset_key=keys.table_asset_key(t),
            check_name=LAG_CHECK,
            passed=True,
            description=f"{t}: no change pending through {position}",
            metadata={"lag_seconds": 0.0, "up_to_date_through": position},
        )
        for t in due
    ]
    return [*events, *carried_over(instance, due, keys), *up_to_date]


CARRIED_OVER_FROM = "carried_over_from_run"  # metadata: the run that evaluated a restated check
EVALUATED_AS = "evaluated_as"  # metadata: that run's own description of it
_RESTATED = re.compile(r"^(unchanged since evaluated in run \w+: )+")


def carried_over(instance: Any, tables: list[str], keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """Each table's latest equality and schema evaluations, restated in this run (same verdict, severity and
    metadata, the description saying which run evaluated them), so a failed check stays failed in the UI until a
    run checks the table again. One query for all of them.

    An evaluation restated before is restated as it was evaluated: the run that evaluated it and its own description
    (kept in its metadata), so the sentence says its cause once however many runs restate it."""
    checks = [AssetCheckKey(keys.table_asset_key(t), name) for t in tables for name in (EQUALITY_CHECK, SCHEMA_CHECK)]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(checks) if checks else {}
    restated = []
    for key in checks:
        record = latest.get(key)
        evaluation = record.event.dagster_event.event_specific_data if record is not None and record.event else None
        if not isinstance(evaluation, AssetCheckEvaluation):
            continue  # never evaluated, or only planned
        run = _text(evaluation.metadata.get(CARRIED_OVER_FROM)) or record.run_id
        # a restatement written before the evaluation's own text was kept: its restated prefixes taken away
        own = _text(evaluation.metadata.get(EVALUATED_AS)) or _RESTATED.sub("", evaluation.description or "")
        restated.append(
            AssetCheckEvaluation(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=evaluation.passed,
                severity=evaluation.severity,
                description=f"unchanged since evaluated in run {run[:8]}: {own}",
                metadata={**evaluation.metadata, CARRIED_OVER_FROM: run, EVALUATED_AS: own},
            )
        )
    return restated


def _text(value: Any) -> str | None:
    """A text metadata value as read back from the event log (a TextMetadataValue), or None."""
    value = getattr(value, "value", value)
    return value if isinstance(value, str) and value else None
