"""Changes: new raw batches split into per-table change logs, one transform over all their tables (Spark for large runs)."""

import json
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, asset

from cdc_assets.assets.metadata import per_table_metadata
from cdc_assets.assets.raw import raw_binlog_batches
from cdc_assets.change_log import DDL_COLUMN, AppendResult, append_changes, build_change_table, concat_unified
from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import Lakehouse, ObjectStore, TableRef
from cdc_assets.locks import Lease, lakehouse_lock
from cdc_assets.parallel import for_each_table
from cdc_assets.partitions import run_owner, tables_partitions
from cdc_assets.raw_batch import (
    RAW_ROWS_SCHEMA,
    BatchManifest,
    TableVersion,
    chain_breaks,
    list_batches,
    read_manifest,
    read_row_slices,
    read_rows,
)
from cdc_assets.resources import LakehouseResource
from cdc_assets.stages import CHANGES_LOCK, CHANGES_STAGE
from cdc_assets.state import TableProgress, load_progress, load_registry, save_progress
from spark_resources import SparkSessionResource, Transforms, TransformsFor

MAX_ROWS_PER_JOB = 200_000  # row changes per Spark job: bounds the memory of the stage (Python and JVM)
MAX_ROWS_PER_ARROW_JOB = 500_000  # the same on Arrow, where a row costs less memory (no JVM copy)
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


def target_tables(lakehouse: Lakehouse, tables: Collection[str] | None) -> list[str]:
    """The tables a run works on: those asked for that the lakehouse has seen, else every table it has seen."""
    known = load_registry(lakehouse.store)
    return sorted(known if tables is None else set(tables) & set(known))


def _starts(lakehouse: Lakehouse, tables: list[str]) -> dict[str, str | None]:
    """Per table, the last batch its change log has taken in (None: it starts from the beginning)."""
    registry = load_registry(lakehouse.store)
    starts: dict[str, str | None] = {}
    for table in tables:
        progress = load_progress(lakehouse.store, CHANGES_STAGE, table)
        first = registry.get(table, {}).get("first_batch")
        if progress.batch is None and first is None:
            continue  # no change of it was ever captured (a table known from a snapshot only)
        # A table that has never been processed starts just before its first batch, not at the beginning.
        starts[table] = progress.batch if progress.batch is not None else _just_before(first)
    return starts


def _just_before(batch: str | None) -> str | None:
    """A name that sorts after every batch before `batch` and before `batch` itself.

    Batch names are fixed-width digits, so lowering the last character and appending '~' does it.
    """
    return None if batch is None else batch[:-1] + chr(ord(batch[-1]) - 1) + "~"


def new_batches(lakehouse: Lakehouse, after: str | None) -> list[BatchManifest]:
    """Visible raw batches after `after`, checked to follow on from each other without a gap."""
    store = lakehouse.store
    manifests = [read_manifest(store, n) for n in list_batches(store, after)]
    previous = None
    if after is not None and store.exists(f"raw/{after}/manifest.json"):
        previous = read_manifest(store, after)
    breaks = chain_breaks(manifests, previous)
    if breaks:
        raise CdcUserError(
            f"The raw batches have a gap or an overlap ({breaks[0]}): restore the missing raw batch from a "
            "backup, or re-initialise the lakehouse."
        )
    return manifests


def _chunks(manifests: list[BatchManifest], rows_per_job: int) -> list[list[BatchManifest]]:
    """Consecutive batches grouped so that one transform handles at most about `rows_per_job` rows."""
    chunks: list[list[BatchManifest]] = []
    rows = 0
    for manifest in manifests:
        if not chunks or rows + manifest.rows > rows_per_job:
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


TRUNCATE_VERSION_IDS = -1


def rename_partners(manifests: list[BatchManifest], starts: dict[str, str | None]) -> set[str]:
    """The other side of every RENAME of a table in `starts`, in the batches it has not taken in yet."""
    partners = set()
    for manifest in manifests:
        for _, change in manifest.schema_changes():
            start = starts.get(change["table"], "~")
            if start is not None and start >= manifest.name:
                continue
            partners |= {t for t in (change.get("renamed_from"), change.get("renamed_to")) if t}
    return partners


