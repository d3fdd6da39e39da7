"""Current state: every change log's pending changes applied to current/<schema>/<table>."""

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, MetadataValue, asset

from cdc_assets.assets.changes import table_changes, target_tables
from cdc_assets.change_log import open_table
from cdc_assets.current_state import ApplyResult, PendingTable, apply_changes, apply_keyless_changes, read_pending
from cdc_assets.lakehouse import CURRENT, Lakehouse, TableRef
from cdc_assets.locks import Lease, lakehouse_lock
from cdc_assets.partitions import run_owner, tables_partitions
from cdc_assets.raw_batch import TableVersion
from cdc_assets.resources import LakehouseResource
from cdc_assets.stages import CHANGES_STAGE, CURRENT_LOCK, CURRENT_STAGE
from cdc_assets.state import TableProgress, load_progress, save_progress
from spark_resources import SparkSessionResource
from spark_resources.transforms import latest_change_per_key


@dataclass
class CurrentReport:
    applied: list[ApplyResult] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    seconds: float = 0.0


def pending_tables(lakehouse: Lakehouse, changes_progress: dict[str, TableProgress]) -> list[PendingTable]:
    """Tables whose change log has changes their current state has not taken in."""
    pending = []
    for name, progress in changes_progress.items():
        version_json = progress.version
        if version_json is None:  # no change log yet
            continue
        found = read_pending(lakehouse, TableRef.parse(name), TableVersion.from_json(version_json))
        if found is not None:
            pending.append(found)
    return pending


def apply_pending(
    lakehouse: Lakehouse,
    spark: Callable[[], Any],
    tables: Collection[str] | None = None,
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
) -> CurrentReport:
    """Apply the newest pending change per key of `tables` (default: all); one Spark job picks them all.

    Holds the lakehouse's current-state lock so two runs never merge into the same table at once.
    """
    began = time.monotonic()
    report = CurrentReport()
    store = lakehouse.store
    wait = lakehouse.lock_wait_seconds
    with lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", owner, wait, log=log) as lease:
        targets = target_tables(lakehouse, tables)
        # What the change logs hold now; recorded as this stage's progress once it is applied.
        reached = {t: load_progress(store, CHANGES_STAGE, t) for t in targets}
        pending = pending_tables(lakehouse, reached)
        if pending:
            _apply(lakehouse, spark, pending, report, lease, log)
        lease.check()
        for table, progress in reached.items():
            if progress.batch is not None:
                save_progress(store, CURRENT_STAGE, table, TableProgress(progress.batch))
        report.tables = targets
    report.seconds = time.monotonic() - began
    return report


def _apply(
    lakehouse: Lakehouse,
    spark: Callable[[], Any],
    pending: list[PendingTable],
    report: CurrentReport,
    lease: Lease,
    log: Any | None,
) -> None:
    # After a TRUNCATE only the changes that follow it decide a key's row; the rows before it go.
    keyed = {i: p for i, p in enumerate(pending) if p.version.primary_key}
    latest = None
    if keyed:
        events = []
        for i, p in keyed.items():
            changes = p.changes.filter(pc.greater(p.changes.column("_cdc_seq"), p.truncate_seq or -1))
            events.append(
                pa.table(
                    {
                        "table_id": pa.array([i] * changes.num_rows, pa.int32()),
                        "seq": changes.column("_cdc_seq"),
                        "op": changes.column("_cdc_op"),
                        "key": changes.column("_cdc_key"),
                        "before_key": changes.column("_cdc_before_key"),
                    }
                )
            )
        latest = latest_change_per_key(spark(), pa.concat_tables(events))
    for i, table in enumerate(pending):
        lease.check()  # on S3 a lease lost to another run means: merge nothing more
        if table.version.primary_key and latest is not None:
            result = apply_changes(lakehouse, table, latest.filter(pc.equal(latest.column("table_id"), i)))
        else:  # no primary key: duplicates are counted, not keyed (apply_keyless_changes)
            result = apply_keyless_changes(lakehouse, table)
        report.applied.append(result)
        if log is not None:
            log.info(
                f"{result.table}: {result.changes_in} changes -> {result.inserted} inserted, "
                f"{result.updated} updated, {result.removed} deleted ({i + 1} of {len(pending)} tables)"
            )


def current_row_count(lakehouse: Lakehouse, table: str) -> int | None:
    """Rows in a current-state table, from the Delta log's file statistics (no data read)."""
    dt = open_table(lakehouse.table_uri(CURRENT, TableRef.parse(table)), lakehouse.storage_options())
    if dt is None:
        return None
    actions = pa.table(dt.get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0


@asset(
    group_name="current",
    deps=[table_changes],
    partitions_def=tables_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    description=(
        "Current-state tables under current/<schema>/<table> (Delta), one partition per source table: one row "
        "per source row, the source's columns plus _cdc_seq and _cdc_commit_ts, rebuilt by applying the "
        "newest change per key from the change log in _cdc_seq order."
    ),
)
def current_tables(
    context: AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkSessionResource
) -> MaterializeResult:
    house = lakehouse.get()
    report = apply_pending(
        house, spark.get_session, tables=context.partition_keys, log=context.log, owner=run_owner(context.run.run_id)
    )
    applied = {str(r.table): r for r in report.applied}
    per_table = {}
    for name in report.tables:
        r = applied.get(name)
        per_table[name] = {
            "changes_in": r.changes_in if r else 0,
            "inserted": r.inserted if r else 0,
            "updated": r.updated if r else 0,
            "deleted": r.removed if r else 0,
            "rows": current_row_count(house, name),
        }
    return MaterializeResult(
        metadata={
            "tables": len(report.tables),
            "tables_changed": len(report.applied),
            "changes_in": sum(r.changes_in for r in report.applied),
            "rows_inserted": sum(r.inserted for r in report.applied),
            "rows_updated": sum(r.updated for r in report.applied),
            "rows_deleted": sum(r.removed for r in report.applied),
            "rows_out": sum(v["rows"] or 0 for v in per_table.values()),
            "per_table": MetadataValue.json(per_table),
            "duration_seconds": round(report.seconds, 3),
        }
    )
