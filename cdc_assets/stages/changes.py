"""The change-log stage: new raw batches split into per-table change logs, one transform over all their tables."""

import json
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import runs
from cdc_assets.core.errors import CdcUserError, disk_full_is_user_error
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.shapes import TableShape, renamed_partners, shape_from_json
from cdc_assets.lake.delta import MAX_SEQ_KEY, max_seq, table_configuration
from cdc_assets.lake.files import add_actions, commit_files
from cdc_assets.lake.layout import CHANGES, CHANGES_LOCK, CHANGES_STAGE
from cdc_assets.lake.locks import Lease, lakehouse_lock
from cdc_assets.lake.raw_batches import (
    RAW_ROWS_SCHEMA,
    BatchManifest,
    batch_exists,
    chain_breaks,
    list_batches,
    read_manifest,
    read_row_slices,
    read_rows,
)
from cdc_assets.lake.state import TableProgress, known_tables, load_progress, load_registry, save_progress
from cdc_assets.lake.store import Lakehouse, ObjectStore
from cdc_assets.stages.change_log import (
    CHANGE_LOG_FILE_BYTES,
    AppendResult,
    append_changes,
    change_log_schema,
    conform_to_log,
    log_target_schema,
    rows_for_tables,
    typed_changes,
    unified_schema,
    with_batch,
)
from spark_resources.engine import Transforms, TransformsFor

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
    if after is not None and batch_exists(store, after):
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


TRUNCATE_VERSION_IDS = -1


def rename_partners(manifests: list[BatchManifest], starts: dict[str, str | None]) -> set[str]:
    """The other side of every RENAME of a table in `starts`, in the batches it has not taken in yet."""
    return renamed_partners(
        change
        for manifest in manifests
        for _, change in manifest.schema_changes()
        if (start := starts.get(change["table"], "~")) is None or start < manifest.name
    )


def _statement_row(batch: str, version: TableShape, version_id: int, statement: dict, op: str) -> pa.Table:
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
    with (
        disk_full_is_user_error(str(lakehouse)),
        lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", owner, wait, log=log) as lease,
    ):
        targets = set(known_tables(lakehouse.store, tables))
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
    if engine.session is not None:
        _process_on_spark(lakehouse, engine.session, manifests, starts, progress, report, lease, log)
        return
    rows_per_job = MAX_ROWS_PER_ARROW_JOB if engine.engine == "arrow" else MAX_ROWS_PER_JOB
    for chunk in _chunks(manifests, rows_per_job):
        newest: dict[str, TableShape] = {}  # per table, the shape of its newest changes taken in
        for piece in _pieces(store, chunk, starts, rows_per_job):
            _take_in(lakehouse, engine, plan_piece(piece, starts, progress, newest), starts, report, lease, log)
        last = chunk[-1].name
        lease.check()
        # Progress moves past every batch read, also those without changes of the table; the table
        # version is the newest whose changes have landed.
        moved = [t for t in starts if starts[t] is None or starts[t] < last]
        for table in moved:
            progress[table] = TableProgress(last, newest.get(table, progress[table].shape))
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
    touched = len(chunk) == 1 and any(str(v.table) in starts for v in chunk[0].shapes.values())
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


@dataclass
class ChangePlan:
    """What one transform takes in, before any row is read: the batches whose rows it reads (or slices of one
    already read), the tables' shapes by (batch, version id), each version's key positions, the rows of
    TRUNCATEs and schema changes (one each, made here) and their `_cdc_ddl` texts."""

    reads: list[tuple[BatchManifest, pa.Table | None]] = field(default_factory=list)
    versions: dict[tuple[str, int], TableShape] = field(default_factory=dict)
    ddl: dict[tuple[str, int], str] = field(default_factory=dict)
    keys: list[dict] = field(default_factory=list)
    statement_rows: list[pa.Table] = field(default_factory=list)

    def table_keys(self) -> pa.Table:
        return pa.Table.from_pylist(self.keys, schema=TABLE_KEYS_SCHEMA)


