"""Per-table materialization metadata, kept small: Dagster stores a range run's metadata again with the
materialization of every partition in the range, so 200 tables' details would be stored 200 times."""

from __future__ import annotations

from dagster import MetadataValue

PER_TABLE_SHOWN = 25


def per_table_metadata(per_table: dict[str, dict[str, int | None]], busiest_by: str) -> dict[str, object]:
    """`per_table` for at most PER_TABLE_SHOWN tables, those with the highest `busiest_by`, and how many more."""
    ranked = sorted(per_table.items(), key=lambda item: (-(item[1][busiest_by] or 0), item[0]))
    shown = dict(sorted(ranked[:PER_TABLE_SHOWN]))
    metadata: dict[str, object] = {"per_table": MetadataValue.json(shown)}
    if len(per_table) > len(shown):
        metadata["per_table_not_shown"] = len(per_table) - len(shown)
    return metadata
