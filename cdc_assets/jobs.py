"""Jobs: `sync` materializes the three layers with their checks; `snapshot` loads existing rows."""

from dagster import (
    AssetMaterialization,
    AssetSelection,
    Config,
    MetadataValue,
    OpExecutionContext,
    define_asset_job,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from cdc_assets.assets import current_tables, raw_binlog_batches, table_changes
from cdc_assets.assets.raw import RAW_ASSET_KEY, capture_metadata
from cdc_assets.checks import table_lag
from cdc_assets.partitions import run_owner
from cdc_assets.resources import BinlogResource, LakehouseResource
from cdc_assets.snapshot import take_snapshot

CAPTURE_JOB_NAME = "capture"
APPLY_JOB_NAME = "apply_changes"
LAG_JOB_NAME = "check_lag"
SNAPSHOT_JOB_NAME = "snapshot"
CURRENT_ASSET_KEY = "current_tables"
STAGE_TAG = "cdc/stage"  # runs that capture carry STAGE_TAG=capture: the schedule and the run queue look for it

capture_job = define_asset_job(
    CAPTURE_JOB_NAME,
    selection=AssetSelection.assets(raw_binlog_batches),
    tags={STAGE_TAG: "capture"},
    description=(
        "Capture: raw batches from the checkpoint to the binlog end as of the run's start, then the contiguity "
        "check. Holds the lakehouse's capture lock, so two captures never run at once."
    ),
)

apply_job = define_asset_job(
    APPLY_JOB_NAME,
    selection=AssetSelection.assets(table_changes, current_tables),
    tags={STAGE_TAG: "apply"},
    description=(
        "For the run's tables (one partition or a range): append new raw-batch changes to their change logs, "
        "apply them to their current state, then check both against the source."
    ),
)

lag_check_job = define_asset_job(
    LAG_JOB_NAME,
    selection=AssetSelection.checks(table_lag),
    tags={STAGE_TAG: "check"},
    description="Evaluates the per-table lag check alone, so a stopped pipeline is reported even when nothing runs.",
)


class SnapshotConfig(Config):
    tables: list[str] = Field(default_factory=list, description="schema.table names; empty: every included table.")


@op(
    description=(
        "Reads tables inside one consistent snapshot, captures the binlog exactly up to its position, and "
        "replaces the tables' current state with the rows, so later changes apply on top."
    )
)
def snapshot_tables(
    context: OpExecutionContext, config: SnapshotConfig, binlog: BinlogResource, lakehouse: LakehouseResource
) -> None:
    report = take_snapshot(binlog, lakehouse.get(), config.tables, log=context.log, owner=run_owner(context.run.run_id))
    if report.capture is not None:
        context.log_event(
            AssetMaterialization(RAW_ASSET_KEY, metadata=capture_metadata(report.capture, binlog.max_batch_rows))
        )
    context.log_event(
        AssetMaterialization(
            CURRENT_ASSET_KEY,
            description=f"snapshot at {report.position}",
            metadata={
                "snapshot_position": report.position,
                "snapshot_seq": report.seq,
                "tables": len(report.rows),
                "rows": sum(report.rows.values()),
                "per_table": MetadataValue.json(report.rows),
                "duration_seconds": round(report.seconds, 3),
            },
        )
    )


@job(name=SNAPSHOT_JOB_NAME, executor_def=in_process_executor, description=snapshot_tables.description)
def snapshot_job() -> None:
    snapshot_tables()
