"""What a snapshot records once it has loaded tables, whatever engine read them: its report, the tables'
progress in both stages, and capture's registry and shapes, so changes after the snapshot apply on top; and how
often either engine reads a keyless table again for an exact point."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from cdc_assets.capture.run import CaptureReport
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.layout import CAPTURE_LOCK, CHANGES_STAGE, CURRENT_STAGE
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.quarantine import CAPTURE, lift_after_snapshot, quarantined_tables, resume_capture_at
from cdc_assets.lake.raw_batches import list_batches, read_manifest, read_rows
from cdc_assets.lake.state import (
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
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source.server import SnapshotPoint
from cdc_assets.stages.history.run import history_gap, seed_history

# Consistent points a snapshot takes for keyless tables before giving up on those that changed between the
# watermarks of each (docs/architecture.md, "Consistent points without a lock").
KEYLESS_POINT_TRIES = 5


def keyless_point_seq(
    lakehouse: Lakehouse, table: TableRef, point: SnapshotPoint, low_seq: int, high_seq: int
) -> int | None:
    """The seq a keyless table read at `point` holds exactly (its copies are counted, so nothing may be replayed over
    them), or None: its changes between the watermarks may or may not be in the snapshot. With `low_seq` and
    `high_seq` the seqs of the point's watermarks (every change up to each captured):

    - no change of the table between them: its rows are as at either, `low_seq`;
    - on MySQL with GTIDs: its changes between them fall in two runs, those committed before the snapshot began
      (seen) and then those committed after it (not seen), by the executed GTID sets read around its start
      (`point.committed_before/after`): the seq of the last seen one;
    - else None (a change that may or may not be seen, or a TRUNCATE or DDL of it): read it again at another point.
    """
    if point.exact:
        return low_seq
    changes = changes_between(lakehouse, table, low_seq, high_seq)
    return seq_seen_at(changes, low_seq, point.committed_before, point.committed_after)


def seq_seen_at(
    changes: list[tuple[int, str | None]], low_seq: int, committed_before: str | None, committed_after: str | None
) -> int | None:
    """The seq of the last of `changes` (seq, GTID) a snapshot sees, when the ones it sees come first: a change whose
    GTID is in `committed_before` is seen, one in neither set is not; None when one may or may not be (only in
    `committed_after`, or no GTID known), or when a seen one follows one not seen."""
    if not changes:
        return low_seq
    if committed_before is None or committed_after is None:
        return None
    seen, by_start = GtidState.parse(committed_before), GtidState.parse(committed_after)
    seq, unseen = low_seq, False
    for change_seq, gtid in sorted(changes, key=lambda c: c[0]):
        if not gtid or (by_start.holds(gtid) and not seen.holds(gtid)):
            return None  # seen or not: nobody can tell
        if seen.holds(gtid):
            if unseen:
                return None  # a seen change after one not seen: not one point in the binlog's order
            seq = change_seq
        else:
            unseen = True
    return seq


def changes_between(lakehouse: Lakehouse, table: TableRef, after: int, through: int) -> list[tuple[int, str | None]]:
    """The seqs and GTIDs of the table's captured changes with a seq in (`after`, `through`], TRUNCATEs and DDL of
    it too (their GTIDs unknown here: None)."""
    store = lakehouse.store
    found: list[str | None] = []
    for name in reversed(list_batches(store)):
        manifest = read_manifest(store, name)
        if manifest.next_seq - 1 <= after:
            break
        if manifest.first_seq > through or str(table) not in manifest.tables():
            continue
        statements = [s for s in manifest.raw.get("statements", []) if after < int(s["seq"]) <= through]
        found += [
            (int(s["seq"]), None)
            for s in statements
            if str(table) in (s.get("table"), *(c.get("table") for c in s.get("changes", [])))
        ]
        rows = read_rows(store, manifest)
        mine = rows.filter(
            pc.and_(
                pc.and_(pc.equal(rows.column("schema"), table.schema), pc.equal(rows.column("table"), table.table)),
                pc.and_(pc.greater(rows.column("seq"), after), pc.less_equal(rows.column("seq"), through)),
            )
        )
        found += list(zip(mine.column("seq").to_pylist(), mine.column("gtid").to_pylist(), strict=True))
    return found


def keyless_kept_changing(tables: list[TableRef]) -> CdcUserError:
    names = ", ".join(sorted(map(str, tables)))
    return CdcUserError(
        f"Keyless table(s) {names} changed while every one of {KEYLESS_POINT_TRIES} consistent points was taken, and a "
        "table without a primary key can only be loaded at an exact point: run the snapshot when they change less, "
        "give them a primary key, or set CDC_GLOBAL_READ_LOCK=on (MySQL, needs RELOAD)."
    )


@dataclass
class SnapshotReport:
    position: str = ""
    seq: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    capture: CaptureReport | None = None
    seconds: float = 0.0
    # per table, what its history cannot know: the changes in the gap before a lakehouse begun again (history_gap)
    history_gaps: dict[str, str] = field(default_factory=dict)


def record_loaded(
    lakehouse: Lakehouse, shape: TableShape, seq: int, taken_at: dt.datetime, log: Any | None = None
) -> str | None:
    """Progress after a table's current state was loaded at `seq` (the snapshot began reading at `taken_at`;
    the caller holds both stages' locks): the change-log stage knows its shape, the table's history (when
    CDC_HISTORY_TABLES selects it) is seeded with the loaded rows, then the current-state stage learns that a
    snapshot loaded it. A crash before that last step leaves the snapshot unrecorded: run again, it loads and
    seeds again, and the seed finds the versions it committed already (stages.history.run.seed_history). Returns the
    sentence of what the history cannot know, when the seed closed a gap (stages.history.run.history_gap)."""
    store, table = lakehouse.store, str(shape.table)
    progress = load_progress(store, CHANGES_STAGE, table)
    if progress.shape is None:  # no change log yet: the current state needs the columns and key
        save_progress(store, CHANGES_STAGE, table, TableProgress(progress.batch, shape))
    gap = history_gap(lakehouse, shape.table, seq)
    outcome = seed_history(lakehouse, shape, seq, taken_at, log)
    if log is not None and outcome != "not kept":
        log.info(f"{table}: history {outcome}")
    if gap is not None and log is not None:
        log.warning(gap)
    applied = load_progress(store, CURRENT_STAGE, table)
    save_progress(store, CURRENT_STAGE, table, TableProgress(applied.batch, None, None, present=True, snapshot_seq=seq))
    lifted = lift_after_snapshot(store, table)
    if lifted is not None and log is not None:
        log.info(f"{table}: out of quarantine, loaded at _cdc_seq {seq} (was: {lifted.cause})")
    return gap


def resume_quarantined_capture(
    lakehouse: Lakehouse, tables: list[TableRef], at: BinlogPosition | None, owner: str, log: Any | None
) -> None:
    """Capture reads the snapshot's tables quarantined at capture again from the checkpoint, which must be `at` (the
    point the rows are read at; None: any, the rows are read after it), under the capture lock so that no capture
    passes it meanwhile (lake/quarantine)."""
    store = lakehouse.store
    names = {str(t) for t in tables}
    if not any(q.resume_at is None for t, q in quarantined_tables(store, (CAPTURE,)).items() if t in names):
        return
    with lakehouse_lock(lakehouse, CAPTURE_LOCK, "capture", owner, lakehouse.lock_wait_seconds, log=log):
        checkpoint = load_checkpoint(store)
        if checkpoint is None or (at is not None and checkpoint.position != at):
            raise CdcUserError(
                f"A sync moved the checkpoint past the snapshot's position {at}: run the snapshot again when no sync "
                "is running."
            )
        taken = resume_capture_at(store, names, str(checkpoint.position))
        if taken and log is not None:
            log.info(f"capture reads {', '.join(taken)} again from {checkpoint.position}")


def register_loaded(lakehouse: Lakehouse, shapes: list[TableShape], seq: int, owner: str, log: Any | None) -> None:
    """Capture learns of the loaded tables (the registry, under the capture lock) and of their shapes: the source's,
    which capture applies DDL to (a column policy's lakehouse shapes are made from them as each batch is cut)."""
    store = lakehouse.store
    with lakehouse_lock(lakehouse, CAPTURE_LOCK, "capture", owner, lakehouse.lock_wait_seconds, log=log):
        registry = load_registry(store)
        for shape in shapes:
            registry.setdefault(str(shape.table), {"first_batch": None, "last_batch": None})
        save_registry(store, registry)
        _remember_shapes(lakehouse, shapes, seq)


def _remember_shapes(lakehouse: Lakehouse, shapes: list[TableShape], seq: int) -> None:
    """Capture learns the shapes of snapshot tables it has not seen a row of, so that a DDL on such a
    table before its first row change still reshapes its current state."""
    store = lakehouse.store
    checkpoint = load_checkpoint(store)
    if checkpoint is None:
        return
    schemas = load_schemas(store, checkpoint)
    unknown = [v for v in shapes if v.table not in schemas]
    if not unknown:
        return
    for shape in unknown:
        schemas[shape.table] = shape
    name = f"{checkpoint.last_batch or 'start'}-snapshot-{seq}"
    save_schemas(store, name, schemas)
    save_checkpoint(store, dataclasses.replace(checkpoint, schemas=name))