def plan_piece(
    piece: Piece, starts: dict[str, str | None], progress: dict[str, TableProgress], newest: dict[str, TableShape]
) -> ChangePlan:
    """The plan of one piece for the tables in `starts`; `newest` learns each table's newest shape."""
    plan = ChangePlan()
    for manifest, slice_rows, window in piece:
        touched = [(i, v) for i, v in manifest.shapes.items() if str(v.table) in starts]
        truncates = [t for t in manifest.truncates() if t["table"] in starts and _in_window(int(t["seq"]), window)]
        changes = [
            (s, c)
            for s, c in manifest.schema_changes()
            if c["table"] in starts and _in_window(int(c.get("seq", s["seq"])), window)
        ]
        if not touched and not truncates and not changes:
            continue
        if touched:
            plan.reads.append((manifest, slice_rows))
        for version_id, shape in touched:
            plan.versions[(manifest.name, version_id)] = shape
            plan.keys.append({"batch": manifest.name, "table_version": version_id, "key_idx": shape.key_indexes()})
            newest[str(shape.table)] = shape
        statements: list[tuple[str, dict, TableShape | None, dict | None]] = []
        for statement in truncates:
            known = newest.get(statement["table"]) or progress[statement["table"]].shape
            statements.append(("truncate", statement, known, None))
        for statement, change in changes:
            version = shape_from_json(TableRef.parse(change["table"]), change["after"] or change["before"])
            own = {**statement, "seq": change.get("seq", statement["seq"])}
            statements.append((change["action"], own, version, change))
        for index, (op, statement, version, change) in enumerate(statements):
            if version is None:  # a table never seen with a row or a shape: nothing to empty or reshape
                continue
            version_id = TRUNCATE_VERSION_IDS - index  # batch-local ids below every real version's
            plan.versions[(manifest.name, version_id)] = version
            plan.keys.append({"batch": manifest.name, "table_version": version_id, "key_idx": version.key_indexes()})
            plan.statement_rows.append(_statement_row(manifest.name, version, version_id, statement, op))
            if change is not None:
                plan.ddl[(manifest.name, version_id)] = json.dumps({"statement": statement["query"], **change})
                newest[str(version.table)] = version  # also for a dropped table: its last shape
        for table, shape in manifest.raw.get("schemas", {}).items():
            if table in starts and shape is not None:  # the table's shape at the batch's end
                newest[table] = TableShape.from_json(TableRef.parse(table), shape)
    return plan


def _take_in(
    lakehouse: Lakehouse,
    engine: Transforms,
    plan: ChangePlan,
    starts: dict[str, str | None],
    report: ChangesReport,
    lease: Lease,
    log: Any | None,
) -> None:
    """Append the changes of one plan to the change logs of the tables in `starts` (one transform on Arrow)."""
    parts = [
        with_batch(slice_rows if slice_rows is not None else read_rows(lakehouse.store, manifest), manifest.name)
        for manifest, slice_rows in plan.reads
    ] + plan.statement_rows
    rows = rows_for_tables(pa.concat_tables(parts), starts) if parts else None
    if rows is None or not rows.num_rows:
        return
    report.rows_in += rows.num_rows
    keyed = engine.keyed_changes(rows, plan.table_keys())
    del rows

    def append(table_slice: tuple[TableRef, int, int]) -> AppendResult:
        table, offset, length = table_slice
        lease.check()  # on S3 a lease lost to another run means: append nothing more
        typed = typed_changes(keyed.slice(offset, length), plan.versions, plan.ddl)
        return append_changes(lakehouse, table, typed)

    slices = [(TableRef(*names), offset, length) for names, offset, length in runs(keyed, ["schema", "table"])]
    results = for_each_table(slices, append)
    for result in results:
        name = str(result.table)
        report.appended[name] = report.appended[name] + result if name in report.appended else result
    if log is not None:
        log.info(f"change logs: {sum(r.appended for r in results)} changes appended to {len(results)} tables")


