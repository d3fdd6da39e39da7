"""`cdc-lakehouse repair TABLE…`: tables made equal to their source again where they differ, without a snapshot.

A current-state table can drift from its source where the binlog carries no row event (a partition emptied or
exchanged, a foreign-key cascade on a server that does not log them, a commit made to the Delta table by hand).
A snapshot reloads the whole table; a repair rewrites only the rows that differ, recorded like any change:

1. Every row of the tables is compared with the source at one consistent point (`compare_many`: bucketed for a
   large table, keys changed in flight left out on both sides), which names the keys that differ.
2. Under the capture lock, so no capture comes between the next steps: those keys are compared again inside one
   lock-free consistent snapshot, keeping both sides' rows (`compare_to_repair`; its low watermark waits for the
   binlog's writes to be committed first, and in-flight keys are left out again); capture runs to the point's high
   watermark H; and a raw batch of its own is written there, one change per differing key: `repair` with the
   source's row (and the lakehouse's as its before-image), or `repair_delete` for a row the source does not have.
3. The stages then take that batch in as any other (the caller runs them): one commit per table, exactly once by
   the raw batch's rules, and the change log, the history and the sinks see the repair.

Why writing the rows at H is right: a key left in the batch changed neither after the table's applied seq nor in
flight up to H, so its row in the snapshot is its row at H; every change after H comes after the batch. A key
that changed in flight is left out: its own change brings it up to date, or a later repair does. The batch sits
at H in the binlog's order through its position's `step` (core.positions): after the batch that ends at H and
before the next one read from the binlog, its seqs right after H's.

A keyless table's rows have no identity: its whole rows are compared (it must be small enough to be compared
whole, not in buckets), and a row the source holds more often is added that many times, one it holds less often
removed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.capture.run import CaptureReport, capture_session, finished
from cdc_assets.capture.spool import SpoolDirectory
from cdc_assets.core.arrow import hashable
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import encode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import REPAIR, REPAIR_DELETE, UNLOGGED_ROWS
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import row_count
from cdc_assets.lake.raw_batches import RAW_ROWS_SCHEMA, BatchManifest, RawBatch
from cdc_assets.lake.repair_marks import owing_repair, repaired
from cdc_assets.lake.state import Checkpoint, known_tables, load_checkpoint, load_registry, load_schemas
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.foreign_keys import foreign_keys
from cdc_assets.source.rows import source_shapes
from cdc_assets.verification import digests
from cdc_assets.verification.cascades import cascaded_keys, parents_before_changes
from cdc_assets.verification.changed_keys import CheckedState, save_checked
from cdc_assets.verification.consistency import ConsistentComparison, compare_many, compare_to_repair, open_current

Image = list[str | None]
DIGEST_FROM_ROWS = 500_000  # a table this large is first narrowed by key-range digests, not compared row by row


@dataclass
class RepairedTable:
    """What a repair did to one table, or why it left it."""

    table: str
    written: int = 0  # rows written as the source has them (missing or different in the lakehouse)
    removed: int = 0  # rows the source does not have, removed
    left: str | None = None  # why the table was not repaired (equal, in flight, not comparable)
    narrowed: str | None = None  # how its rows to compare were found, when not by comparing every row

    def describe(self) -> str:
        how = f" ({self.narrowed})" if self.narrowed else ""
        if self.left:
            return f"{self.table}: {self.left}{how}"
        return f"{self.table}: {self.written} rows written as the source has them, {self.removed} removed{how}"


@dataclass
class RepairReport:
    tables: list[RepairedTable] = field(default_factory=list)
    position: str | None = None  # where the repair's batch lies in the binlog
    batch: BatchManifest | None = None
    capture: CaptureReport | None = None  # the capture up to that point, and the repair's batch
    seconds: float = 0.0

    @property
    def changes(self) -> int:
        return sum(t.written + t.removed for t in self.tables)


def repair_changes(shape: TableShape, source_rows: pa.Table, lake_rows: pa.Table) -> list[tuple[Image | None, Image | None]]:
    """(before, after) images, as canonical texts, of the changes that make `lake_rows` equal to `source_rows`
    (both in the source's columns, in-flight keys already left out): per differing key the source's row over the
    lakehouse's, or the lakehouse's removed; for a keyless table, copies added or removed."""
    columns = list(shape.columns)
    names = shape.column_names

    def images(rows: pa.Table) -> list[Image]:
        texts = [encode_column(c, rows.column(c.name)) for c in columns]
        return [list(row) for row in zip(*texts, strict=True)] if rows.num_rows else []

    def values(rows: pa.Table) -> list[tuple]:
        return [hashable(v) for v in zip(*(rows.column(n).to_pylist() for n in names), strict=True)] if rows.num_rows else []

    source_images, lake_images = images(source_rows), images(lake_rows)
    source_values, lake_values = values(source_rows), values(lake_rows)
    changes: list[tuple[Image | None, Image | None]] = []
    if shape.primary_key:
        key_at = [names.index(k) for k in shape.primary_key]
        lake_by_key = {tuple(v[i] for i in key_at): n for n, v in enumerate(lake_values)}
        source_keys = set()
        for n, row in enumerate(source_values):
            key = tuple(row[i] for i in key_at)
            source_keys.add(key)
            m = lake_by_key.get(key)
            if m is None or lake_values[m] != row:
                changes.append((None if m is None else lake_images[m], source_images[n]))
        changes += [(lake_images[m], None) for key, m in lake_by_key.items() if key not in source_keys]
        return changes
    have, want = Counter(lake_values), Counter(source_values)
    first_source = {row: n for n, row in reversed(list(enumerate(source_values)))}
    first_lake = {row: n for n, row in reversed(list(enumerate(lake_values)))}
    for row in want.keys() | have.keys():
        more = want[row] - have[row]
        if more > 0:
            changes += [(None, source_images[first_source[row]])] * more
        elif more < 0:
            changes += [(lake_images[first_lake[row]], None)] * -more
    return changes


def _candidates(
    comparisons: list[ConsistentComparison], shapes: dict[TableRef, TableShape], report: RepairReport
) -> dict[TableRef, set[tuple] | None]:
    """Tables to look at again, with their differing keys (None: a keyless table, compared whole)."""
    found: dict[TableRef, set[tuple] | None] = {}
    for c in comparisons:
        name = str(c.table)
        if c.not_compared:
            report.tables.append(RepairedTable(name, left=f"not repaired: not compared ({c.not_compared})"))
        elif c.ok:
            report.tables.append(RepairedTable(name, left="equal to the source: nothing to repair"))
        elif c.diff.schema_problem or c.table not in shapes:
            problem = c.diff.schema_problem or "capture knows no columns of it"
            report.tables.append(
                RepairedTable(name, left=f"not repaired: {problem}; `cdc-lakehouse snapshot {name}` reloads it")
            )
        elif shapes[c.table].primary_key:
            found[c.table] = set(c.diff.missing) | set(c.diff.extra) | set(c.diff.different)
        else:
            found[c.table] = None
    return found


def repair(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    requested: list[str],
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
    journal: CaptureJournal | None = None,
    suspects: dict[TableRef, set[tuple] | None] | None = None,
) -> RepairReport:
    """Write the changes that make `requested` tables equal to their source as one raw batch (see the module's
    docstring); the caller's stages apply it. Tables already equal, or not comparable now, are left as they are.
    `suspects` names, for some of them, the only keys that may differ (None: a keyless table, compared whole): the
    rows a cascade reached. Those are compared at the repair's point only, not every row first."""
    began = time.monotonic()
    report = RepairReport()
    tables = _tables(lakehouse, requested)
    suspects = suspects or {}
    # 1. which keys differ: every row, at a point of its own (the suspects' keys only: at step 2)
    known = load_schemas(lakehouse.store, load_checkpoint(lakehouse.store))
    captured_before = checkpoint_seq(lakehouse)  # every statement up to here is in the source the comparison reads
    unsuspected = [t for t in tables if t not in suspects]
    digested = _digested(settings, lakehouse, unsuspected)  # large tables: the parts whose digests differ
    narrowed = {t: d.narrowed.describe() for t, d in digested.items()}
    rest = [t for t in unsuspected if t not in digested]
    first = compare_many(settings, lakehouse, rest, repairing=True) if rest else []
    candidates = _candidates(first, known, report) | {t: d.narrowed.keys for t, d in digested.items() if d.narrowed.keys}
    candidates |= {t: keys for t, keys in suspects.items() if t in tables}
    equal = [t for t, d in digested.items() if not d.narrowed.keys]
    report.tables += [RepairedTable(str(t), left="equal to the source: nothing to repair", narrowed=narrowed[t]) for t in equal]
    for table in equal:
        repaired(lakehouse.store, str(table), captured_before)
    if not candidates:
        settle_marks(lakehouse, [c for c in first if c.ok], captured_before)
        _found_equal(lakehouse, digested, set(equal), str(load_checkpoint(lakehouse.store).position))
        report.seconds = time.monotonic() - began
        return report
    shapes: dict[TableRef, TableShape] = {}
    changes: dict[TableRef, list[tuple[Image | None, Image | None]]] = {}
    settled: set[TableRef] = set()  # tables compared at the repair's point: equal, or given their changes
    spool = SpoolDirectory()
    policy = settings.column_policy  # the rows compared are the source's as the lakehouse holds them (core/column_policy)
    with capture_session(settings, lakehouse, log, owner, journal=journal) as session:
        # 2. those keys again, rows kept, at one point; capture to it; the repair's batch there
        keyed = {t: keys for t, keys in candidates.items() if keys is not None}
        comparisons, point = compare_to_repair(settings, lakehouse, list(candidates), lambda t, *_: keyed.get(t))
        checkpoint, captured = session.to(point.high)
        if checkpoint.position < point.high:
            raise CdcUserError(
                f"Capture stopped before the repair's point {point.high} (CDC_MAX_BATCH_ROWS or a batch limit): run "
                "`cdc-lakehouse sync`, then the repair again."
            )
        for c in comparisons:
            name = str(c.table)
            if c.not_compared or c.rows is None:
                why = f"not compared ({c.not_compared})" if c.not_compared else "too large to compare whole without a key"
                report.tables.append(RepairedTable(name, left=f"not repaired: {why}; run the repair again later"))
                continue
            shape = load_schemas(lakehouse.store, checkpoint).get(c.table)  # its columns at the point
            shape = policy.lake_shape(shape) if shape is not None else None  # the batch holds policed images only
            if shape is None or shape.column_names != c.rows[0].column_names:
                report.tables.append(RepairedTable(name, left="not repaired: its columns changed; run the repair again"))
                continue
            found = repair_changes(shape, *c.rows)
            settled.add(c.table)
            if not found:
                report.tables.append(RepairedTable(name, left="equal to the source at the repair's point", narrowed=narrowed.get(c.table)))
                continue
            shapes[c.table], changes[c.table] = shape, found
            written = sum(1 for _, after in found if after is not None)
            report.tables.append(RepairedTable(name, written, len(found) - written, narrowed=narrowed.get(c.table)))
        through = checkpoint.next_seq - 1  # every change up to the point
        if changes:
            batch = _repair_batch(checkpoint, shapes, changes, session.server.to_json(), spool)
            registry, schemas = load_registry(lakehouse.store), load_schemas(lakehouse.store, checkpoint)
            checkpoint, _ = session.record(batch, checkpoint, captured, registry, schemas)
            report.batch = captured.batches[-1]
        settle_marks(lakehouse, [c for c in comparisons if not c.not_compared and c.rows is not None], through)
        report.position = str(checkpoint.position)
        _found_equal(lakehouse, digested, settled | set(equal), report.position)
    spool.remove()
    report.capture = finished(captured, settings, lakehouse, began)
    report.tables.sort(key=lambda t: t.table)
    report.seconds = time.monotonic() - began
    return report


@dataclass(frozen=True)
class DigestedTable:
    """A large table narrowed by its digests, and the current state they were taken of."""

    narrowed: digests.Narrowed
    version: int  # the current-state table's Delta version digested
    applied_seq: int  # every change up to this seq is in the rows digested


def _digested(settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef]) -> dict[TableRef, DigestedTable]:
    """For each large table a digest can cover (verification/digests.py), the keys of the parts whose digests
    differ: the only rows that can differ (none: the table is equal)."""
    found: dict[TableRef, DigestedTable] = {}
    opened = {t: open_current(lakehouse, t) for t in tables}
    large = {t: (current, seq) for t, (current, seq) in opened.items() if current is not None and seq is not None and row_count(current) >= DIGEST_FROM_ROWS}
    if not large:
        return found
    conn = source.connect(settings.url)
    try:
        shapes = source_shapes(conn, list(large))
        for table, (current, seq) in large.items():
            shape = shapes.get(table)
            lake_columns = [f.name for f in pa.schema(current.schema().to_arrow()) if not f.name.startswith("_cdc_")]
            if shape is None or not digests.digestible(shape, settings.column_policy) or shape.column_names != lake_columns:
                continue
            narrowed = digests.narrowed(settings.url, conn, lakehouse, table, current, shape)
            found[table] = DigestedTable(narrowed, current.version(), seq)
    finally:
        conn.close()
    return found


