"""Snapshots on Spark: parallel tasks read a table's rows a primary-key range (chunk) at a time, with no lock on
the source, and write them as current-state files; the run process plans the chunks, keeps a resumable record
of them and commits each table in one Delta commit.

Consistency is the low-watermark method of DBLog and Flink CDC's incremental snapshot, with the watermark shared
by a table's chunks. Before any chunk is read, the run process takes a binlog position L (the low watermark)
such that every transaction up to L is visible to any read that starts later (`source.consistent_snapshot`, no
lock), and captures the binlog up to L,
which gives S, the `_cdc_seq` of the last change at or before L. Each chunk is then read by one SELECT (one
consistent read) at some moment after L, and its rows get `_cdc_seq` = S. The table's current state is committed
with S as its applied seq, so the next sync applies every change after L on top of the rows, in seq order:

- a row's image in a chunk is its state at the chunk's read, after L; every change to it after that read is
  after L too, so it is applied and the newest one wins;
- a change after L that a chunk's read already saw is applied again, with the same full row image: a no-op;
- a row deleted (or its key moved) before its chunk was read is not in the chunk, and its delete applies.

So no write during the snapshot is lost or doubled. A change's after-image is the whole row (binlog_row_image
FULL, which preflight requires), which is what makes replaying it idempotent.

Chunking (rows per chunk: CDC_SNAPSHOT_CHUNK_ROWS): a single integer key is cut into equal ranges of values
between its least and greatest; any other key (text, dates, decimals, composite keys) by an index walk, each
boundary the key that many entries after the one before (text keys compare in the column's collation on the
server, as the ranges are read). A keyless table has nothing to cut by or to make a replay idempotent with: it
is one chunk, read by one task inside a consistent snapshot of its own, and committed at the seq of that snapshot's
low watermark only when no change of the table lies between its two watermarks (it is read again otherwise), as
the Arrow engine's snapshot does.

Resumable at chunk granularity: `_state/snapshots/<schema>/<table>.json` holds L, S and the chunk boundaries,
written before any chunk is read; each task, once its chunk's files are complete, records the chunk under
`_state/snapshot_chunks/` (snapshot_records.py). A snapshot killed at any moment and started again for the same
tables reads only the chunks not recorded (files of chunks in flight are never committed: left for a VACUUM).
All chunks of all tables are one Spark job; while it runs, the run process logs progress (chunks read of the
total, rows, rows/s) from the chunks recorded, every PROGRESS_EVERY_SECONDS.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdc_assets.capture.run import CaptureReport, capture
from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.progress import SNAPSHOT, Update
from cdc_assets.core.progress import report as report_progress
from cdc_assets.core.settings import SourceSettings
from cdc_assets.lake.delta import APPLIED_SEQ_KEY
from cdc_assets.lake.files import add_actions, commit_files
from cdc_assets.lake.layout import CHANGES_LOCK, CURRENT, CURRENT_LOCK
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.raw_batches import (
    BatchManifest,
    list_batches,
    read_manifest,
    seq_ceiling_at,
    seq_floor_at,
)
from cdc_assets.lake.state import accept_policies, load_checkpoint
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.rows import key_boundaries, source_row_estimates, source_shapes
from cdc_assets.stages.current.rows import current_configuration, current_schema
from cdc_assets.stages.snapshot.loaded_tables import (
    KEYLESS_POINT_TRIES,
    SnapshotReport,
    keyless_kept_changing,
    keyless_point_seq,
    record_loaded,
    register_loaded,
    resume_quarantined_capture,
)
from cdc_assets.stages.snapshot.records import (
    TableSnapshot,
    chunk_done_key,
    chunks_written,
    forget_record,
    load_record,
    save_record,
)
from cdc_assets.stages.snapshot.spark_tasks import ChunkRead, read_chunks, read_whole_tables, with_seq
from spark_resources.files_job import rewrite_files

PROGRESS_EVERY_SECONDS = 5.0  # how often a snapshot logs its progress while its chunks are read


def low_watermark(conn: pymysql.Connection, server: source.ServerInfo, global_read_lock: bool) -> BinlogPosition:
    """A binlog position every transaction up to which is visible to any read that starts after this returns: the
    low watermark of a consistent point (`source.consistent_snapshot`, no lock; on MySQL it lets the transactions
    binlogged before it finish their engine commit first)."""
    with source.consistent_snapshot(conn, server, global_read_lock, source.MYSQL_SETTLE_SECONDS) as point:
        return point.low


def seq_at(
    settings: SourceSettings, lakehouse: Lakehouse, position: BinlogPosition, exact: bool, log: Any | None, owner: str
) -> tuple[int, CaptureReport | None]:
    """The `_cdc_seq` of the last change at or before `position`, capturing up to it first when the checkpoint
    is before it. A checkpoint already past it (a sync ran) gives a lower bound from the raw batches, unless
    `exact` is asked for."""
    store = lakehouse.store
    checkpoint, report = load_checkpoint(store), None
    while checkpoint is None or checkpoint.position < position:
        report = capture(settings, lakehouse, log=log, until=position, owner=owner)
        reached = load_checkpoint(store)
        if reached == checkpoint:
            raise CdcUserError(f"Capture did not reach the snapshot's position {position}: run the snapshot again.")
        checkpoint = reached
    if checkpoint.position == position:
        return checkpoint.next_seq - 1, report
    if exact:
        raise CdcUserError(
            f"A sync moved the checkpoint past the snapshot's position {position}: run the snapshot again when no "
            "sync is running."
        )
    names = list_batches(store)
    return seq_floor_at(names, lambda n: read_manifest(store, names[n]), position), report


@dataclass
class _Run:
    """One snapshot run on Spark: its settings and where it reports."""

    settings: SourceSettings
    lakehouse: Lakehouse
    spark: Any
    log: Any | None
    owner: str
    report: SnapshotReport
    began: float = field(default_factory=time.monotonic)

    @property
    def policy(self) -> ColumnPolicy:
        """The source's column policy, applied by the tasks (core/column_policy)."""
        return self.settings.column_policy

    def info(self, message: str) -> None:
        if self.log is not None:
            self.log.info(message)


