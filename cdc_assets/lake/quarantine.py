"""Quarantine: one odd table never stops the others (docs/lakehouse.md: Quarantine).

A table whose changes cannot be decoded (capture) or applied (the change-log or current-state stage) is quarantined:
`_state/quarantine/<schema>/<table>.json` records the stage, the cause, the fix and the first seq the table has not
taken in, every run says so in one sentence, the table's own asset checks fail with it, `status` lists it, and every
other table goes on (the checkpoint moves). What the table owes is kept, so it catches up exactly once after the fix:

- **changes, current**: its raw changes stay in the raw batches and its change log; its progress (change logs) and
  applied seq (current state) do not move past them. Each run tries the table again from there, so once the cause is
  gone (an upgrade, a setting) the same run takes it in and lifts the quarantine; `snapshot TABLE` lifts it too.
- **capture**: a row event that cannot be decoded has no change to keep; from that transaction on capture leaves the
  table out, as an excluded table, and the fix names `snapshot TABLE`, which captures up to its point with the table
  still left out, then lifts the quarantine and loads the table there: every change after the point is captured again.

Capture and both stages call this one module; `docs/architecture.md` ("Quarantine") has the exactly-once argument.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace
from typing import Any

from cdc_assets.core.errors import CdcUserError, TableUserError, storage_fault
from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import MissingObject, ObjectStore

QUARANTINE_STATE = f"{STATE}/quarantine"
CAPTURE, CHANGES, CURRENT = "capture", "changes", "current"
_STAGE_WORDS = {
    CAPTURE: "its changes cannot be decoded from the binlog",
    CHANGES: "its changes cannot be added to its change log",
    CURRENT: "its changes cannot be applied to its current state",
}


@dataclass(frozen=True)
class Quarantine:
    """Why one table is held back, where, and what lifts it."""

    table: str
    stage: str  # CAPTURE, CHANGES or CURRENT
    cause: str
    fix: str
    first_seq: int | None = None  # the first change the table has not taken in (capture: the first one left out)
    position: str | None = None  # capture: the binlog position of the event it was left out from
    since: float = 0.0  # wall time it was first quarantined
    resume_at: str | None = None  # capture: the snapshot's position from which capture reads the table again

    def sentence(self) -> str:
        """The one sentence a run, a check and `status` say."""
        start = f" from _cdc_seq {self.first_seq}" if self.first_seq is not None else ""
        return (
            f"{self.table} is quarantined{start}: {_STAGE_WORDS[self.stage]} ({self.cause}). Fix: {self.fix}. "
            "Every other table goes on."
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Quarantine:
        return Quarantine(**{k: data.get(k) for k in Quarantine.__dataclass_fields__ if k in data})


def left_out_of_capture(store: ObjectStore) -> frozenset[str]:
    """The tables capture leaves out: quarantined at capture, and no snapshot has taken them back yet."""
    return frozenset(t for t, q in quarantined_tables(store, (CAPTURE,)).items() if q.resume_at is None)


def _key(table: str) -> str:
    return f"{QUARANTINE_STATE}/{TableRef.parse(table).path}.json"


class RunWide(Exception):
    """An error that is the run's whichever table met it (e.g. a stage left to another engine): never quarantined."""


class TablesFailed(Exception):
    """Work over many tables that finished for every table but these, each with its own error."""

    def __init__(self, errors: dict[str, BaseException]) -> None:
        super().__init__("; ".join(f"{t}: {describe(e)}" for t, e in sorted(errors.items())))
        self.errors = errors


_RUN_WIDE_TEXTS = ("Py4JNetworkError", "SparkContext was shut down", "Connection refused", "Answer from Java side is empty")


def of_the_table(exc: BaseException) -> bool:
    """Whether an error is the table's own (its data or its shape), not the run's: a full disk, an object store or
    source that does not answer, a lost lock or any other sentence the run ends with stop every table alike and are
    never a reason to quarantine one."""
    if isinstance(exc, TableUserError):
        return True
    if not isinstance(exc, Exception) or isinstance(exc, CdcUserError | RunWide | OSError | MemoryError):
        return False
    if storage_fault(exc) or any(text in f"{type(exc).__name__}: {exc}" for text in _RUN_WIDE_TEXTS):
        return False
    return type(exc).__module__.split(".")[0] not in ("pymysql", "botocore", "boto3")


def describe(exc: BaseException) -> str:
    """An error as the cause part of the sentence: its type and first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def default_fix(table: str, stage: str) -> str:
    """What lifts a quarantine when the cause itself names no fix."""
    if stage == CAPTURE:
        return (
            f"report the cause, upgrade cdc-lakehouse (or correct the source setting it names), then run "
            f"`cdc-lakehouse snapshot {table}`"
        )
    return (
        "report the cause and upgrade cdc-lakehouse: the next sync applies the kept changes, each once; or run "
        f"`cdc-lakehouse snapshot {table}` to load it afresh"
    )


def quarantine(store: ObjectStore, entry: Quarantine) -> Quarantine:
    """Record `entry`; a table already quarantined at the same stage keeps its first seq, position and time (the
    earliest change it owes), with the newest cause."""
    known = load_quarantine(store, entry.table)
    if known is not None and known.stage == entry.stage:
        entry = replace(entry, first_seq=known.first_seq, position=known.position, since=known.since)
    elif not entry.since:
        entry = replace(entry, since=time.time())
    if entry != known:
        store.put(_key(entry.table), json.dumps(entry.to_json(), indent=1, sort_keys=True).encode())
    return entry


def lift(store: ObjectStore, table: str, stages: tuple[str, ...] = (CAPTURE, CHANGES, CURRENT)) -> Quarantine | None:
    """Lift the table's quarantine if it is at one of `stages`; returns what was lifted."""
    known = load_quarantine(store, table)
    if known is None or known.stage not in stages:
        return None
    store.delete(_key(table))
    return known


