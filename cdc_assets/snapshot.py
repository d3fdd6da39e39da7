"""Snapshots: a table's existing rows loaded into current state, consistently with the binlog position.

The rows are read inside one consistent snapshot whose binlog position P is known, in primary-key order and a
chunk at a time into a local Parquet spool (memory does not grow with the table). Capture then
runs to exactly P, so the `_cdc_seq` of the last change at or before P is known: the snapshot rows
get that seq and the table's applied watermark is set to it. Every change after P is newer and
applies on top; every change up to P is already contained in the snapshot and is skipped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pymysql
from deltalake import CommitProperties, write_deltalake

from cdc_assets import source
from cdc_assets.change_log import COMMIT_TS_TYPE, SEQ_TYPE, open_table
from cdc_assets.current_state import (
    APPLIED_SEQ_KEY,
    DUP_COLUMN,
    current_configuration,
    current_schema,
    number_duplicates,
)
from cdc_assets.ddl import TableShape
from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import CURRENT, Lakehouse, TableRef
from cdc_assets.locks import lakehouse_lock
from cdc_assets.mysql_types import arrow_schema
from cdc_assets.raw_batch import TableVersion
from cdc_assets.resources import CAPTURE_LOCK, BinlogResource, CaptureReport
from cdc_assets.spool import SpoolDirectory
from cdc_assets.stages import CHANGES_LOCK, CHANGES_STAGE, CURRENT_LOCK
from cdc_assets.state import (
    TableProgress,
    load_checkpoint,
    load_progress,
    load_registry,
    load_schemas,
    save_checkpoint,
    save_progress,
    save_registry,
    save_schemas,
)
from cdc_assets.verify import read_source_chunks, source_table_schemas

SNAPSHOT_CHUNK_ROWS = 100_000  # rows read from the source and held in memory at once
SNAPSHOT_WRITE_ROWS = 2_000_000  # rows handed to delta-rs at once: several files' worth


@dataclass
class SnapshotReport:
    position: str = ""
    seq: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    capture: CaptureReport | None = None
    seconds: float = 0.0


def _tables(conn: Any, binlog: BinlogResource, requested: list[str]) -> list[TableRef]:
    table_filter = binlog.table_filter()
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
    binlog: BinlogResource,
    lakehouse: Lakehouse,
    requested: list[str],
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
) -> SnapshotReport:
    began = time.monotonic()
    url = binlog.url()
    conn = source.connect(url)
    report = SnapshotReport()
    try:
        server = source.preflight(conn, url, binlog.server_id)
        lakehouse.check_writable()
        tables = _tables(conn, binlog, requested)
        loaded: dict[TableRef, tuple[TableVersion, Path]] = {}
        spool = SpoolDirectory()
        with source.consistent_snapshot(conn, server) as position:
            checkpoint = load_checkpoint(lakehouse.store)
            if checkpoint is not None and position < checkpoint.position:
                raise CdcUserError(
                    f"A sync moved the checkpoint past the snapshot's position {position}: run the snapshot again "
                    "when no sync is running."
                )
            taken_at = dt.datetime.now(dt.UTC)
            schemas = source_table_schemas(conn, tables)
            for n, table in enumerate(tables):
                columns, key = schemas[table]
                if not columns:
                    raise CdcUserError(f"Table {table} does not exist in the source: check the table name.")
                version = TableVersion(0, table, tuple(columns), tuple(key))
                loaded[table] = (version, spool.path / f"{n}.parquet")
                report.rows[str(table)] = _spool_rows(conn, version, loaded[table][1])
                if log is not None:
                    log.info(f"{table}: {report.rows[str(table)]} rows read at {position}")
    except pymysql.err.MySQLError as exc:  # e.g. no SELECT privilege, a table dropped meanwhile
        raise source.describe_error(exc, url) from exc
    finally:
        conn.close()

    report.capture = binlog.capture(lakehouse, log=log, until=position, owner=owner)
    checkpoint = load_checkpoint(lakehouse.store)
    if checkpoint is None or checkpoint.position != position:
        raise CdcUserError(
            f"Capture did not stop at the snapshot's position {position}: run the snapshot again when no sync is running."
        )
    seq = checkpoint.next_seq - 1
    store = lakehouse.store
    wait = lakehouse.lock_wait_seconds
    with (
        lakehouse_lock(lakehouse, CHANGES_LOCK, "change-log update", owner, wait, log=log),
        lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", owner, wait, log=log),
    ):
        for table, (version, rows) in loaded.items():
            progress = load_progress(store, CHANGES_STAGE, str(table))
            if progress.version is None:  # no change log yet: the current state needs the columns and key
                save_progress(store, CHANGES_STAGE, str(table), TableProgress(progress.batch, version.to_json()))
            _replace_current(lakehouse, version, rows, seq, taken_at)
    spool.remove()
    with lakehouse_lock(lakehouse, CAPTURE_LOCK, "capture", owner, wait, log=log):
        registry = load_registry(store)
        for table in loaded:
            registry.setdefault(str(table), {"first_batch": None, "last_batch": None})
        save_registry(store, registry)
        _remember_shapes(lakehouse, [version for version, _ in loaded.values()], seq)
    report.position, report.seq = str(position), seq
    report.seconds = time.monotonic() - began
    return report


def _remember_shapes(lakehouse: Lakehouse, versions: list[TableVersion], seq: int) -> None:
    """Capture learns the shapes of snapshot tables it has not seen a row of, so that a DDL on such a
    table before its first row change still reshapes its current state."""
    store = lakehouse.store
    checkpoint = load_checkpoint(store)
    if checkpoint is None:
        return
    schemas = load_schemas(store, checkpoint)
    unknown = [v for v in versions if v.table not in schemas]
    if not unknown:
        return
    for version in unknown:
        schemas[version.table] = TableShape(version.table, version.columns, version.primary_key)
    name = f"{checkpoint.last_batch or 'start'}-snapshot-{seq}"
    save_schemas(store, name, schemas)
    save_checkpoint(store, dataclasses.replace(checkpoint, schemas=name))


def _spool_rows(conn: pymysql.Connection, version: TableVersion, path: Path) -> int:
    """The table's rows into a local Parquet file, a chunk at a time and in primary-key order (so the current
    state is written with each file holding a narrow key range); returns how many."""
    columns = list(version.columns)
    rows = 0
    with pq.ParquetWriter(path, arrow_schema(columns)) as writer:
        for part in read_source_chunks(conn, version.table, columns, SNAPSHOT_CHUNK_ROWS, version.primary_key):
            writer.write_table(part)
            rows += part.num_rows
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


def _replace_current(lakehouse: Lakehouse, version: TableVersion, rows: Path, seq: int, taken_at: dt.datetime) -> None:
    """Replace the table's current state with the snapshot rows in one Delta commit, streamed from the spool."""
    schema = current_schema(version)
    parquet = pq.ParquetFile(rows)

    def with_metadata(part: pa.Table) -> pa.Table:
        part = part.append_column("_cdc_seq", pa.array([seq] * part.num_rows, SEQ_TYPE)).append_column(
            "_cdc_commit_ts", pa.array([taken_at] * part.num_rows, COMMIT_TS_TYPE)
        )
        if not version.primary_key:  # identical rows of a keyless table are told apart by their ordinal
            part = part.append_column(DUP_COLUMN, number_duplicates(part, [c.name for c in version.columns]))
        return part.cast(schema)

    if version.primary_key:  # in key order already: streamed, SNAPSHOT_WRITE_ROWS in memory at a time
        batches = (b for part in _regrouped(parquet) for b in with_metadata(part).to_batches())
        data: pa.Table | pa.RecordBatchReader = pa.RecordBatchReader.from_batches(schema, batches)
    else:  # duplicates are numbered over the whole table: it is read at once
        data = with_metadata(parquet.read())
    uri = lakehouse.table_uri(CURRENT, version.table)
    options = lakehouse.storage_options()
    exists = open_table(uri, options) is not None
    write_deltalake(
        uri,
        data,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=options,
        configuration=None if exists else current_configuration(schema),
        commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(seq)}),
    )
