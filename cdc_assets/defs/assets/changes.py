"""The per-table change logs asset: new raw batches split into `changes/<schema>/<table>` (stages/changes/run.py)."""

from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, asset

from cdc_assets.defs.assets.metadata import per_table_metadata
from cdc_assets.defs.keys import CHANGES_ASSET, RAW_ASSET
from cdc_assets.defs.partitions import tables_partitions
from cdc_assets.defs.resources import LakehouseResource
from cdc_assets.lake.locks import run_owner
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.changes.run import process_new_batches
from spark_resources.resources import TransformsResource


@asset(
    key=CHANGES_ASSET,
    group_name="changes",
    deps=[RAW_ASSET],
    partitions_def=tables_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    description=(
        "Per-table change logs under changes/<schema>/<table> (Delta), one partition per source table: one row "
        "per row change with _cdc_op, _cdc_seq, _cdc_commit_ts, _cdc_gtid, _cdc_batch and the before-image, "
        "from every raw batch the table has not taken in yet."
    ),
)
def table_changes(
    context: AssetExecutionContext, lakehouse: LakehouseResource, transforms: TransformsResource
) -> MaterializeResult:
    tables = context.partition_keys
    report = process_new_batches(
        lakehouse.get(), transforms.for_changes, tables=tables, log=context.log, owner=run_owner(context.run.run_id)
    )
    return MaterializeResult(metadata=changes_metadata(report, tables))


def changes_metadata(report: ChangesReport, tables: list[str]) -> dict[str, object]:
    """A change-log run's metadata (the asset's, and each partition's of a `sync` run)."""
    per_table = {}
    for name in sorted(tables):
        r = report.appended.get(name)
        per_table[name] = {
            "changes": r.appended if r else 0,
            "inserts": r.inserts if r else 0,
            "updates": r.updates if r else 0,
            "deletes": r.deletes if r else 0,
        }
    return {
        "batches": len(report.batches),
        "first_batch": report.batches[0] if report.batches else "",
        "last_batch": report.batches[-1] if report.batches else "",
        "rows_in": report.rows_in,
        "rows_out": report.rows_out,
        "tables": len(tables),
        "tables_changed": len(report.appended),
        "inserts": sum(r.inserts for r in report.appended.values()),
        "updates": sum(r.updates for r in report.appended.values()),
        "deletes": sum(r.deletes for r in report.appended.values()),
        **per_table_metadata(per_table, busiest_by="changes"),
        "duration_seconds": round(report.seconds, 3),
    }
