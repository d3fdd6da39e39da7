"""Changes: new raw batches split into per-table change logs, one Spark job over all their tables."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from cdc_assets.assets.raw import raw_binlog_batches
from cdc_assets.change_log import AppendResult, append_changes, build_change_table
from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import Lakehouse, TableRef
from cdc_assets.raw_batch import BatchManifest, TableVersion, chain_break, list_batches, read_manifest, read_rows
from cdc_assets.resources import LakehouseResource
from cdc_assets.state import load_catalog, load_changes_cursor, save_catalog, save_changes_cursor
from spark_resources import SparkSessionResource
from spark_resources.transforms import keyed_changes

MAX_ROWS_PER_JOB = 500_000
TABLE_KEYS_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.string(), nullable=False),
        pa.field("table_version", pa.int32(), nullable=False),
        pa.field("key_idx", pa.list_(pa.int32()), nullable=False),
    ]
)


@dataclass
class ChangesReport:
    batches: list[str] = field(default_factory=list)
    rows_in: int = 0
    appended: dict[str, AppendResult] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rows_out(self) -> int:
        return sum(r.appended for r in self.appended.values())


def new_batches(lakehouse: Lakehouse) -> list[BatchManifest]:
    """Visible raw batches after the change-log cursor, checked to follow on without a gap."""
    store = lakehouse.store
    cursor = load_changes_cursor(store)
    names = [n for n in list_batches(store) if cursor is None or n > cursor]
    manifests = [read_manifest(store, n) for n in names]
    previous = read_manifest(store, cursor) if cursor else None
    for manifest in manifests:
        problem = chain_break(previous, manifest) if previous is not None else None
        if problem:
            raise CdcUserError(
                f"The raw batches have a gap or an overlap ({problem}): restore the missing raw batch from a "
                "backup, or re-initialise the lakehouse."
            )
        previous = manifest
    return manifests


def _chunks(manifests: list[BatchManifest]) -> list[list[BatchManifest]]:
    """Consecutive batches grouped so that one Spark job handles at most about MAX_ROWS_PER_JOB rows."""
    chunks: list[list[BatchManifest]] = []
    rows = 0
    for manifest in manifests:
        if not chunks or rows + manifest.rows > MAX_ROWS_PER_JOB:
            chunks.append([])
            rows = 0
        chunks[-1].append(manifest)
        rows += manifest.rows
    return chunks


def _table_slices(keyed: pa.Table) -> list[tuple[TableRef, int, int]]:
    """(table, offset, length) of each table's run in rows sorted by schema and table."""
    schemas = keyed.column("schema").to_pylist()
    tables = keyed.column("table").to_pylist()
    slices: list[tuple[TableRef, int, int]] = []
    start = 0
    for i in range(1, len(schemas) + 1):
        if i == len(schemas) or schemas[i] != schemas[start] or tables[i] != tables[start]:
            slices.append((TableRef(schemas[start], tables[start]), start, i - start))
            start = i
    return slices


def process_new_batches(lakehouse: Lakehouse, spark: Callable[[], Any], log: Any | None = None) -> ChangesReport:
    """Append the changes of every raw batch after the cursor to the change logs, then move the cursor."""
    began = time.monotonic()
    store = lakehouse.store
    report = ChangesReport()
    manifests = new_batches(lakehouse)
    catalog = load_catalog(store)
    for chunk in _chunks(manifests):
        versions: dict[tuple[str, int], TableVersion] = {}
        parts, keys = [], []
        for manifest in chunk:
            rows = read_rows(store, manifest)
            parts.append(rows.append_column("batch", pa.array([manifest.name] * rows.num_rows, pa.string())))
            for version in manifest.table_versions:
                versions[(manifest.name, version.id)] = version
                keys.append({"batch": manifest.name, "table_version": version.id, "key_idx": version.key_indexes()})
                catalog[str(version.table)] = version.to_json()
        # Each table's newest version is recorded before its changes land, so the current-state layer
        # always finds the columns and key of every change log.
        save_catalog(store, catalog)
        rows = pa.concat_tables(parts)
        report.rows_in += rows.num_rows
        if rows.num_rows:
            keyed = keyed_changes(spark(), rows, pa.Table.from_pylist(keys, schema=TABLE_KEYS_SCHEMA))
            for table, offset, length in _table_slices(keyed):
                result = _append_table(lakehouse, table, keyed.slice(offset, length), versions)
                previous = report.appended.get(str(table))
                report.appended[str(table)] = _sum(previous, result)
                if log is not None:
                    log.info(f"{table}: {result.appended} changes appended")
        save_changes_cursor(store, chunk[-1].name)
        report.batches.extend(m.name for m in chunk)
    report.seconds = time.monotonic() - began
    return report


def _append_table(
    lakehouse: Lakehouse, table: TableRef, rows: pa.Table, versions: dict[tuple[str, int], TableVersion]
) -> AppendResult:
    """One atomic append per table, whatever number of table versions its rows span."""
    typed = []
    pairs = pc.unique(
        pc.binary_join_element_wise(rows.column("batch"), rows.column("table_version").cast(pa.string()), "\x1f")
    )
    for pair in pairs.to_pylist():
        batch, version_id = pair.split("\x1f")
        mask = pc.and_(pc.equal(rows.column("batch"), batch), pc.equal(rows.column("table_version"), int(version_id)))
        typed.append(build_change_table(versions[(batch, int(version_id))], rows.filter(mask)))
    return append_changes(lakehouse, table, pa.concat_tables(typed, promote_options="permissive"))


def _sum(a: AppendResult | None, b: AppendResult) -> AppendResult:
    if a is None:
        return b
    return AppendResult(
        b.table, a.appended + b.appended, a.inserts + b.inserts, a.updates + b.updates, a.deletes + b.deletes, b.max_seq
    )


@asset(
    group_name="changes",
    deps=[raw_binlog_batches],
    description=(
        "Per-table change logs under changes/<schema>/<table> (Delta): one row per row change with _cdc_op, "
        "_cdc_seq, _cdc_commit_ts, _cdc_gtid, _cdc_batch and the before-image, from every new raw batch."
    ),
)
def table_changes(
    context: AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkSessionResource
) -> MaterializeResult:
    report = process_new_batches(lakehouse.get(), spark.get_session, log=context.log)
    per_table = {
        name: {"changes": r.appended, "inserts": r.inserts, "updates": r.updates, "deletes": r.deletes}
        for name, r in sorted(report.appended.items())
    }
    return MaterializeResult(
        metadata={
            "batches": len(report.batches),
            "first_batch": report.batches[0] if report.batches else "",
            "last_batch": report.batches[-1] if report.batches else "",
            "rows_in": report.rows_in,
            "rows_out": report.rows_out,
            "tables": len(report.appended),
            "inserts": sum(r.inserts for r in report.appended.values()),
            "updates": sum(r.updates for r in report.appended.values()),
            "deletes": sum(r.deletes for r in report.appended.values()),
            "per_table": MetadataValue.json(per_table),
            "duration_seconds": round(report.seconds, 3),
        }
    )
