"""Snapshots: a table's existing rows loaded into current state, consistently with the binlog position.

The rows are read inside one consistent snapshot, without a lock on the source, in primary-key order and a chunk
at a time into a local Parquet spool (memory does not grow with the table). Every transaction up to the snapshot's
low watermark P is in it (on MariaDB P is its exact position; see `source.consistent_snapshot`). Capture then runs
to exactly P, so the `_cdc_seq` of the last change at or before P is known: the snapshot rows get that seq and the
table's applied watermark is set to it. Every change after P applies on top. On MySQL some changes after P, up to
the high watermark, may be in the snapshot already: applied again with their full row image they give the same
row, so a keyed table is right either way. A keyless table's copies are counted, so it needs an exact point: it
is loaded only when no change of it lies between the two watermarks, else read again at a new point.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pymysql

from cdc_assets.capture import failover
from cdc_assets.capture.run import capture
from cdc_assets.capture.spool import SpoolDirectory
from cdc_assets.core import failpoints
from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import arrow_schema
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.progress import SNAPSHOT, Update
from cdc_assets.core.progress import report as report_progress
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.layout import (
    CHANGES_LOCK,
    CURRENT,
    CURRENT_LOCK,
    SNAPSHOT_LOCK,
)
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.state import (
    accept_policies,
    load_checkpoint,
)
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.rows import read_source_chunks, source_row_estimates, source_shapes
from cdc_assets.stages.changes.rows import COMMIT_TS_TYPE, SEQ_TYPE
from cdc_assets.stages.current.apply import replace_current, replace_current_in_pieces
from cdc_assets.stages.current.rows import DUP_COLUMN, current_schema, number_duplicates
from cdc_assets.stages.snapshot.loaded_tables import (
    KEYLESS_POINT_TRIES,
    SnapshotReport,
    keyless_kept_changing,
    keyless_point_seq,
    record_loaded,
    register_loaded,
    resume_quarantined_capture,
)
from spark_resources.engine import TransformsFor, spark_phase

SNAPSHOT_CHUNK_ROWS = 100_000  # rows read from the source and held in memory at once
SNAPSHOT_WRITE_ROWS = 2_000_000  # rows handed to delta-rs at once: several files' worth


def _tables(conn: Any, settings: SourceSettings, requested: list[str]) -> list[TableRef]:
    table_filter = settings.table_filter
    if not requested:
        return source.source_tables(conn, table_filter)
    tables = [TableRef.parse(t) for t in requested]
    for table in tables:
        if not table_filter.matches(table.schema, table.table):
            raise CdcUserError(
                f"{table} is excluded by CDC_TABLES / CDC_EXCLUDE_TABLES, so its changes would never follow the "
                "snapshot: include it there first."
            )
    return tables


def take_snapshot(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    requested: list[str],
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
    transforms: TransformsFor | None = None,
) -> SnapshotReport:
    """Load the tables' existing rows into current state, consistently with the binlog. On the Arrow engine
    (the default below CDC_SPARK_MIN_ROWS rows) in this process inside one consistent snapshot; on Spark by
    parallel tasks a key range at a time, without a lock on the source (stages/snapshot/on_spark.py)."""
    wait = lakehouse.lock_wait_seconds
    with lakehouse.faults_are_user_errors(), lakehouse_lock(lakehouse, SNAPSHOT_LOCK, "snapshot", owner, wait, log=log):
        if transforms is not None:
            engine = transforms(_rows_estimate(settings, requested))
            if engine.session is not None:
                from cdc_assets.stages.snapshot.on_spark import snapshot_on_spark  # pyspark loads only for Spark

                tables = _requested_tables(settings, requested)
                with spark_phase(engine.session, "snapshot", log) as session:
                    return snapshot_on_spark(settings, lakehouse, tables, session, log, owner)
        return _take_snapshot(settings, lakehouse, requested, log, owner)


def _requested_tables(settings: SourceSettings, requested: list[str]) -> list[TableRef]:
    conn = source.connect(settings.url)
    try:
        return _tables(conn, settings, requested)
    finally:
        conn.close()


def _rows_estimate(settings: SourceSettings, requested: list[str]) -> int:
    """The server's estimate of the tables' rows: what decides the engine."""
    conn = source.connect(settings.url)
    try:
        return sum(source_row_estimates(conn, _tables(conn, settings, requested)).values())
    finally:
        conn.close()


@dataclass
class _Read:
    """The tables read at one consistent point into the spool, and that point."""

    point: source.SnapshotPoint
    taken_at: dt.datetime
    loaded: dict[TableRef, tuple[TableShape, Path]] = field(default_factory=dict)  # the lakehouse's shapes
    sources: dict[TableRef, TableShape] = field(default_factory=dict)  # the source's (capture's own state)


def _read_tables(
    settings: SourceSettings, lakehouse: Lakehouse, requested: list[str], spool: SpoolDirectory, report: SnapshotReport,
    log: Any | None,
) -> _Read:  # fmt: skip
    url = settings.url
    conn = source.connect(url)
    try:
        server = source.preflight(conn, url, settings.server_id)
        lakehouse.check_writable()
        tables = _tables(conn, settings, requested)
        settle = source.MYSQL_SETTLE_SECONDS
        with source.consistent_snapshot(conn, server, settings.global_read_lock, settle) as point:
            checkpoint = load_checkpoint(lakehouse.store)
            failover.require_same_server(checkpoint, server, "take the snapshot")
            if checkpoint is not None and point.low < checkpoint.position:
                raise CdcUserError(
                    f"A sync moved the checkpoint past the snapshot's position {point.low}: run the snapshot again "
                    "when no sync is running."
                )
            read = _Read(point, dt.datetime.now(dt.UTC))
            shapes = source_shapes(conn, tables)
            policy = settings.column_policy
            for n, table in enumerate(tables):
                shape = shapes[table]
                if shape is None:
                    raise CdcUserError(f"Table {table} does not exist in the source: check the table name.")
                # the lakehouse's shape: the column policy applied (core/column_policy)
                read.loaded[table] = (policy.lake_shape(shape), spool.path / f"{n}.parquet")
                read.sources[table] = shape
                report.rows[str(table)] = _spool_rows(conn, shape, read.loaded[table][1], policy)
                report_progress(Update(SNAPSHOT, n + 1, len(tables), "tables", sum(report.rows.values())))
                if log is not None:
                    log.info(f"{table}: {report.rows[str(table)]} rows read at {point}")
            return read
    except pymysql.err.MySQLError as exc:  # e.g. no SELECT privilege, a table dropped meanwhile
        raise source.describe_error(exc, url) from exc
    finally:
        conn.close()


def _capture_to(
    settings: SourceSettings, lakehouse: Lakehouse, position: BinlogPosition, report: SnapshotReport, log: Any, owner: str
) -> int:
    """Capture up to exactly `position` (its batches added to the report's); the seq of the last change at or
    before it."""
    captured = capture(settings, lakehouse, log=log, until=position, owner=owner)
    if report.capture is None:
        report.capture = captured
    else:
        report.capture.batches += captured.batches
        report.capture.taken_over |= captured.taken_over
        report.capture.end, report.capture.target = captured.end, captured.target
        report.capture.seconds += captured.seconds
    checkpoint = load_checkpoint(lakehouse.store)
    if checkpoint is None or checkpoint.position != position:
        raise CdcUserError(
            f"Capture did not stop at the snapshot's position {position}: run the snapshot again when no sync is running."
        )
    return checkpoint.next_seq - 1


def _take_snapshot(
    settings: SourceSettings, lakehouse: Lakehouse, requested: list[str], log: Any | None, owner: str
) -> SnapshotReport:
    began = time.monotonic()
    report = SnapshotReport()
    for attempt in range(1, KEYLESS_POINT_TRIES + 1):
        spool = SpoolDirectory()
        read = _read_tables(settings, lakehouse, requested, spool, report, log)
        accept_policies(lakehouse.store, [str(t) for t in read.loaded])  # loaded under today's column policy
        seq = _capture_to(settings, lakehouse, read.point.low, report, log, owner)
        resume_quarantined_capture(lakehouse, list(read.loaded), read.point.low, owner, log)
        seqs = dict.fromkeys(read.loaded, seq)  # a keyed table at the low watermark; a keyless one where it is exact
        keyless = {table for table, (shape, _) in read.loaded.items() if not shape.primary_key}
        if read.point.exact or not keyless:
            break
        high_seq = _capture_to(settings, lakehouse, read.point.high, report, log, owner)
        for table in keyless:
            seqs[table] = keyless_point_seq(lakehouse, table, read.point, seq, high_seq)
        moving = {t for t in keyless if seqs[t] is None}
        if not moving:
            break
        spool.remove()
        if attempt == KEYLESS_POINT_TRIES:
            raise keyless_kept_changing(sorted(moving, key=str))
        if log is not None:
            log.info(f"{', '.join(sorted(map(str, moving)))} changed between the watermarks {read.point}: reading again")
    failpoints.hit("snapshot.captured")
    wait = lakehouse.lock_wait_seconds
    with (
        lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", owner, wait, log=log),
        lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", owner, wait, log=log),
    ):
        for table, (shape, rows) in read.loaded.items():
            _load_current(lakehouse, shape, rows, seqs[table], read.taken_at)
            failpoints.hit("snapshot.overwritten")
            gap = record_loaded(lakehouse, shape, seqs[table], read.taken_at, log)
            if gap is not None:
                report.history_gaps[str(table)] = gap
    spool.remove()
    register_loaded(lakehouse, list(read.sources.values()), seq, owner, log)
    report.position, report.seq = str(read.point.low), seq
    report.seconds = time.monotonic() - began
    return report


def _spool_rows(conn: pymysql.Connection, shape: TableShape, path: Path, policy: ColumnPolicy) -> int:
    """The table's rows into a local Parquet file, a chunk at a time and in primary-key order (so the current
    state is written with each file holding a narrow key range), through the column policy; returns how many."""
    columns = list(shape.columns)
    rows = 0
    with pq.ParquetWriter(path, arrow_schema(list(policy.lake_shape(shape).columns))) as writer:
        for part in read_source_chunks(conn, shape.table, columns, SNAPSHOT_CHUNK_ROWS, shape.primary_key):
            writer.write_table(policy.lake_rows(shape, part))
            rows += part.num_rows
            failpoints.hit("snapshot.reading")
    return rows


def _regrouped(parquet: pq.ParquetFile) -> Iterator[pa.Table]:
    """The spool's rows in parts of SNAPSHOT_WRITE_ROWS, each one Arrow batch.

    delta-rs deals the batches of a stream out to its writers in turn, so files made from small batches would
    each hold rows from all over the key range. From batches of several files' worth, each file holds one
    stretch of keys (a file may straddle the end of one batch and the start of the next a writer gets): a merge
    of a narrow key range rewrites a few files, however large the table."""
    parts: list[pa.Table] = []
    rows = 0
    for group in range(parquet.num_row_groups):
        parts.append(parquet.read_row_group(group))
        rows += parts[-1].num_rows
        if rows >= SNAPSHOT_WRITE_ROWS:
            yield pa.concat_tables(parts).combine_chunks()
            parts, rows = [], 0
    if parts:
        yield pa.concat_tables(parts).combine_chunks()


def _load_current(lakehouse: Lakehouse, shape: TableShape, rows: Path, seq: int, taken_at: dt.datetime) -> None:
    """Replace the table's current state with the snapshot rows in one Delta commit, streamed from the spool."""
    schema = current_schema(shape)
    parquet = pq.ParquetFile(rows)

    def with_metadata(part: pa.Table) -> pa.Table:
        part = part.append_column("_cdc_seq", pa.array([seq] * part.num_rows, SEQ_TYPE)).append_column(
            "_cdc_commit_ts", pa.array([taken_at] * part.num_rows, COMMIT_TS_TYPE)
        )
        if not shape.primary_key:  # identical rows of a keyless table are told apart by their ordinal
            part = part.append_column(DUP_COLUMN, number_duplicates(part, [c.name for c in shape.columns]))
        return part.cast(schema)

    existing = lakehouse.open(CURRENT, shape.table)
    if shape.primary_key:  # in key order already: streamed, SNAPSHOT_WRITE_ROWS in memory at a time, as pieces
        parts = (with_metadata(part) for part in _regrouped(parquet))
        replace_current_in_pieces(lakehouse, shape.table, parts, schema, seq, existing)
    else:  # duplicates are numbered over the whole table: it is read at once
        replace_current(lakehouse, shape.table, with_metadata(parquet.read()), seq, existing)