def snapshot_on_spark(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    tables: list[TableRef],
    session: Callable[[], Any],
    log: Any | None,
    owner: str,
) -> SnapshotReport:
    """Snapshot `tables` on Spark, resuming any of them a stopped snapshot left a record of."""
    run = _Run(settings, lakehouse, None, log, owner, SnapshotReport())
    if not tables:
        return run.report
    records, server = _plan(run, tables)
    run.spark = session()
    _read_keyed(run, [r for r in records if r.keyed and not r.committed])
    _read_keyless(run, server, [r for r in records if not r.keyed and not r.committed])
    register_loaded(lakehouse, [r.shape for r in records], max(r.seq for r in records), owner, log)
    for record in records:
        forget_record(lakehouse.store, record.table)
        run.report.rows[str(record.table)] = record.rows
    keyed = [r for r in records if r.keyed] or records
    run.report.position, run.report.seq = str(min(r.low for r in keyed)), min(r.seq for r in keyed)
    run.report.seconds = time.monotonic() - run.began
    return run.report


def _plan(run: _Run, tables: list[TableRef]) -> tuple[list[TableSnapshot], source.ServerInfo]:
    """The tables' records: those a stopped snapshot left (when the table's shape is still the same), new ones
    with their chunks cut at one low watermark for the rest."""
    settings, store = run.settings, run.lakehouse.store
    conn = source.connect(settings.url)
    try:
        server = source.preflight(conn, settings.url, settings.server_id)
        run.lakehouse.check_writable()
        shapes = source_shapes(conn, tables)
        found: dict[TableRef, TableSnapshot] = {}
        for table in tables:
            shape = shapes[table]
            if shape is None:
                raise CdcUserError(f"Table {table} does not exist in the source: check the table name.")
            record = load_record(store, table)
            if record is not None and record.shape != shape:
                run.info(f"{table}: its columns changed since its snapshot stopped; it starts over")
                record = None
            if record is not None and record.policy != run.policy.table_mark(shape):
                run.info(f"{table}: its column policy changed since its snapshot stopped; it starts over")
                record = None
            if record is not None:
                found[table] = record
                run.info(f"{table}: resuming its snapshot, {len(record.done)} of {record.chunks} chunks already read")
        fresh = {t: shape for t in tables if t not in found and (shape := shapes[t]) is not None}
        if not fresh:
            return [found[t] for t in tables], server
        low = low_watermark(conn, server, settings.global_read_lock)
        taken_at = dt.datetime.now(dt.UTC)
        keyed = [t for t, shape in fresh.items() if shape.primary_key]
        estimates = source_row_estimates(conn, keyed)
        chunk_rows = settings.snapshot_chunk_rows
        bounds = {t: key_boundaries(conn, fresh[t], chunk_rows, estimates[t]) for t in keyed}
    except pymysql.err.MySQLError as exc:  # e.g. no SELECT privilege, a table dropped meanwhile
        raise source.describe_error(exc, settings.url) from exc
    finally:
        conn.close()
    accept_policies(store, [str(t) for t in tables])  # loaded under today's column policy
    seq, run.report.capture = seq_at(settings, run.lakehouse, low, False, run.log, run.owner)
    resume_quarantined_capture(run.lakehouse, list(fresh), None, run.owner, run.log)  # its chunks are read after
    for table, shape in fresh.items():
        found[table] = TableSnapshot(shape, low, seq, taken_at, bounds.get(table, []), policy=run.policy.table_mark(shape))
        save_record(store, found[table])
    run.info(f"low watermark {low} (seq {seq}): {sum(found[t].chunks for t in keyed)} chunks to read in {len(keyed)} tables")
    return [found[t] for t in tables], server


