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

from cdc_assets.assets.raw import RAW_ASSET_KEY, capture_metadata
from cdc_assets.resources import BinlogResource, LakehouseResource
from cdc_assets.snapshot import take_snapshot

SYNC_JOB_NAME = "sync"
SNAPSHOT_JOB_NAME = "snapshot"
CURRENT_ASSET_KEY = "current_tables"

sync_job = define_asset_job(
    SYNC_JOB_NAME,
    selection=AssetSelection.all(),
    description="Capture new binlog batches, then update the change logs and current-state tables they touch.",
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
    report = take_snapshot(binlog, lakehouse.get(), config.tables, log=context.log)
    if report.capture is not None:
        context.log_event(AssetMaterialization(RAW_ASSET_KEY, metadata=capture_metadata(report.capture)))
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
