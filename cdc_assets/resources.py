"""Dagster resources: the lakehouse location and the binlog reader that owns the checkpoint."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import pymysql
from dagster import ConfigurableResource
from pydantic import Field

from cdc_assets import source
from cdc_assets.capture import CaptureOptions, capture_batches
from cdc_assets.ddl import TableShape, apply_schemas
from cdc_assets.lakehouse import Lakehouse, TableRef
from cdc_assets.locks import Lease, lakehouse_lock
from cdc_assets.positions import BinlogPosition
from cdc_assets.raw_batch import BatchManifest, read_manifest, write_batch
from cdc_assets.settings import (
    DEFAULT_LAKEHOUSE,
    DEFAULT_LOCK_WAIT_SECONDS,
    DEFAULT_MAX_BATCH_ROWS,
    DEFAULT_SERVER_ID,
    MySQLUrl,
    TableFilter,
    resolve_mysql_url,
)
from cdc_assets.stages import CAPTURE_LOCK
from cdc_assets.state import (
    Checkpoint,
    load_checkpoint,
    load_registry,
    load_schemas,
    register_batch,
    save_checkpoint,
    save_registry,
    save_schemas,
)


class LakehouseResource(ConfigurableResource):
    """Where raw batches, state and Delta tables live (`CDC_LAKEHOUSE`: a directory or s3://bucket/prefix)."""

    location: str = Field(default=DEFAULT_LAKEHOUSE, description="Local directory or s3://bucket/prefix.")
    lock_wait_seconds: float = Field(
        default=DEFAULT_LOCK_WAIT_SECONDS,
        description="How long a stage waits for another run of the same stage to finish (CDC_LOCK_WAIT_SECONDS).",
    )

    def get(self) -> Lakehouse:
        if self.location.startswith("s3://"):
            from dagster_aws.s3 import S3Resource

            return Lakehouse(self.location, S3Resource().get_client(), self.lock_wait_seconds)
        return Lakehouse(self.location, lock_wait_seconds=self.lock_wait_seconds)


@dataclass
class CaptureReport:
    """What one capture did: for materialization metadata and the CLI."""

    batches: list[BatchManifest] = field(default_factory=list)
    start: BinlogPosition | None = None
    end: BinlogPosition | None = None
    target: BinlogPosition | None = None
    lag_bytes: int = 0
    lag_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def events(self) -> int:
        return sum(b.events for b in self.batches)

    @property
    def bytes(self) -> int:
        return sum(b.data_bytes for b in self.batches)

    @property
    def tables(self) -> list[str]:
        return sorted({t for b in self.batches for t in b.tables()})


class BinlogResource(ConfigurableResource):
    """Reads the source's binlog as a replica and keeps the checkpoint under `_state/` in the lakehouse."""

    mysql_url: str | None = Field(
        default=None, description="mysql://user:password@host:port (CDC_MYSQL_URL); default: the local demo server."
    )
    server_id: int = Field(default=DEFAULT_SERVER_ID, description="Replica server id used to read (CDC_SERVER_ID).")
    tables: str | None = Field(default=None, description="Comma-separated schema.table globs to include.")
    exclude_tables: str | None = Field(default=None, description="Comma-separated schema.table globs to exclude.")
    max_batch_rows: int = Field(
        default=DEFAULT_MAX_BATCH_ROWS,
        description="A batch ends at the first transaction boundary after this many row changes.",
    )
    max_batches: int | None = Field(default=None, description="Stop after this many batches (None: to the end).")

    def url(self) -> MySQLUrl:
        return resolve_mysql_url(self.mysql_url)

    def table_filter(self) -> TableFilter:
        return TableFilter.parse(self.tables, self.exclude_tables)

    def preflight(self) -> source.ServerInfo:
        """Check configuration and server set-up; raises CdcUserError with the fix."""
        url = self.url()
        self.table_filter()
        conn = source.connect(url)
        try:
            return source.preflight(conn, url, self.server_id)
        finally:
            conn.close()

    def capture(
        self,
        lakehouse: Lakehouse,
        log: Any | None = None,
        until: BinlogPosition | None = None,
        owner: str = "cdc-lakehouse",
    ) -> CaptureReport:
        """Write raw batches from the checkpoint to the binlog end as of now (or to `until`, a transaction
        boundary such as a snapshot's position), advancing the checkpoint.

        Holds the lakehouse's capture lock throughout: two captures never run at once, whoever starts
        them, because both would write batches from the same checkpoint.
        """
        began = time.monotonic()
        url = self.url()
        options = CaptureOptions(self.table_filter(), self.server_id, self.max_batch_rows)
        conn = source.connect(url)
        try:
            server = source.preflight(conn, url, self.server_id)
            lakehouse.check_writable()
            with lakehouse_lock(
                lakehouse, CAPTURE_LOCK, "capture", owner, lakehouse.lock_wait_seconds, log=log
            ) as lease:
                checkpoint, report = self._capture_locked(conn, url, server, lakehouse, until, options, lease, log)
        except pymysql.err.MySQLError as exc:  # from the replication stream, e.g. a purged binlog
            raise source.describe_error(exc, url) from exc
        finally:
            conn.close()
        lag_conn = source.connect(url)  # a fresh one: a long capture may have outlived the first
        try:
            report.lag_bytes = source.lag_bytes(lag_conn, checkpoint.position)
        finally:
            lag_conn.close()
        report.lag_seconds = checkpoint.lag_seconds(report.lag_bytes, time.time())
        report.seconds = time.monotonic() - began
        return report

    def _capture_locked(
        self,
        conn: pymysql.Connection,
        url: MySQLUrl,
        server: source.ServerInfo,
        lakehouse: Lakehouse,
        until: BinlogPosition | None,
        options: CaptureOptions,
        lease: Lease,
        log: Any | None,
    ) -> tuple[Checkpoint, CaptureReport]:
        began_at = time.time()
        checkpoint = load_checkpoint(lakehouse.store)
        start = checkpoint.position if checkpoint else source.oldest_position(conn)
        source.check_available(conn, start)
        target = until or source.binlog_end(conn)
        report = CaptureReport(start=start, target=target)
        checkpoint = checkpoint or Checkpoint(start)
        registry = load_registry(lakehouse.store)
        schemas = load_schemas(lakehouse.store, checkpoint)
        while checkpoint.position < target:
            checkpoint, finished = self._capture_from(
                url, server, checkpoint, target, options, lakehouse, report, registry, schemas, lease, log
            )
            if finished or self._enough(report):
                break
        if until is None and not checkpoint.position < target:  # all committed before this capture began is in
            lease.check()
            checkpoint = dataclasses.replace(checkpoint, reached_at=began_at)
            save_checkpoint(lakehouse.store, checkpoint)
        report.end = checkpoint.position
        return checkpoint, report

    def _enough(self, report: CaptureReport) -> bool:
        return self.max_batches is not None and len(report.batches) >= self.max_batches

    def _capture_from(
        self,
        url: MySQLUrl,
        server: source.ServerInfo,
        checkpoint: Checkpoint,
        target: BinlogPosition,
        options: CaptureOptions,
        lakehouse: Lakehouse,
        report: CaptureReport,
        registry: dict[str, dict[str, str | None]],
        schemas: dict[TableRef, TableShape],
        lease: Lease,
        log: Any | None,
    ) -> tuple[Checkpoint, bool]:
        """Capture from `checkpoint`; returns the new checkpoint and whether the target was reached.

        A batch already visible under the same name (a crash hit between its manifest and the
        checkpoint) is kept as it is, never rewritten: the checkpoint moves to its end and reading
        starts again from there.
        """
        store = lakehouse.store
        for batch in capture_batches(
            url, server, checkpoint.position, checkpoint.gtid, checkpoint.next_seq, target, options, schemas
        ):
            if store.exists(f"raw/{batch.name}/manifest.json"):
                manifest = read_manifest(store, batch.name)
                adopted = manifest.end != batch.end
            else:
                manifest = write_batch(store, batch)
                adopted = False
            # The registry learns of the batch's tables before the checkpoint passes it, so no later stage
            # can miss a table whose changes are captured.
            if register_batch(registry, manifest.name, manifest.tables()):
                save_registry(store, registry)
            # Table shapes as of the batch's end (also for an adopted batch: from its own manifest).
            schemas_name = checkpoint.schemas
            if manifest.raw.get("schemas"):
                updated = apply_schemas(schemas, manifest.raw["schemas"])
                schemas.clear()
                schemas.update(updated)
                schemas_name = manifest.name
                save_schemas(store, schemas_name, schemas)
            lease.check()
            checkpoint = Checkpoint(
                position=manifest.end,
                gtid=manifest.end_gtid,
                last_batch=manifest.name,
                last_commit_ts=manifest.last_commit_ts or checkpoint.last_commit_ts,
                next_seq=manifest.next_seq,
                reached_at=checkpoint.reached_at,
                schemas=schemas_name,
            )
            save_checkpoint(store, checkpoint)
            report.batches.append(manifest)
            if log is not None:
                log.info(
                    f"raw batch {manifest.name}: {manifest.rows} row changes, {manifest.transactions} transactions, "
                    f"{manifest.start} -> {manifest.end}"
                )
            if adopted or self._enough(report):
                return checkpoint, False
        return checkpoint, True