def _read_keyed(run: _Run, records: list[TableSnapshot]) -> None:
    """The chunks not yet read, in one Spark job over every table (a task each); each table committed once its
    chunks are all read. While the job runs, progress is logged from the chunks the tasks have recorded."""
    lakehouse = run.lakehouse
    for record in records:
        if len(record.done) == record.chunks:  # read in full before a stop: only its commit was missing
            _commit(run, record, [a for actions in record.done.values() for a in actions])
    pending = [r for r in records if not r.committed]
    todo = [(r, n) for r in pending for n in range(r.chunks) if n not in r.done]
    if not todo:
        return
    chunks = {
        i: ChunkRead(
            lakehouse.table_key(CURRENT, r.table), r.shape, *r.chunk_range(n), r.seq, r.taken_at,
            chunk_done_key(r.table, r.seq, n), run.policy,
        )  # fmt: skip
        for i, (r, n) in enumerate(todo)
    }
    outcome: dict[str, Any] = {}

    def read() -> None:
        try:
            outcome["written"] = read_chunks(run.spark, run.settings.url, lakehouse.file_access(), chunks, lakehouse.current_piece_bytes)
        except BaseException as exc:  # re-raised in the run's thread
            outcome["error"] = exc

    job = threading.Thread(target=read, name="snapshot-chunks", daemon=True)
    job.start()
    while job.is_alive():
        job.join(PROGRESS_EVERY_SECONDS)
        if job.is_alive():
            for record in pending:
                record.done.update(chunks_written(lakehouse.store, record, record.done))
            _progress(run, pending)
    if "error" in outcome:
        raise outcome["error"]
    written = outcome["written"]
    for i, (record, n) in enumerate(todo):
        record.done[n] = [{k: v for k, v in a.items() if k != "chunk"} for a in written if a["chunk"] == i]
    _progress(run, pending)
    for record in pending:
        _commit(run, record, [a for actions in record.done.values() for a in actions])


def _progress(run: _Run, records: list[TableSnapshot]) -> None:
    done = sum(len(r.done) for r in records)
    rows = sum(r.rows for r in records)
    rate = rows / max(time.monotonic() - run.began, 1e-3)
    total = sum(r.chunks for r in records)
    report_progress(Update(SNAPSHOT, done, total, "chunks", rows))
    run.info(f"snapshot: {done} of {total} chunks read, {rows:,} rows, {rate:,.0f} rows/s")


