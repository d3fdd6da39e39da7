"""The current-state asset: each table's pending changes applied to `current/<schema>/<table>` (stages/current/run.py)."""

from dagster import AssetExecutionContext, AssetMaterialization, BackfillPolicy, MaterializeResult, asset

from cdc_assets.defs.assets.metadata import applied_figures, per_table_metadata
from cdc_assets.defs.assets.tables import table_materializations
from cdc_assets.defs.keys import CHANGES_ASSET, CURRENT_ASSET
from cdc_assets.defs.partitions import tables_partitions
from cdc_assets.defs.resources import LakehouseResource
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.store import Lakehouse
from cdc_assets.lake.table_facts import TableFacts
from cdc_assets.runtime.event_log import log_batch
from cdc_assets.stages.current.run import apply_pending
from cdc_assets.stages.current.steps import CurrentReport
from spark_resources.resources import TransformsResource


@asset(
    key=CURRENT_ASSET,
    group_name="current",
    deps=[CHANGES_ASSET],
    partitions_def=tables_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    description=(
        "Current-state tables under current/<schema>/<table> (Delta), one partition per source table: one row "
        "per source row, the source's columns plus _cdc_seq and _cdc_commit_ts, rebuilt by applying the "
        "newest change per key from the change log in _cdc_seq order. Each run also records a materialization "
        "of every run table's own asset, current/<schema>/<table>, with its column schema and row count."
    ),
)
def current_tables(
    context: AssetExecutionContext, lakehouse: LakehouseResource, transforms: TransformsResource
) -> MaterializeResult:
    house = lakehouse.get()
    report = apply_pending(
        house,
        transforms.for_changes,
        tables=context.partition_keys,
        log=context.log,
        owner=run_owner(context.run.run_id),
    )
    metadata, own = current_events(house, report)
    # every table of the run gets a materialization of its own asset, from this one run (not a run per table)
    log_batch(context, list(own.values()))  # one batch of events, however many tables
    return MaterializeResult(metadata=metadata)


def current_events(
    house: Lakehouse, report: CurrentReport, facts: dict[str, TableFacts] | None = None
) -> tuple[dict[str, object], dict[str, AssetMaterialization]]:
    """A current-state run's metadata (the asset's, and each partition's of a `sync` run), and each run table's
    materialization of its own asset, current/<schema>/<table> (`facts`: its tables' facts, read already)."""
    figures = applied_figures(report.tables, report.applied)
    own = table_materializations(house, figures, facts)
    per_table = {}
    for name, event in own.items():
        per_table[name] = {
            "changes_in": figures[name]["changes_in"],
            "inserted": figures[name]["rows_inserted"],
            "updated": figures[name]["rows_updated"],
            "deleted": figures[name]["rows_deleted"],
            "rows": event.metadata["dagster/row_count"].value,
        }
    metadata = {
        "tables": len(report.tables),
        "tables_changed": len(report.applied),
        "changes_in": sum(r.changes_in for r in report.applied),
        "rows_inserted": sum(r.inserted for r in report.applied),
        "rows_updated": sum(r.updated for r in report.applied),
        "rows_deleted": sum(r.removed for r in report.applied),
        "rows_out": sum(v["rows"] or 0 for v in per_table.values()),
        **per_table_metadata(per_table, busiest_by="changes_in"),
        "duration_seconds": round(report.seconds, 3),
    }
    return metadata, own
