"""Capture: the raw binlog batch asset."""

from dagster import AssetExecutionContext, MaterializeResult, asset

from cdc_assets.capture.run import capture
from cdc_assets.defs.assets.metadata import capture_metadata
from cdc_assets.defs.keys import RAW_ASSET
from cdc_assets.defs.partitions import run_owner
from cdc_assets.defs.resources import BinlogResource, LakehouseResource


@asset(
    key=RAW_ASSET,
    group_name="capture",
    description=(
        "Immutable raw binlog batches under raw/: everything committed from the checkpoint to the binlog end "
        "as of the run's start, cut at transaction boundaries. Advances the checkpoint in _state/."
    ),
)
def raw_binlog_batches(
    context: AssetExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource
) -> MaterializeResult:
    report = capture(binlog.settings(), lakehouse.get(), log=context.log, owner=run_owner(context.run.run_id))
    context.log.info(
        f"captured {len(report.batches)} batches, {report.rows} row changes of {len(report.tables)} tables "
        f"up to {report.end} in {report.seconds:.1f}s"
    )
    return MaterializeResult(metadata=capture_metadata(report, binlog.max_batch_rows))