def _found_equal(lakehouse: Lakehouse, digested: dict[TableRef, DigestedTable], tables: set[TableRef], position: str) -> None:
    """The digested tables made equal (or found equal) by the repair recorded as found equal at the version
    digested, so the check after the repair's apply compares only the keys changed since (the repair's among them)
    and the row counts, not every row again: outside the parts compared at the repair's point, the version's rows
    were the source's or are brought to them by the changes after its applied seq (verification/digests.py)."""
    for table in tables & digested.keys():
        d = digested[table]
        state = CheckedState(d.version, d.applied_seq, d.narrowed.source_rows, d.narrowed.lake_rows, position)
        save_checked(lakehouse.store, table, state)


def checkpoint_seq(lakehouse: Lakehouse) -> int:
    """The seq of the last change captured (0 before any)."""
    checkpoint = load_checkpoint(lakehouse.store)
    return checkpoint.next_seq - 1 if checkpoint else 0


def settle_marks(lakehouse: Lakehouse, comparisons: list[ConsistentComparison], through: int) -> None:
    """The tables compared (and equal, or given their repair's batch) made up for every statement up to `through`
    that changed their rows without row events (lake/repair_marks)."""
    for c in comparisons:
        repaired(lakehouse.store, str(c.table), through)


def tables_owing_repair(lakehouse: Lakehouse, report: CaptureReport) -> list[str]:
    """The tables a sync repairs right after its capture: those the captured batches say a statement changed
    without row events, and every table already marked as owing one."""
    known = known_tables(lakehouse.store)
    found = {c["table"] for m in report.batches for _, c in m.schema_changes() if c["action"] in UNLOGGED_ROWS}
    return sorted((found & set(known)) | set(owing_repair(lakehouse.store, known)))