def load_quarantine(store: ObjectStore, table: str) -> Quarantine | None:
    try:
        raw = store.get(_key(table))
    except MissingObject:
        return None
    try:
        return Quarantine.from_json(json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise CdcUserError(
            f"The quarantine record {_key(table)} in the lakehouse is corrupt: delete it (the next sync tries the "
            "table again and quarantines it anew if it still fails)."
        ) from exc


def quarantined_tables(store: ObjectStore, stages: tuple[str, ...] = (CAPTURE, CHANGES, CURRENT)) -> dict[str, Quarantine]:
    """Every quarantined table at one of `stages`, by name."""
    found = {}
    for key in store.list_keys(QUARANTINE_STATE + "/"):
        if not key.endswith(".json"):
            continue
        try:
            entry = Quarantine.from_json(json.loads(store.get(key)))
        except (MissingObject, ValueError, TypeError):
            continue
        if entry.stage in stages:
            found[entry.table] = entry
    return found


def run_isolated(
    tables: Collection[str],
    held: Collection[str],
    work: Callable[[set[str]], None],
    log: Any | None = None,
) -> dict[str, BaseException]:
    """`work` over `tables` so that one table's own error stops no other: the tables not `held` in quarantine
    together first (the usual case: one pass); when that fails for a table's own reason, and for each held table
    (tried again every run: the cause may be gone), each table alone. Returns the tables that still failed, with
    their errors; any other error (the run's) is raised. `work` must be idempotent per table, as every stage's work
    is (progress, watermarks and applied seqs: a table it already took in takes in nothing twice). A run together
    that fails and splits is told to `log` (its warning): when every table then succeeds alone, the cause was the
    run's together (a fault of the batched path, which splitting would hide while it costs a run a table)."""
    wanted = set(tables)
    together = wanted - set(held)
    alone = sorted(wanted & set(held))
    failed: dict[str, BaseException] = {}
    if together:
        try:
            work(together)
        except TablesFailed as exc:  # the work went on past them: the others are done
            run_wide = [e for e in exc.errors.values() if not of_the_table(e)]
            if run_wide:
                raise run_wide[0] from exc
            failed.update(exc.errors)
        except Exception as exc:
            if not of_the_table(exc):
                raise
            if len(together) == 1:
                failed[next(iter(together))] = exc
            else:
                if log is not None:
                    log.warning(f"{len(together)} tables failed as one run ({describe(exc)}); each is taken alone now")
                alone = sorted(together) + alone
    for table in alone:
        try:
            work({table})
        except TablesFailed as exc:
            run_wide = [e for e in exc.errors.values() if not of_the_table(e)]
            if run_wide:
                raise run_wide[0] from exc
            failed.update(exc.errors)
        except Exception as exc:
            if not of_the_table(exc):
                raise
            failed[table] = exc
    return failed


def settle(
    store: ObjectStore,
    stage: str,
    tried: Collection[str],
    failed: dict[str, BaseException],
    taken_in_up_to: Callable[[str], int | None],
    log: Any | None = None,
) -> dict[str, Quarantine]:
    """After a stage's run: quarantine each table that failed (its first seq: the one after `taken_in_up_to`, the
    last change it holds) and lift this stage's quarantine of every other table tried, which has now caught up.
    Logs one sentence per table quarantined or released; returns the quarantined ones."""
    held = {}
    for table in sorted(failed):
        up_to = taken_in_up_to(table)
        entry = Quarantine(
            table,
            stage,
            describe(failed[table]),
            default_fix(table, stage),
            None if up_to is None else up_to + 1,
        )
        held[table] = quarantine(store, entry)
        if log is not None:
            log.error(held[table].sentence())
    for table in sorted(set(tried) - set(failed)):
        released = lift(store, table, (stage,))
        if released is not None and log is not None:
            log.info(f"{table} is out of quarantine: its changes from _cdc_seq {released.first_seq} on are taken in")
    return held


def resume_capture_at(store: ObjectStore, tables: Collection[str], position: str) -> list[str]:
    """A snapshot takes the tables quarantined at capture back from `position` (the checkpoint, its rows are read at
    or after it: the caller holds the capture lock): capture reads them again from there. Returns those it took."""
    taken = []
    for table, entry in quarantined_tables(store, (CAPTURE,)).items():
        if table in tables and entry.resume_at is None:
            store.put(_key(table), json.dumps(replace(entry, resume_at=position).to_json(), indent=1, sort_keys=True).encode())
            taken.append(table)
    return taken


def lift_after_snapshot(store: ObjectStore, table: str) -> Quarantine | None:
    """A snapshot loaded the table: what it owed is in the loaded rows. A quarantine at capture is lifted only when
    the snapshot took it back (`resume_at`); one made again since (the cause is still there) stays."""
    known = load_quarantine(store, table)
    if known is None or (known.stage == CAPTURE and known.resume_at is None):
        return None
    store.delete(_key(table))
    return known
