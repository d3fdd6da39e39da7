"""Capture: the raw binlog batch asset."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from cdc_assets.partitions import run_owner
from cdc_assets.resources import BinlogResource, CaptureReport, LakehouseResource

RAW_ASSET_KEY = "raw_binlog_batches"


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


@asset(
    name=RAW_ASSET_KEY,
    group_name="capture",
    description=(
        "Immutable raw binlog batches under raw/: everything committed from the checkpoint to the binlog end "
        "as of the run's start, cut at transaction boundaries. Advances the checkpoint in _state/."
    ),
)
def raw_binlog_batches(
    context: AssetExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource
) -> MaterializeResult:
    report = binlog.capture(lakehouse.get(), log=context.log, owner=run_owner(context.run.run_id))
    context.log.info(
        f"captured {len(report.batches)} batches, {report.rows} row changes of {len(report.tables)} tables "
        f"up to {report.end} in {report.seconds:.1f}s"
    )
    return MaterializeResult(metadata=capture_metadata(report, binlog.max_batch_rows))