def repaired_after(
    settings: SourceSettings, lakehouse: Lakehouse, report: CaptureReport, owner: str, log: Any | None,
    journal: CaptureJournal | None = None,
) -> CaptureReport:  # fmt: skip
    """A sync's capture followed by the repair of the tables that owe one (`tables_owing_repair`) and of the child
    rows its parents' changes cascaded to without row events (`cascaded_by`), so the stages take in the repair's
    batch with the captured ones; the capture's report with the repair's batches added."""
    owing = tables_owing_repair(lakehouse, report)
    suspects = cascaded_by(settings, lakehouse, report.batches)
    if not owing and not suspects:
        return report
    tables = sorted(set(owing) | {str(t) for t in suspects})
    repaired = repair(settings, lakehouse, tables, log=log, owner=owner, journal=journal, suspects=suspects)
    for table in repaired.tables:
        if log is not None:
            log.info(f"repair: {table.describe()}")
    if repaired.capture is None:
        return report
    return dataclasses.replace(report, batches=report.batches + repaired.capture.batches, end=repaired.capture.end)


def cascaded_by(settings: SourceSettings, lakehouse: Lakehouse, batches: list[BatchManifest]) -> dict[TableRef, set[tuple] | None]:
    """The captured child rows (by table, their keys) that the batches' parent deletes and key updates reached
    through cascading foreign keys, on a source that does not log cascades (verification/cascades.py); nothing on
    one that does (its cascaded changes are row events of their own)."""
    if not any(b.rows for b in batches):
        return {}
    conn = source.connect(settings.url)
    try:
        server = source.preflight(conn, settings.url, settings.server_id)
        if server.logs_foreign_key_cascades:
            return {}
        known = set(known_tables(lakehouse.store))
        fks = foreign_keys(conn, known)
    finally:
        conn.close()
    if not fks:
        return {}
    shapes = load_schemas(lakehouse.store, load_checkpoint(lakehouse.store))
    return cascaded_keys(lakehouse, fks, parents_before_changes(lakehouse, batches, fks), shapes)