def _read_keyless(run: _Run, server: source.ServerInfo, records: list[TableSnapshot]) -> None:
    """Keyless tables, each read whole by one task in a consistent snapshot of its own, then given the seq of the
    snapshot's low watermark. Their copies are counted, so that seq must be exact: a table is committed only when
    no change of it lies between that seq and its snapshot's high watermark (on MariaDB the two are one position;
    on MySQL the snapshot lies between them), else read again, up to KEYLESS_POINT_TRIES times."""
    if not records:
        return
    lakehouse = run.lakehouse
    store = lakehouse.store
    access = lakehouse.file_access()
    fs = access.filesystem()
    pending = list(records)
    for _ in range(KEYLESS_POINT_TRIES):
        work = {
            i: ChunkRead(lakehouse.table_key(CURRENT, r.table), r.shape, None, None, 0, r.taken_at, policy=run.policy)
            for i, r in enumerate(pending)
        }
        found = read_whole_tables(run.spark, run.settings.url, server, access, work, run.settings.global_read_lock)
        highest = max(point.high for _, point in found.values())
        seq_at(run.settings, lakehouse, highest, False, run.log, run.owner)  # every watermark's batches captured
        names = list_batches(store)
        epoch = load_checkpoint(store).position.epoch

        def manifest_at(index: int, names: list[str] = names) -> BatchManifest:
            return read_manifest(store, names[index])

        moving = []
        for i in sorted(found):
            record, (files, point) = pending[i], found[i]
            low = seq_floor_at(names, manifest_at, point.low.in_epoch(epoch))  # whole batches: a wider window
            high = seq_ceiling_at(names, manifest_at, point.high.in_epoch(epoch))
            seq = keyless_point_seq(lakehouse, record.table, point, low, high)
            if seq is None:
                moving.append(record)
                for f in files:  # read at a point the table was changing: never committed
                    fs.delete_file(access.path(f"{work[i].table_key}/{f['path']}"))
                continue
            record.low, record.seq = point.low, seq
            table_key = work[i].table_key
            rewritten = rewrite_files(
                run.spark, access, table_key, str(record.table), [[f["path"]] for f in files],
                functools.partial(with_seq, seq=record.seq),
            )  # fmt: skip
            record.done = {0: rewritten}
            save_record(store, record)
            _commit(run, record, rewritten)
            for f in files:  # the rows with no seq yet: never committed
                fs.delete_file(access.path(f"{table_key}/{f['path']}"))
            run.info(f"{record.table}: {record.rows:,} rows read whole at {point} (no primary key)")
        pending = moving
        if not pending:
            return
        run.info(f"{', '.join(str(r.table) for r in pending)} changed between the watermarks of their snapshots: reading again")
    raise keyless_kept_changing([r.table for r in pending])


def _commit(run: _Run, record: TableSnapshot, files: list[dict]) -> None:
    """The table's current state replaced by the snapshot's files in one Delta commit that records its seq as
    applied; refused when the table's columns changed while it was read (its record is dropped: run it again)."""
    lakehouse, table = run.lakehouse, record.table
    conn = source.connect(run.settings.url)
    try:
        now = source_shapes(conn, [table])[table]
    finally:
        conn.close()
    if now != record.shape:
        forget_record(lakehouse.store, table)
        raise CdcUserError(
            f"The columns of {table} changed while its snapshot read it: run `cdc-lakehouse snapshot {table}` again."
        )
    lake = run.policy.lake_shape(record.shape)  # the columns the tasks wrote (core/column_policy)
    schema = current_schema(lake)
    wait = lakehouse.lock_wait_seconds
    with (
        lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", run.owner, wait, log=run.log),
        lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", run.owner, wait, log=run.log),
    ):
        existing = lakehouse.open(CURRENT, table)
        commit_files(
            existing,
            lakehouse.table_uri(CURRENT, table),
            lakehouse.storage_options(),
            lakehouse.table_key(CURRENT, table),
            schema,
            add_actions(files),
            [],
            APPLIED_SEQ_KEY,
            record.seq,
            current_configuration(schema),
            overwrite=existing is not None,
        )
        gap = record_loaded(lakehouse, lake, record.seq, record.taken_at, run.log)
        if gap is not None:
            run.report.history_gaps[str(table)] = gap
    record.committed = True
    save_record(lakehouse.store, record)
    run.info(f"{table}: {record.rows:,} rows committed at seq {record.seq}")
