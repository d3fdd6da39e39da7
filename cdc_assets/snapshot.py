"""Snapshots: a table's existing rows loaded into current state, consistently with the binlog position.

The rows are read inside one consistent snapshot whose binlog position P is known. Capture then
runs to exactly P, so the `_cdc_seq` of the last change at or before P is known: the snapshot rows
get that seq and the table's applied watermark is set to it. Every change after P is newer and
applies on top; every change up to P is already contained in the snapshot and is skipped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
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
    sorted_by_key,
)
from cdc_assets.ddl import TableShape
from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import CURRENT, Lakehouse, TableRef
from cdc_assets.locks import lakehouse_lock
from cdc_assets.raw_batch import TableVersion
from cdc_assets.resources import CAPTURE_LOCK, BinlogResource, CaptureReport
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
from cdc_assets.verify import read_source_table, source_table_schema


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
        loaded: dict[TableRef, tuple[TableVersion, pa.Table]] = {}
        with source.consistent_snapshot(conn, server) as position:
            checkpoint = load_checkpoint(lakehouse.store)
            if checkpoint is not None and position < checkpoint.position:
                raise CdcUserError(
                    f"A sync moved the checkpoint past the snapshot's position {position}: run the snapshot again "
                    "when no sync is running."
                )
            taken_at = dt.datetime.now(dt.UTC)
            for table in tables:
                columns, key = source_table_schema(conn, table)
                if not columns:
                    raise CdcUserError(f"Table {table} does not exist in the source: check the table name.")
                loaded[table] = (
                    TableVersion(0, table, tuple(columns), tuple(key)),
                    read_source_table(conn, table, columns),
                )
                if log is not None:
                    log.info(f"{table}: {loaded[table][1].num_rows} rows read at {position}")
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
            report.rows[str(table)] = rows.num_rows
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


def _replace_current(
    lakehouse: Lakehouse, version: TableVersion, rows: pa.Table, seq: int, taken_at: dt.datetime
) -> None:
    """Replace the table's current state with the snapshot rows in one Delta commit."""
    schema = current_schema(version)
    table = rows.append_column("_cdc_seq", pa.array([seq] * rows.num_rows, SEQ_TYPE)).append_column(
        "_cdc_commit_ts", pa.array([taken_at] * rows.num_rows, COMMIT_TS_TYPE)
    )
    if not version.primary_key:  # identical rows of a keyless table are told apart by their ordinal
        table = table.append_column(DUP_COLUMN, number_duplicates(rows, [c.name for c in version.columns]))
    uri = lakehouse.table_uri(CURRENT, version.table)
    options = lakehouse.storage_options()
    exists = open_table(uri, options) is not None
    write_deltalake(
        uri,
        sorted_by_key(table.cast(schema), version.primary_key),
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=options,
        configuration=None if exists else current_configuration(schema),
        commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(seq)}),
    )