def _tables(lakehouse: Lakehouse, requested: list[str]) -> list[TableRef]:
    if not requested:
        raise CdcUserError("Name the tables to repair: `cdc-lakehouse repair schema.table …`.")
    tables = [TableRef.parse(t) for t in requested]
    known = set(known_tables(lakehouse.store))
    unknown = [str(t) for t in tables if str(t) not in known]
    if unknown:
        raise CdcUserError(
            f"The lakehouse has no table {', '.join(unknown)}: repair makes a table the pipeline keeps equal to its "
            "source again; `cdc-lakehouse snapshot` loads one it does not keep yet."
        )
    return tables


def _repair_batch(
    checkpoint: Checkpoint,
    shapes: dict[TableRef, TableShape],
    changes: dict[TableRef, list[tuple[Image | None, Image | None]]],
    server: dict[str, Any],
    spool: SpoolDirectory,
) -> RawBatch:
    """The repair's changes as one raw batch at the checkpoint, seqs from its next seq (the batch's rows are the
    source's as of the point, timed when the batch is made)."""
    now = dt.datetime.now(dt.UTC)
    rows: dict[str, list[Any]] = {f.name: [] for f in RAW_ROWS_SCHEMA}
    seq = checkpoint.next_seq
    versions = {table: n for n, table in enumerate(sorted(changes, key=str))}
    for table in sorted(changes, key=str):
        for before, after in changes[table]:
            for name, value in (
                ("seq", seq), ("schema", table.schema), ("table", table.table), ("table_version", versions[table]),
                ("op", REPAIR if after is not None else REPAIR_DELETE), ("gtid", None), ("commit_ts", now),
                ("before", before), ("after", after),
            ):  # fmt: skip
                rows[name].append(value)
            seq += 1
    path = spool.path / "repair.parquet"
    pq.write_table(pa.table(rows, schema=RAW_ROWS_SCHEMA), path)
    return RawBatch(
        start=checkpoint.position,
        end=checkpoint.position.next_step(),
        data_path=path,
        row_count=seq - checkpoint.next_seq,
        shapes={n: shapes[table] for table, n in versions.items()},
        statements=[],
        events=0,
        transactions=1,
        first_seq=checkpoint.next_seq,
        next_seq=seq,
        start_gtid=checkpoint.gtid,
        end_gtid=checkpoint.gtid,
        first_commit_ts=int(now.timestamp()),
        last_commit_ts=int(now.timestamp()),
        server=server,
    )
