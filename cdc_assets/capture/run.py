"""Capture: the binlog read as a replica, from the checkpoint to the binlog end (or a given position), into
raw batches; the checkpoint moves past each batch only once it is durable. A plain function over plain
settings: the Dagster asset, the snapshot and tests call the same thing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdc_assets.capture import failover
from cdc_assets.capture.event_loop import CaptureOptions, capture_batches
from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.capture.spool import remove_orphaned_spools
from cdc_assets.core import failpoints, progress
from cdc_assets.core.arrow import release_unused_memory
from cdc_assets.core.column_policy import PolicyPlan, plan_policy_changes
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import FIRST_SEQ, BinlogPosition
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape, apply_schemas
from cdc_assets.lake.delta import HISTORY_SEQ_KEY, max_seq
from cdc_assets.lake.layout import ARCHIVE, CAPTURE_LOCK, HISTORY, RAW
from cdc_assets.lake.locks import Lease, lakehouse_lock
from cdc_assets.lake.quarantine import CAPTURE, Quarantine, left_out_of_capture, quarantine
from cdc_assets.lake.raw_batches import (
    BatchManifest,
    RawBatch,
    archive_earlier_batches,
    archived_chain_starts,
    archived_last_seq,
    batch_exists,
    read_manifest,
    write_batch,
)
from cdc_assets.lake.state import (
    Checkpoint,
    EarlierLakehouse,
    PolicyRecord,
    load_checkpoint,
    load_policy_record,
    load_registry,
    load_schemas,
    register_batch,
    save_checkpoint,
    save_earlier,
    save_policy_record,
    save_registry,
    save_schemas,
)
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source


@dataclass
class CaptureReport:
    """What one capture did: for materialization metadata and the CLI."""

    batches: list[BatchManifest] = field(default_factory=list)
    # batches earlier runs captured and never recorded, taken over from their journals (capture/journal.py)
    taken_over: dict[str, str] = field(default_factory=dict)  # batch name -> the run that captured it
    start: BinlogPosition | None = None
    end: BinlogPosition | None = None
    target: BinlogPosition | None = None
    lag_bytes: int = 0
    lag_seconds: float = 0.0
    seconds: float = 0.0
    # what a column policy added to captured columns leaves behind, one sentence a table (core/column_policy): said
    # on the terminal by the command, not only in the run's log
    policy_warnings: list[str] = field(default_factory=list)

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


def preflight(settings: SourceSettings) -> source.ServerInfo:
    """Check the server is set up for CDC and the user may read its binlog; raises CdcUserError with the fix."""
    conn = source.connect(settings.url)
    try:
        return source.preflight(conn, settings.url, settings.server_id)
    except pymysql.err.MySQLError as exc:  # the connection lost mid-way (a server restarting): one sentence, not a trace
        raise source.describe_error(exc, settings.url) from exc
    finally:
        conn.close()


def capture(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    log: Any | None = None,
    until: BinlogPosition | None = None,
    owner: str = "cdc-lakehouse",
    tidy: bool = True,
    journal: CaptureJournal | None = None,
) -> CaptureReport:
    """Write raw batches from the checkpoint to the binlog end as of now (or to `until`, a transaction
    boundary such as a snapshot's position), advancing the checkpoint.

    Holds the lakehouse's capture lock throughout: two captures never run at once, whoever starts
    them, because both would write batches from the same checkpoint. `tidy=False` skips the look for what a
    killed capture left behind (the continuous mode looks once at its start, not every cycle). With a `journal`,
    each batch is listed in it before the checkpoint passes it, and the journals of recorders that are gone are
    taken over first (their batches in `report.taken_over`): for a run that records its batches after the capture,
    maybe in another process (capture/journal.py).
    """
    began = time.monotonic()
    with capture_session(settings, lakehouse, log, owner, tidy, journal) as session:
        _, report = session.to(until)
    return finished(report, settings, lakehouse, began)


def finished(report: CaptureReport, settings: SourceSettings, lakehouse: Lakehouse, began: float) -> CaptureReport:
    """The report with the lag after the capture and its time."""
    lag = capture_lag(settings, lakehouse, time.time())  # a fresh connection: a long capture may outlive the first
    report.lag_bytes, report.lag_seconds = lag.lag_bytes, lag.seconds
    report.seconds = time.monotonic() - began
    return report


@contextmanager
def capture_session(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
    tidy: bool = True,
    journal: CaptureJournal | None = None,
) -> Iterator[_Capture]:
    """The source checked and the lakehouse's capture lock held, for one capture, or for work that must see no
    capture between its steps (a repair: a point, a capture up to it, a batch written there)."""
    url = settings.url
    options = CaptureOptions(
        settings.table_filter,
        settings.server_id,
        settings.max_batch_rows,
        left_out_of_capture(lakehouse.store),
        settings.column_policy,
    )
    conn = source.connect(url)
    try:
        server = source.preflight(conn, url, settings.server_id)
        lakehouse.check_writable()
        with lakehouse.faults_are_user_errors(), lakehouse_lock(
            lakehouse, CAPTURE_LOCK, "capture", owner, lakehouse.lock_wait_seconds, log=log
        ) as lease:
            yield _Capture(settings, options, server, lakehouse, lease, conn, log, tidy, journal)
    except pymysql.err.MySQLError as exc:  # from the replication stream, e.g. a purged binlog
        raise source.describe_error(exc, url) from exc
    finally:
        conn.close()


@dataclass(frozen=True)
class CaptureLag:
    """How far capture is behind the source's binlog."""

    checkpoint: Checkpoint | None
    binlog_end: BinlogPosition
    lag_bytes: int
    seconds: float  # see Checkpoint.lag_seconds; unbounded while nothing was ever captured of a non-empty binlog


def capture_lag(settings: SourceSettings, lakehouse: Lakehouse, now: float) -> CaptureLag:
    checkpoint = load_checkpoint(lakehouse.store)
    conn = source.connect(settings.url)
    try:
        end = source.binlog_end(conn)
        position = checkpoint.position if checkpoint else source.oldest_position(conn)
        lag_bytes = source.lag_bytes(conn, position)
    finally:
        conn.close()
    if checkpoint is None:
        seconds = 0.0 if not lag_bytes else float("inf")
    else:
        seconds = checkpoint.lag_seconds(lag_bytes, now)
    return CaptureLag(checkpoint, end, lag_bytes, seconds)


@dataclass
class _Capture:
    """One capture under the lock: the batches it writes and the state it moves."""

    settings: SourceSettings
    options: CaptureOptions
    server: source.ServerInfo
    lakehouse: Lakehouse
    lease: Lease
    conn: pymysql.Connection
    log: Any | None
    tidy: bool = True
    journal: CaptureJournal | None = None
    binlog_files: list[tuple[str, int]] | None = None  # the server's binlog files at the start, when progress is shown
    rows: int = 0  # row changes captured so far
    policy_record: PolicyRecord | None = None  # the column policy each table was captured under (`_state/`)
    policy_plan: PolicyPlan | None = None  # what today's policy changes, until a batch has recorded it

    def to(self, until: BinlogPosition | None) -> tuple[Checkpoint, CaptureReport]:
        """Batches from the checkpoint to `until` (default: the binlog end now)."""
        lakehouse, log, lease, conn = self.lakehouse, self.log, self.lease, self.conn
        began_at = time.time()
        # What a capture killed earlier left behind: its local spool, its unfinished uploads under raw/.
        orphans = len(remove_orphaned_spools()) + lakehouse.store.remove_partial_writes(RAW) if self.tidy else 0
        if orphans and log is not None:
            log.info(f"removed {orphans} spool directories and partial uploads left by a capture that was stopped")
        checkpoint = load_checkpoint(lakehouse.store)
        if checkpoint is not None and failover.moved(checkpoint, self.server):
            old = checkpoint
            checkpoint = failover.rebased(old, self.settings.url, self.server, self.options.server_id)
            lease.check()
            save_checkpoint(lakehouse.store, checkpoint)
            if log is not None:
                log.info(
                    f"the source is now server {self.server.server_id} (was {old.server_id}): continuing from GTID "
                    f"{old.gtid}, at {checkpoint.position} in its binlog"
                )
        start = checkpoint.position if checkpoint else source.oldest_position(conn)
        source.check_available(conn, start)
        first_seq = FIRST_SEQ
        if checkpoint is None:  # a new lakehouse: raw batches found here are an earlier one's (lake/raw_batches)
            lease.check()
            archived = archive_earlier_batches(lakehouse.store, start.batch_name(), began_at)
            if archived and log is not None:
                log.info(
                    f"the {len(archived)} raw batches of an earlier lakehouse (before {start}, where this one "
                    f"starts) were moved from {RAW}/ to {ARCHIVE}/"
                )
            first_seq = self._begin_over_earlier(start)
        epoch = checkpoint.position.epoch if checkpoint else 0
        target = (until or source.binlog_end(conn)).in_epoch(epoch)  # the server's position, in capture's epoch
        report = CaptureReport(start=start, target=target)
        if progress.listened():  # the binlog's files, to tell how far through it each batch is
            self.binlog_files = source.binlog_files(conn)
            self._report_progress(report, start)
        if self.journal is not None:
            taken = self.journal.open(lakehouse.store, checkpoint.last_batch if checkpoint else None)
            report.taken_over = {name: self.journal.batches[name] for name in taken}
            if taken and log is not None:
                log.info(f"{len(taken)} raw batches captured by runs that ended before recording them: recorded here")
        checkpoint = checkpoint or Checkpoint(start, next_seq=first_seq, server_id=self.server.server_id)
        registry = load_registry(lakehouse.store)
        schemas = load_schemas(lakehouse.store, checkpoint)
        report.policy_warnings = self._plan_policies(schemas)
        while checkpoint.position < target:
            checkpoint, finished = self._capture_from(checkpoint, target, report, registry, schemas)
            if finished or self._enough(report):
                break
        if until is None and not checkpoint.position < target:  # all committed before this capture began is in
            lease.check()
            checkpoint = dataclasses.replace(checkpoint, reached_at=began_at)
            save_checkpoint(lakehouse.store, checkpoint)
        report.end = checkpoint.position
        if self.binlog_files is not None:
            self._report_progress(report, checkpoint.position)
        return checkpoint, report

    def _plan_policies(self, schemas: dict[TableRef, TableShape]) -> list[str]:
        """Today's column policy against the one `_state/` records for each table (core/column_policy): a removal
        refused with one sentence, an addition said once a capture, and the shape changes they make put first in
        the next batch. Rules that change no shape are recorded at once."""
        store, policy = self.lakehouse.store, self.options.policy
        record = load_policy_record(store)
        plan = plan_policy_changes(
            policy, schemas, record.tables, record.key_fingerprint, record.found, record.accepted
        )
        settled = record.accepted - {str(change.table) for change, _ in plan.alters}
        rewrite = {t: {**record.rewrite.get(t, {}), **cols} for t, cols in plan.added.items()}
        if plan.rerecorded or settled or (not record.found and schemas) or rewrite:
            record.tables.update(plan.rerecorded)
            record.rewrite.update(rewrite)  # comparisons allow for their clear values until the rewrite
            record.accepted -= settled
            if not record.found:  # tables captured before column policies: every column was clear
                for table, shape in schemas.items():
                    record.tables.setdefault(str(table), dict.fromkeys(shape.column_names, "clear"))
            record.key_fingerprint = record.key_fingerprint or policy.fingerprint()
            self.lease.check()
            save_policy_record(store, record)
        for sentence in plan.sentences:
            if self.log is not None:
                self.log.warning(sentence)
        self.policy_record, self.policy_plan = record, plan
        return list(plan.sentences)

    def _begin_over_earlier(self, start: BinlogPosition) -> int:
        """The first `_cdc_seq` of a lakehouse begun at `start` with no checkpoint: FIRST_SEQ, or, over an earlier
        lakehouse's remains (its history tables, its archived raw batches), past every seq they hold, recorded in
        `_state/earlier.json` (lake/state.EarlierLakehouse). Those remains do not change until the first batch is
        written, so a capture killed before it begins again at the same seq."""
        lakehouse = self.lakehouse
        store = lakehouse.store
        if start.batch_name() in archived_chain_starts(store):
            # the binlog read again from where an earlier chain began (its state lost, not its binlog): the same
            # changes get the same seqs, which every layer already holds, so each is taken in once
            return FIRST_SEQ
        last = archived_last_seq(store)
        for table in lakehouse.tables(HISTORY):
            last = max(last, max_seq(lakehouse.open(HISTORY, table), HISTORY_SEQ_KEY) or 0)
        if not last:
            return FIRST_SEQ
        earlier = EarlierLakehouse(last, str(start))
        self.lease.check()
        save_earlier(store, earlier)
        if self.log is not None:
            self.log.info(
                f"the lakehouse begins again at {start} over an earlier one's history and raw batches: its seqs go on "
                f"from {earlier.first_seq}, past the earlier one's last ({last})"
            )
        return earlier.first_seq

    def _report_progress(self, report: CaptureReport, reached: BinlogPosition) -> None:
        assert report.start is not None and report.target is not None and self.binlog_files is not None
        files = self.binlog_files
        done = progress.binlog_bytes(files, report.start, reached)
        total = progress.binlog_bytes(files, report.start, report.target)
        progress.report(progress.Update(progress.CAPTURE, done, total, "bytes", self.rows, len(report.batches)))

    def _enough(self, report: CaptureReport) -> bool:
        return self.settings.max_batches is not None and len(report.batches) >= self.settings.max_batches

    def _capture_from(
        self,
        checkpoint: Checkpoint,
        target: BinlogPosition,
        report: CaptureReport,
        registry: dict[str, dict[str, str | None]],
        schemas: dict[TableRef, TableShape],
    ) -> tuple[Checkpoint, bool]:
        """Capture from `checkpoint`; returns the new checkpoint and whether the target was reached.

        A batch already visible under the same name (a crash hit between its manifest and the
        checkpoint) is kept as it is, never rewritten: the checkpoint moves to its end and reading
        starts again from there.
        """
        for batch in capture_batches(
            self.settings.url,
            self.server,
            checkpoint.position,
            checkpoint.gtid,
            checkpoint.next_seq,
            target,
            self.options,
            schemas,
            recorded_rules=dict(self.policy_record.tables) if self.policy_record is not None else None,
            policy_changes=self.policy_plan.alters if self.policy_plan is not None else None,
        ):
            checkpoint, adopted = self.record(batch, checkpoint, report, registry, schemas)
            if adopted or self._enough(report):
                return checkpoint, False
        return checkpoint, True

    def record(
        self,
        batch: RawBatch,
        checkpoint: Checkpoint,
        report: CaptureReport,
        registry: dict[str, dict[str, str | None]],
        schemas: dict[TableRef, TableShape],
    ) -> tuple[Checkpoint, bool]:
        """Make one batch durable and move the checkpoint past it; the new checkpoint, and whether the batch was
        there already under its name with another end (adopted: reading starts again from its end)."""
        store, lease, log = self.lakehouse.store, self.lease, self.log
        if batch_exists(store, batch.name):
            manifest = read_manifest(store, batch.name)
            adopted = manifest.end != batch.end
        else:
            manifest = write_batch(store, batch)
            adopted = False
            failpoints.hit("capture.manifest_written")
        if self.journal is not None:  # listed before the checkpoint passes it: a recorder that dies leaves it here
            self.journal.add(store, manifest.name)
        # The registry learns of the batch's tables before the checkpoint passes it, so no later stage
        # can miss a table whose changes are captured.
        if register_batch(registry, manifest.name, manifest.tables()):
            save_registry(store, registry)
            failpoints.hit("capture.registry_saved")
        # Tables whose events could not be decoded are quarantined before the checkpoint passes the batch: from
        # here on capture leaves them out, and their own checks say so (lake/quarantine).
        for table, why in manifest.quarantined().items():
            held = quarantine(store, Quarantine(table, CAPTURE, why["cause"], why["fix"], why.get("first_seq"), why.get("position")))
            if log is not None:
                log.error(held.sentence())
        # Table shapes as of the batch's end (also for an adopted batch: from its own manifest).
        schemas_name = checkpoint.schemas
        if manifest.raw.get("schemas"):  # the source's shapes where a column policy made the lakehouse's differ
            updated = apply_schemas(schemas, manifest.raw.get("source_schemas") or manifest.raw["schemas"])
            schemas.clear()
            schemas.update(updated)
            schemas_name = manifest.name
            save_schemas(store, schemas_name, schemas)
            failpoints.hit("capture.schemas_written")
        self._record_policies(manifest)
        release_unused_memory()  # the batch's rows were in memory to be written
        lease.check()
        checkpoint = Checkpoint(
            position=manifest.end,
            gtid=manifest.end_gtid,
            last_batch=manifest.name,
            last_commit_ts=manifest.last_commit_ts or checkpoint.last_commit_ts,
            next_seq=manifest.next_seq,
            reached_at=checkpoint.reached_at,
            schemas=schemas_name,
            server_id=self.server.server_id,
        )
        save_checkpoint(store, checkpoint)
        failpoints.hit("capture.checkpoint_saved")
        report.batches.append(manifest)
        self.rows += manifest.rows
        if self.binlog_files is not None:
            self._report_progress(report, manifest.end)
        if log is not None:
            log.info(
                f"raw batch {manifest.name}: {manifest.rows} row changes, {manifest.transactions} transactions, "
                f"{manifest.start} -> {manifest.end}"
            )
        return checkpoint, adopted

    def _record_policies(self, manifest: BatchManifest) -> None:
        """The column policies a batch captured tables under, recorded before the checkpoint passes it."""
        policies = manifest.raw.get("policies")
        record = self.policy_record
        if record is None:
            return
        if self.policy_plan is not None:
            self.policy_plan = None  # its alters are in this batch (or were, in the batch adopted as it is)
        if not policies:
            return
        record.tables.update(policies)
        record.accepted -= set(policies)
        record.key_fingerprint = self.options.policy.fingerprint() or record.key_fingerprint
        self.lease.check()
        save_policy_record(self.lakehouse.store, record)
