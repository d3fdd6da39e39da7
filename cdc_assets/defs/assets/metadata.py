"""Materialization metadata: a capture's figures, and per-table figures kept small (Dagster stores a range run's
metadata again with the materialization of every partition in the range, so 200 tables' details would be stored
200 times)."""

from __future__ import annotations

from dagster import MetadataValue

from cdc_assets.capture.run import CaptureReport
from cdc_assets.stages.current.apply import ApplyResult

PER_TABLE_SHOWN = 25


def per_table_metadata(per_table: dict[str, dict[str, int | None]], busiest_by: str) -> dict[str, object]:
    """`per_table` for at most PER_TABLE_SHOWN tables, those with the highest `busiest_by`, and how many more."""
    ranked = sorted(per_table.items(), key=lambda item: (-(item[1][busiest_by] or 0), item[0]))
    shown = dict(sorted(ranked[:PER_TABLE_SHOWN]))
    metadata: dict[str, object] = {"per_table": MetadataValue.json(shown)}
    if len(per_table) > len(shown):
        metadata["per_table_not_shown"] = len(per_table) - len(shown)
    return metadata


def applied_figures(tables: list[str], applied: list[ApplyResult]) -> dict[str, dict[str, int]]:
    """Each table's counts in one apply (zeros for a table it had nothing to apply to), by table name."""
    by_name = {str(r.table): r for r in applied}
    figures = {}
    for name in tables:
        r = by_name.get(name)
        figures[name] = {
            "changes_in": r.changes_in if r else 0,
            "rows_inserted": r.inserted if r else 0,
            "rows_updated": r.updated if r else 0,
            "rows_deleted": r.removed if r else 0,
        }
    return figures


def capture_metadata(report: CaptureReport, max_batch_rows: int | None = None) -> dict[str, object]:
    first = report.batches[0] if report.batches else None
    last = report.batches[-1] if report.batches else None
    return {
        "batches": len(report.batches),
        "events": report.events,
        "rows": report.rows,
        "tables": MetadataValue.json(report.tables),
        "table_count": len(report.tables),
        "bytes": report.bytes,
        "transactions": sum(b.transactions for b in report.batches),
        "rows_per_batch": round(report.rows / len(report.batches), 1) if report.batches else 0,
        "max_batch_rows": max_batch_rows if max_batch_rows is not None else "",
        "first_position": str(first.start) if first else str(report.start),
        "last_position": str(last.end) if last else str(report.end),
        "first_batch": first.name if first else "",
        "last_batch": last.name if last else "",
        "target_position": str(report.target),
        "lag_bytes": report.lag_bytes,
        "lag_seconds": round(report.lag_seconds, 3),
        "duration_seconds": round(report.seconds, 3),
    }
