"""Asset checks run after each materialization (and by `cdc-lakehouse sync`)."""

from dagster import AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from cdc_assets.assets import raw_binlog_batches, table_changes
from cdc_assets.change_log import open_table, read_query
from cdc_assets.lakehouse import CHANGES, Lakehouse, TableRef
from cdc_assets.raw_batch import chain_break, list_batches, read_manifest
from cdc_assets.resources import LakehouseResource
from cdc_assets.state import load_catalog


def batch_chain_breaks(lakehouse: Lakehouse) -> list[str]:
    """Places where a raw batch does not start exactly where the one before it ended."""
    breaks = []
    previous = None
    for name in list_batches(lakehouse.store):
        manifest = read_manifest(lakehouse.store, name)
        problem = chain_break(previous, manifest) if previous is not None else None
        if problem:
            breaks.append(problem)
        previous = manifest
    return breaks


@asset_check(
    asset=raw_binlog_batches,
    blocking=True,
    description="Raw batches are contiguous: each starts where the previous ended (no gap, no overlap).",
)
def raw_batches_contiguous(lakehouse: LakehouseResource) -> AssetCheckResult:
    breaks = batch_chain_breaks(lakehouse.get())
    return AssetCheckResult(
        passed=not breaks,
        severity=AssetCheckSeverity.ERROR,
        metadata={"breaks": len(breaks), "details": MetadataValue.json(breaks[:50])},
    )


def duplicate_seqs(lakehouse: Lakehouse) -> dict[str, int]:
    """Change logs in which some `_cdc_seq` appears more than once, with how many extra rows."""
    found = {}
    for name in sorted(load_catalog(lakehouse.store)):
        log = open_table(lakehouse.table_uri(CHANGES, TableRef.parse(name)), lakehouse.storage_options())
        if log is None:
            continue
        counts = read_query(log, "SELECT COUNT(*) AS n, COUNT(DISTINCT _cdc_seq) AS d FROM changes", "changes")
        n, d = counts.column("n")[0].as_py(), counts.column("d")[0].as_py()
        if n != d:
            found[name] = n - d
    return found


@asset_check(
    asset=table_changes,
    blocking=True,
    description="Every change log has each _cdc_seq once: no row change was appended twice.",
)
def change_log_seq_unique(lakehouse: LakehouseResource) -> AssetCheckResult:
    duplicates = duplicate_seqs(lakehouse.get())
    return AssetCheckResult(
        passed=not duplicates,
        severity=AssetCheckSeverity.ERROR,
        metadata={"tables_with_duplicates": MetadataValue.json(duplicates)},
    )
