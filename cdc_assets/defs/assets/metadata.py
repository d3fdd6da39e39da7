"""Materialization metadata: a capture's figures, each table's figures on its own assets, and figures of several
tables as a table the UI shows as one (`figures_table`), not a JSON blob."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from cdc_assets.capture.run import CaptureReport
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.current.apply import ApplyResult

ROWS_SHOWN = 200  # rows of a figures table; the rest are counted in its last row


def _cell(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _kind(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int"
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "float"
    return "string"


def figures_table(rows: Mapping[str, Mapping[str, Any]], first: str = "table") -> MetadataValue:
    """Figures by name (a table, a check) as a Dagster table: a column `first` with the name, then a column per
    figure in the order they come. At most ROWS_SHOWN rows, in name order."""
    columns: list[str] = []
    for figures in rows.values():
        columns += [c for c in figures if c not in columns]
    names = sorted(rows)
    shown = names[:ROWS_SHOWN]
    records = [TableRecord({first: name, **{c: _cell(rows[name].get(c)) for c in columns}}) for name in shown]
    if len(names) > len(shown):
        records.append(TableRecord({first: f"… and {len(names) - len(shown)} more"}))
    schema = TableSchema(
        columns=[
            TableColumn(first, "string"),
            *(TableColumn(c, _kind([_cell(rows[n].get(c)) for n in shown])) for c in columns),
        ]
    )
    return MetadataValue.table(records, schema)


def changes_figures(report: ChangesReport, table: str) -> dict[str, object]:
    """One table's figures of a change-log run, for its `changes/<schema>/<table>` materialization."""
    r = report.appended.get(table)
    return {
        "changes": r.appended if r else 0,
        "inserts": r.inserts if r else 0,
        "updates": r.updates if r else 0,
        "deletes": r.deletes if r else 0,
        "batches": len(report.batches),
        "last_batch": report.batches[-1] if report.batches else "",
    }


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
        "tables": MetadataValue.md(", ".join(f"`{t}`" for t in report.tables) or "none"),
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
        # a Markdown list the UI shows as text (a JSON value shows as a blob); `policy_warnings_of` reads it back
        "policy_warnings": MetadataValue.md("\n".join(f"- {w}" for w in report.policy_warnings) or "none"),
    }


def policy_warnings_of(value: object) -> list[str]:
    """The sentences of a capture's `policy_warnings` metadata (a Markdown list, or "none")."""
    return [line[2:] for line in str(value or "").splitlines() if line.startswith("- ")]
