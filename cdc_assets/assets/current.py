"""Current state: every change log's pending changes applied to current/<schema>/<table>."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from cdc_assets.assets.changes import table_changes
from cdc_assets.current_state import ApplyResult, PendingTable, apply_changes, read_pending
from cdc_assets.lakehouse import Lakehouse, TableRef
from cdc_assets.raw_batch import TableVersion
from cdc_assets.resources import LakehouseResource
from cdc_assets.state import load_catalog
from spark_resources import SparkSessionResource
from spark_resources.transforms import latest_change_per_key


@dataclass
class CurrentReport:
    applied: list[ApplyResult] = field(default_factory=list)
    seconds: float = 0.0


def pending_tables(lakehouse: Lakehouse, only: set[str] | None = None) -> list[PendingTable]:
    """Tables whose change log has changes their current state has not taken in."""
    pending = []
    for name, version_json in sorted(load_catalog(lakehouse.store).items()):
        if only is not None and name not in only:
            continue
        table = TableRef.parse(name)
        found = read_pending(lakehouse, table, TableVersion.from_json(version_json))
        if found is not None:
            pending.append(found)
    return pending


def apply_pending(lakehouse: Lakehouse, spark: Callable[[], Any], log: Any | None = None) -> CurrentReport:
    """Apply the newest pending change per key of every table; one Spark job picks them all."""
    began = time.monotonic()
    report = CurrentReport()
    pending = pending_tables(lakehouse)
    if pending:
        key_events = pa.concat_tables(
            [
                pa.table(
                    {
                        "table_id": pa.array([i] * p.changes.num_rows, pa.int32()),
                        "seq": p.changes.column("_cdc_seq"),
                        "op": p.changes.column("_cdc_op"),
                        "key": p.changes.column("_cdc_key"),
                        "before_key": p.changes.column("_cdc_before_key"),
                    }
                )
                for i, p in enumerate(pending)
            ]
        )
        latest = latest_change_per_key(spark(), key_events)
        for i, table in enumerate(pending):
            result = apply_changes(lakehouse, table, latest.filter(pc.equal(latest.column("table_id"), i)))
            report.applied.append(result)
            if log is not None:
                log.info(
                    f"{result.table}: {result.changes_in} changes -> {result.inserted} inserted, "
                    f"{result.updated} updated, {result.removed} deleted"
                )
    report.seconds = time.monotonic() - began
    return report


@asset(
    group_name="current",
    deps=[table_changes],
    description=(
        "Current-state tables under current/<schema>/<table> (Delta): one row per source row, the source's "
        "columns plus _cdc_seq and _cdc_commit_ts, rebuilt by applying each change log in _cdc_seq order."
    ),
)
def current_tables(
    context: AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkSessionResource
) -> MaterializeResult:
    report = apply_pending(lakehouse.get(), spark.get_session, log=context.log)
    per_table = {
        str(r.table): {
            "changes_in": r.changes_in,
            "inserted": r.inserted,
            "updated": r.updated,
            "deleted": r.removed,
        }
        for r in report.applied
    }
    return MaterializeResult(
        metadata={
            "tables": len(report.applied),
            "changes_in": sum(r.changes_in for r in report.applied),
            "rows_inserted": sum(r.inserted for r in report.applied),
            "rows_updated": sum(r.updated for r in report.applied),
            "rows_deleted": sum(r.removed for r in report.applied),
            "per_table": MetadataValue.json(per_table),
            "duration_seconds": round(report.seconds, 3),
        }
    )
