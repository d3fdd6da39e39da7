"""The change-log stage: new raw batches split into per-table change logs, one transform over all their tables."""

import time
from collections.abc import Collection, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core import failpoints
from cdc_assets.core.arrow import release_unused_memory, runs
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.progress import CHANGE_LOGS, Update
from cdc_assets.core.progress import report as report_progress
from cdc_assets.core.shapes import TableShape, renamed_partners, with_rename_partners
from cdc_assets.lake.delta import max_seq
from cdc_assets.lake.layout import CHANGES, CHANGES_LOCK, CHANGES_STAGE
from cdc_assets.lake.locks import Lease, lakehouse_lock
from cdc_assets.lake.quarantine import quarantined_tables, run_isolated, settle
from cdc_assets.lake.raw_batches import (
    BatchManifest,
    batch_exists,
    chain_breaks,
    list_batches,
    read_manifest,
    read_row_slices,
    read_rows,
)
from cdc_assets.lake.state import known_tables, load_progress, load_registry
from cdc_assets.lake.store import Lakehouse, ObjectStore
from cdc_assets.stages.changes.keys import keyed_changes
from cdc_assets.stages.changes.log import AppendResult, append_changes
from cdc_assets.stages.changes.plan import ChangePlan, ChangesReport, Piece, plan_piece, record_progress
from cdc_assets.stages.changes.rows import (
    rows_for_tables,
    typed_changes,
    with_batch,
)
from spark_resources.engine import TransformsFor, spark_phase

MAX_ROWS_PER_ARROW_JOB = 500_000  # row changes keyed at once on Arrow: bounds the memory of the stage


def _starts(lakehouse: Lakehouse, tables: list[str]) -> dict[str, str | None]:
    """Per table, the last batch its change log has taken in (None: it starts from the beginning)."""
    registry = load_registry(lakehouse.store)
    starts: dict[str, str | None] = {}
    for table in tables:
        progress = load_progress(lakehouse.store, CHANGES_STAGE, table)
        first = registry.get(table, {}).get("first_batch")
        if progress.batch is None and first is None:
            continue  # no change of it was ever captured (a table known from a snapshot only)
        # A table that has never been processed starts just before its first batch, not at the beginning; so does
        # one whose change log is gone (removed by hand): the raw batches rebuild it, each change once.
        taken = progress.batch is not None and lakehouse.has_table(CHANGES, TableRef.parse(table))
        starts[table] = progress.batch if taken or first is None else _just_before(first)
    return starts


def missing_change_logs(lakehouse: Lakehouse, tables: list[str]) -> list[str]:
    """Tables whose change log the stage wrote and that is gone (the pipeline never deletes one): the next run
    of the stage rebuilds them from the raw batches."""

    def missing(name: str) -> bool:
        progress = load_progress(lakehouse.store, CHANGES_STAGE, name)
        return progress.batch is not None and not lakehouse.has_table(CHANGES, TableRef.parse(name))

    return [name for name, gone in zip(tables, for_each_table(tables, missing), strict=True) if gone]


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


def rename_partners(manifests: list[BatchManifest], starts: dict[str, str | None]) -> set[str]:
    """The other side of every RENAME of a table in `starts`, in the batches it has not taken in yet."""
    return renamed_partners(
        change
        for manifest in manifests
        for _, change in manifest.schema_changes()
        if (start := starts.get(change["table"], "~")) is None or start < manifest.name
    )


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
        lakehouse.faults_are_user_errors(),
        lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", owner, wait, log=log) as lease,
    ):
        starts: dict[str, str | None] = {}
        manifests: list[BatchManifest] = []

        def take_in(new: list[str]) -> set[str]:
            nonlocal manifests
            starts.update(_starts(lakehouse, new))
            if not starts:
                return set()
            earliest = None if None in starts.values() else min(s for s in starts.values() if s is not None)
            manifests = new_batches(lakehouse, earliest)
            return rename_partners(manifests, starts)

        with_rename_partners(set(known_tables(lakehouse.store, tables)), take_in)
        if starts:
            store = lakehouse.store

            def work(group: set[str]) -> None:
                own = {t: start for t, start in starts.items() if t in group}
                _process(lakehouse, transforms, manifests, own, report, lease, log)

            # one table whose changes cannot be typed or appended is quarantined; the others go on (lake/quarantine)
            failed = run_isolated(starts, quarantined_tables(store, (CHANGES,)), work, log)
            report.quarantined = settle(
                store, CHANGES, starts, failed, lambda t: max_seq(lakehouse.open(CHANGES, TableRef.parse(t))), log
            )
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
    report_progress(Update(CHANGE_LOGS, 0, len(manifests), "batches"))
    if engine.session is not None:
        from cdc_assets.stages.changes.on_spark import process_on_spark  # pyspark loads only for a Spark run

        with spark_phase(engine.session, "change logs", log) as session:
            process_on_spark(lakehouse, session, manifests, starts, progress, report, lease, log)
        return
    for chunk in _chunks(manifests, MAX_ROWS_PER_ARROW_JOB):
        newest: dict[str, TableShape] = {}  # per table, the shape of its newest changes taken in
        for piece in _pieces(store, chunk, starts, MAX_ROWS_PER_ARROW_JOB):
            _take_in(lakehouse, plan_piece(piece, starts, progress, newest), starts, report, lease, log)
            release_unused_memory()  # the piece's rows (a huge value's too) are gone
        failpoints.hit("changes.appended_before_progress")
        lease.check()
        record_progress(store, starts, progress, newest, chunk[-1].name)
        if not report.batches or report.batches[-1] < chunk[-1].name:  # a table retried alone reads them again
            report.batches.extend(m.name for m in chunk)
        done = len(report.batches)
        report_progress(Update(CHANGE_LOGS, done, len(manifests), "batches", report.rows_in, done))
        if log is not None:
            log.info(f"change logs: {done} of {len(manifests)} batches done, {report.rows_in} rows")


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


def _take_in(
    lakehouse: Lakehouse,
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
    del parts
    if rows is None or not rows.num_rows:
        return
    report.rows_in += rows.num_rows
    keyed = keyed_changes(rows, plan.table_keys())
    del rows

    def append(table_slice: tuple[TableRef, int, int]) -> AppendResult:
        table, offset, length = table_slice
        lease.check()  # on S3 a lease lost to another run means: append nothing more
        typed = typed_changes(keyed.slice(offset, length), plan.versions, plan.ddl)
        result = append_changes(lakehouse, table, typed)
        failpoints.hit("changes.table_appended")
        return result

    slices = [(TableRef(*names), offset, length) for names, offset, length in runs(keyed, ["schema", "table"])]
    results = for_each_table(slices, append)
    for result in results:
        name = str(result.table)
        report.appended[name] = report.appended[name] + result if name in report.appended else result
    if log is not None:
        log.info(f"change logs: {sum(r.appended for r in results)} changes appended to {len(results)} tables")