def _statement_row(batch: str, version: TableVersion, version_id: int, statement: dict, op: str) -> pa.Table:
    """A TRUNCATE or a schema change as a change at the statement's `_cdc_seq`, with no row image."""
    row = {
        "seq": int(statement["seq"]),
        "schema": version.table.schema,
        "table": version.table.table,
        "table_version": version_id,
        "op": op,
        "gtid": statement.get("gtid"),
        "commit_ts": int(statement.get("commit_ts") or 0) * 1_000_000,
        "before": None,
        "after": None,
    }
    table = pa.Table.from_pylist([row], schema=RAW_ROWS_SCHEMA)
    return table.append_column("batch", pa.array([batch], pa.string()))


def _version_of_shape(table: str, shape: dict | None) -> TableVersion | None:
    if shape is None:
        return None
    ref = TableRef.parse(table)
    return TableVersion.from_json({"id": 0, "schema": ref.schema, "table": ref.table, **shape})


def _rows_for_tables(rows: pa.Table, starts: dict[str, str | None]) -> pa.Table:
    """Rows of the wanted tables in batches after each table's own start."""
    names = list(starts)
    index = pc.index_in(pc.binary_join_element_wise(rows.column("schema"), rows.column("table"), "."), pa.array(names))
    start_after = pc.take(pa.array([starts[n] or "" for n in names], pa.string()), index)
    wanted = pc.and_(pc.is_valid(index), pc.greater(rows.column("batch"), start_after))
    return rows.filter(pc.fill_null(wanted, False))


def process_new_batches(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    tables: Collection[str] | None = None,
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
) -> ChangesReport:
    """Append the changes of `tables` (default: all) from raw batches they have not taken in yet.

    Holds the lakehouse's change-log lock, so two runs never append the same changes; each table's
    progress is saved only after its append, and the change log's own `_cdc_seq` watermark makes a
    repeat after a crash append nothing twice.
    """
    began = time.monotonic()
    report = ChangesReport()
    wait = lakehouse.lock_wait_seconds
    with lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", owner, wait, log=log) as lease:
        targets = set(target_tables(lakehouse, tables))
        while True:
            starts = _starts(lakehouse, sorted(targets))
            if not starts:
                break
            earliest = None if None in starts.values() else min(s for s in starts.values() if s is not None)
            manifests = new_batches(lakehouse, earliest)
            partners = rename_partners(manifests, starts) - targets
            if not partners:
                _process(lakehouse, transforms, manifests, starts, report, lease, log)
                break
            targets |= partners  # a renamed table's rows move with it: both sides are taken in together
    report.seconds = time.monotonic() - began
    return report


def _process(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    manifests: list[BatchManifest],
    starts: dict[str, str | None],
    report: ChangesReport,
    lease: Lease,
    log: Any | None,
) -> None:
    store = lakehouse.store
    progress = {t: load_progress(store, CHANGES_STAGE, t) for t in starts}
    rows = sum(m.rows for m in manifests)
    engine = transforms(rows)
    if log is not None and manifests:
        log.info(f"change logs: {len(manifests)} batches, {rows} rows, on {engine.engine}")
    rows_per_job = MAX_ROWS_PER_ARROW_JOB if engine.engine == "arrow" else MAX_ROWS_PER_JOB
    for chunk in _chunks(manifests, rows_per_job):
        newest: dict[str, dict] = {}  # per table, the version of its newest changes taken in
        for piece in _pieces(store, chunk, starts, rows_per_job):
            _take_in(lakehouse, engine, piece, starts, progress, newest, report, lease, log)
        last = chunk[-1].name
        lease.check()
        # Progress moves past every batch read, also those without changes of the table; the table
        # version is the newest whose changes have landed.
        moved = [t for t in starts if starts[t] is None or starts[t] < last]
        for table in moved:
            progress[table] = TableProgress(last, newest.get(table, progress[table].version))
        for_each_table(moved, lambda table: save_progress(store, CHANGES_STAGE, table, progress[table]))
        report.batches.extend(m.name for m in chunk)
        if log is not None:
            log.info(f"change logs: {len(report.batches)} of {len(manifests)} batches done, {report.rows_in} rows")