def _process_on_spark(
    lakehouse: Lakehouse,
    session: Callable[[], Any],
    manifests: list[BatchManifest],
    starts: dict[str, str | None],
    progress: dict[str, TableProgress],
    report: ChangesReport,
    lease: Lease,
    log: Any | None,
) -> None:
    """The whole run on Spark: tasks read the raw batches, key, type and write each table's new change-log
    files; this process only plans (from the manifests) and commits each table's files in one Delta commit.
    A column whose type changed makes the tasks rewrite the table's older files too (the same commit)."""
    from spark_resources.change_logs import ChangeLogTargets, raw_changes, write_change_logs
    from spark_resources.files_job import compact_table, rewrite_files

    store = lakehouse.store
    newest: dict[str, TableShape] = {}
    plan = plan_piece([(m, None, (None, None)) for m in manifests], starts, progress, newest)
    tables = sorted({str(shape.table) for shape in plan.versions.values()})
    opened = dict(zip(tables, for_each_table(tables, lambda t: lakehouse.open(CHANGES, TableRef.parse(t))), strict=True))
    schemas: dict[str, pa.Schema] = {}
    rewrite: set[str] = set()
    for table in tables:
        versions = [(key, shape) for key, shape in plan.versions.items() if str(shape.table) == table]
        incoming = unified_schema([change_log_schema(shape, key in plan.ddl) for key, shape in versions])
        existing = opened[table]
        current = pa.schema(existing.schema().to_arrow()) if existing is not None else None
        schemas[table], retyped = log_target_schema(current, incoming)
        if retyped:
            rewrite.add(table)
    if tables:
        access = lakehouse.file_access()
        spark = session()
        targets = ChangeLogTargets(access, {t: max_seq(opened[t]) for t in tables}, schemas, plan.versions, plan.ddl)
        raw = raw_changes(spark, access, [(m.name, m.data_sha256) for m, _ in plan.reads], starts)
        statement_rows = pa.concat_tables(plan.statement_rows) if plan.statement_rows else None
        written = write_change_logs(spark, raw, statement_rows, plan.table_keys(), targets)
        report.rows_in += sum(m.rows for m, _ in plan.reads) + len(plan.statement_rows)

        def commit(table: str) -> AppendResult | None:
            ref, existing = TableRef.parse(table), opened[table]
            files = [w for w in written if w["table"] == table]
            key = lakehouse.table_key(CHANGES, ref)
            rewritten: list[dict] = []
            if table in rewrite and existing is not None:  # a MODIFY COLUMN: the older rows take the new type
                target = schemas[table]
                paths = [[p] for p in pa.table(existing.get_add_actions(flatten=True)).column("path").to_pylist()]
                rewritten = rewrite_files(spark, access, key, table, paths, lambda rows: conform_to_log(rows, target))
            if not files and not rewritten:
                return None
            lease.check()  # a lease lost to another run means: commit nothing more
            new_max = max([w["max_seq"] for w in files] or [targets.watermarks[table] or 0])
            commit_files(
                existing, lakehouse.table_uri(CHANGES, ref), lakehouse.storage_options(), key, schemas[table],
                add_actions(files + rewritten), [], MAX_SEQ_KEY, new_max, table_configuration(schemas[table]),
                overwrite=bool(rewritten),
            )  # fmt: skip
            compact_table(lakehouse, spark, CHANGES, ref, CHANGE_LOG_FILE_BYTES, MAX_SEQ_KEY)
            return AppendResult(
                ref, sum(w["rows"] for w in files), sum(w["inserts"] for w in files),
                sum(w["updates"] for w in files), sum(w["deletes"] for w in files), new_max,
            )  # fmt: skip

        for result in for_each_table(tables, commit):
            if result is not None:
                report.appended[str(result.table)] = result
    if manifests:
        last = manifests[-1].name
        lease.check()
        moved = [t for t in starts if starts[t] is None or starts[t] < last]
        for table in moved:
            progress[table] = TableProgress(last, newest.get(table, progress[table].shape))
        for_each_table(moved, lambda table: save_progress(store, CHANGES_STAGE, table, progress[table]))
        report.batches.extend(m.name for m in manifests)
    if log is not None:
        appended = sum(r.appended for r in report.appended.values())
        log.info(f"change logs on spark: {appended} changes appended to {len(report.appended)} tables")