Piece = list[tuple[BatchManifest, pa.Table | None, tuple[int | None, int | None]]]


def _pieces(
    store: ObjectStore, chunk: list[BatchManifest], starts: dict[str, str | None], rows_per_job: int
) -> Iterator[Piece]:
    """What one Spark job takes: the chunk's batches whole, or a batch too large for one job (a huge
    transaction) in slices of `rows_per_job` rows, each with the statements of its `_cdc_seq` window,
    so appends stay in `_cdc_seq` order and memory stays bounded."""
    touched = len(chunk) == 1 and any(str(v.table) in starts for v in chunk[0].table_versions)
    if len(chunk) > 1 or chunk[0].rows <= rows_per_job or not touched:
        yield [(manifest, None, (None, None)) for manifest in chunk]
        return
    manifest = chunk[0]
    slices = -(-manifest.rows // rows_per_job)
    low: int | None = None
    for index, rows in enumerate(read_row_slices(store, manifest, rows_per_job)):
        high = None if index == slices - 1 else int(pc.max(rows.column("seq")).as_py())
        yield [(manifest, rows, (low, high))]
        low = high


def _in_window(seq: int, window: tuple[int | None, int | None]) -> bool:
    low, high = window
    return (low is None or seq > low) and (high is None or seq <= high)


def _take_in(
    lakehouse: Lakehouse,
    engine: Transforms,
    piece: Piece,
    starts: dict[str, str | None],
    progress: dict[str, TableProgress],
    newest: dict[str, dict],
    report: ChangesReport,
    lease: Lease,
    log: Any | None,
) -> None:
    """Append the changes of one piece to the change logs of the tables in `starts` (one Spark job)."""
    store = lakehouse.store
    versions: dict[tuple[str, int], TableVersion] = {}
    ddl: dict[tuple[str, int], str] = {}
    parts, keys = [], []
    for manifest, slice_rows, window in piece:
        touched = [v for v in manifest.table_versions if str(v.table) in starts]
        truncates = [t for t in manifest.truncates() if t["table"] in starts and _in_window(int(t["seq"]), window)]
        changes = [
            (s, c)
            for s, c in manifest.schema_changes()
            if c["table"] in starts and _in_window(int(c.get("seq", s["seq"])), window)
        ]
        if not touched and not truncates and not changes:
            continue
        if slice_rows is not None:
            rows = slice_rows
        else:
            rows = read_rows(store, manifest) if touched else RAW_ROWS_SCHEMA.empty_table()
        parts.append(rows.append_column("batch", pa.array([manifest.name] * rows.num_rows, pa.string())))
        for version in touched:
            versions[(manifest.name, version.id)] = version
            keys.append({"batch": manifest.name, "table_version": version.id, "key_idx": version.key_indexes()})
            newest[str(version.table)] = version.to_json()
        statements: list[tuple[str, dict, TableVersion | None, dict | None]] = []
        for statement in truncates:
            known = newest.get(statement["table"]) or progress[statement["table"]].version
            statements.append(("truncate", statement, TableVersion.from_json(known) if known else None, None))
        for statement, change in changes:
            version = _version_of_shape(change["table"], change["after"] or change["before"])
            own = {**statement, "seq": change.get("seq", statement["seq"])}
            statements.append((change["action"], own, version, change))
        for index, (op, statement, version, change) in enumerate(statements):
            if version is None:  # a table never seen with a row or a shape: nothing to empty or reshape
                continue
            version_id = TRUNCATE_VERSION_IDS - index  # batch-local ids below every real version's
            versions[(manifest.name, version_id)] = version
            keys.append({"batch": manifest.name, "table_version": version_id, "key_idx": version.key_indexes()})
            parts.append(_statement_row(manifest.name, version, version_id, statement, op))
            if change is not None:
                ddl[(manifest.name, version_id)] = json.dumps({"statement": statement["query"], **change})
                newest[str(version.table)] = version.to_json()  # also for a dropped table: its last shape
        for table, shape in manifest.raw.get("schemas", {}).items():
            if table in starts and shape is not None:  # the table's shape at the batch's end
                newest[table] = _version_of_shape(table, shape).to_json()  # type: ignore[union-attr]
    rows = _rows_for_tables(pa.concat_tables(parts), starts) if parts else None
    if rows is None or not rows.num_rows:
        return
    report.rows_in += rows.num_rows
    keyed = engine.keyed_changes(rows, pa.Table.from_pylist(keys, schema=TABLE_KEYS_SCHEMA))
    del rows

    def append(table_slice: tuple[TableRef, int, int]) -> AppendResult:
        table, offset, length = table_slice
        lease.check()  # on S3 a lease lost to another run means: append nothing more
        return _append_table(lakehouse, table, keyed.slice(offset, length), versions, ddl)

    results = for_each_table(_table_slices(keyed), append)
    for result in results:
        report.appended[str(result.table)] = _sum(report.appended.get(str(result.table)), result)
    if log is not None:
        log.info(f"change logs: {sum(r.appended for r in results)} changes appended to {len(results)} tables")


def _append_table(
    lakehouse: Lakehouse,
    table: TableRef,
    rows: pa.Table,
    versions: dict[tuple[str, int], TableVersion],
    ddl: dict[tuple[str, int], str],
) -> AppendResult:
    """One atomic append per table, whatever number of table versions its rows span.

    A schema change's row carries the change in `_cdc_ddl` (JSON: statement, action, shapes before and
    after, column renames, defaults), so the change log says what happened between its versions.
    """
    typed = []
    pairs = pc.unique(
        pc.binary_join_element_wise(rows.column("batch"), rows.column("table_version").cast(pa.string()), "\x1f")
    )
    for pair in pairs.to_pylist():
        batch, version_id = pair.split("\x1f")
        mask = pc.and_(pc.equal(rows.column("batch"), batch), pc.equal(rows.column("table_version"), int(version_id)))
        part = build_change_table(versions[(batch, int(version_id))], rows.filter(mask))
        if (batch, int(version_id)) in ddl:
            part = part.append_column(
                DDL_COLUMN, pa.array([ddl[(batch, int(version_id))]] * part.num_rows, pa.string())
            )
        typed.append(part)
    return append_changes(lakehouse, table, concat_unified(typed).sort_by("_cdc_seq"))


def _sum(a: AppendResult | None, b: AppendResult) -> AppendResult:
    if a is None:
        return b
    return AppendResult(
        b.table, a.appended + b.appended, a.inserts + b.inserts, a.updates + b.updates, a.deletes + b.deletes, b.max_seq
    )


@asset(
    group_name="changes",
    deps=[raw_binlog_batches],
    partitions_def=tables_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    description=(
        "Per-table change logs under changes/<schema>/<table> (Delta), one partition per source table: one row "
        "per row change with _cdc_op, _cdc_seq, _cdc_commit_ts, _cdc_gtid, _cdc_batch and the before-image, "
        "from every raw batch the table has not taken in yet."
    ),
)
def table_changes(
    context: AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkSessionResource
) -> MaterializeResult:
    tables = context.partition_keys
    report = process_new_batches(
        lakehouse.get(), spark.transforms, tables=tables, log=context.log, owner=run_owner(context.run.run_id)
    )
    per_table = {}
    for name in sorted(tables):
        r = report.appended.get(name)
        per_table[name] = {
            "changes": r.appended if r else 0,
            "inserts": r.inserts if r else 0,
            "updates": r.updates if r else 0,
            "deletes": r.deletes if r else 0,
        }
    return MaterializeResult(
        metadata={
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
    )
