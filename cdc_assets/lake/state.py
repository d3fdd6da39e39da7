"""Pipeline state under `_state/`: the binlog checkpoint, the table registry and per-table progress.

The checkpoint is only ever a transaction boundary and is written only after the batch that ends
there is durable (docs/overview.md; docs/reliability.md). Each state object is one small JSON file replaced atomically.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import FIRST_SEQ, BinlogPosition
from cdc_assets.core.shapes import TableShape, shape_from_json, shape_json
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import MissingObject, ObjectStore

CHECKPOINT_KEY = f"{STATE}/checkpoint.json"


@dataclass(frozen=True)
class Checkpoint:
    """Where the next capture starts: a transaction boundary, with the GTID state there if any (`gtid`: on MySQL the
    executed GTID set up to it, tagged GTIDs included; on MariaDB the last GTID of each domain)."""

    position: BinlogPosition
    gtid: str | None = None
    last_batch: str | None = None
    last_commit_ts: int | None = None
    next_seq: int = FIRST_SEQ  # `_cdc_seq` of the next change captured
    reached_at: float | None = None  # wall time of the start of the last capture that reached its binlog end
    schemas: str | None = None  # name of the _state/schemas/ file with every table's shape at this position
    server_id: int | None = None  # the source server `position` is in (another one is followed by `gtid`)

    def lag_seconds(self, lag_bytes: int, now: float) -> float:
        """While the binlog holds more than the checkpoint, how long ago capture last had everything (all
        committed before the start of the last capture that reached its end is in); else 0."""
        if not lag_bytes:
            return 0.0
        since = self.reached_at or self.last_commit_ts
        return max(now - since, 0.0) if since else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "position": self.position.to_json(),
            "gtid": self.gtid,
            "last_batch": self.last_batch,
            "last_commit_ts": self.last_commit_ts,
            "next_seq": self.next_seq,
            "reached_at": self.reached_at,
            "schemas": self.schemas,
            "server_id": self.server_id,
        }


def _load_json(store: ObjectStore, key: str) -> dict | None:
    try:
        raw = store.get(key)
    except MissingObject:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise CdcUserError(
            f"The pipeline state {key} in the lakehouse is corrupt: restore it from a backup or delete it "
            "to start over from the oldest binlog."
        ) from exc


def load_checkpoint(store: ObjectStore) -> Checkpoint | None:
    try:
        d = _load_json(store, CHECKPOINT_KEY)
    except CdcUserError as exc:  # cut short or garbled: starting over from the oldest binlog would not be safe
        raise CdcUserError(
            f"The checkpoint {CHECKPOINT_KEY} in the lakehouse is corrupt (not JSON): restore it from a backup."
        ) from exc
    if d is None:
        return None
    try:
        checkpoint = Checkpoint(
            position=BinlogPosition.from_json(d["position"]),
            gtid=d.get("gtid"),
            last_batch=d.get("last_batch"),
            last_commit_ts=d.get("last_commit_ts"),
            next_seq=int(d.get("next_seq", FIRST_SEQ)),
            reached_at=d.get("reached_at"),
            schemas=d.get("schemas"),
            server_id=None if d.get("server_id") is None else int(d["server_id"]),
        )
        checkpoint.position.sort_key  # noqa: B018 - a file name that is not a binlog's fails here
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CdcUserError(
            f"The checkpoint {CHECKPOINT_KEY} in the lakehouse is corrupt (no valid binlog position): restore it "
            "from a backup."
        ) from exc
    if checkpoint.position.log_pos < 4 or checkpoint.next_seq < FIRST_SEQ:
        raise CdcUserError(
            f"The checkpoint {CHECKPOINT_KEY} in the lakehouse is corrupt (position {checkpoint.position}, next seq "
            f"{checkpoint.next_seq}): restore it from a backup."
        )
    return checkpoint


def save_checkpoint(store: ObjectStore, checkpoint: Checkpoint) -> None:
    store.put(CHECKPOINT_KEY, json.dumps(checkpoint.to_json(), indent=1).encode())


EARLIER_KEY = f"{STATE}/earlier.json"


@dataclass(frozen=True)
class EarlierLakehouse:
    """What a lakehouse begun again over an earlier one's remains knows of it (one re-initialised after its checkpoint
    was purged keeps its history/ and its raw batches, archived): every `_cdc_seq` up to `last_seq` is the earlier
    one's, and this one's capture began at `start` (the oldest binlog the source had then) with seq `last_seq` + 2.
    Seqs go on rising across the two, so a history's versions stay ordered by seq, and a change after the gap is
    never taken for one older than the history's; the seq left between them is a snapshot's at that start."""

    last_seq: int
    start: str

    @property
    def first_seq(self) -> int:
        """The `_cdc_seq` of this lakehouse's first change."""
        return self.last_seq + 2

    def holds(self, seq: int | None) -> bool:
        """Whether `seq` is the earlier lakehouse's (before the gap)."""
        return seq is not None and seq <= self.last_seq


def load_earlier(store: ObjectStore) -> EarlierLakehouse | None:
    """The earlier lakehouse this one was begun over, if any (written by the capture that began it)."""
    d = _load_json(store, EARLIER_KEY)
    if d is None:
        return None
    return EarlierLakehouse(int(d["last_seq"]), str(d["start"]))


def save_earlier(store: ObjectStore, earlier: EarlierLakehouse) -> None:
    store.put(EARLIER_KEY, json.dumps({"last_seq": earlier.last_seq, "start": earlier.start}, indent=1).encode())


SCHEMAS_PREFIX = f"{STATE}/schemas"


def load_schemas(store: ObjectStore, checkpoint: Checkpoint | None) -> dict[TableRef, TableShape]:
    """Every captured table's columns and key at the checkpoint (what a DDL right after it changes).

    Each file is written once, under a new name, before the checkpoint that names it: the
    checkpoint switches to it atomically.
    """
    if checkpoint is None or checkpoint.schemas is None:
        return {}
    d = _load_json(store, f"{SCHEMAS_PREFIX}/{checkpoint.schemas}.json")
    if d is None:
        raise CdcUserError(
            f"The table shapes {SCHEMAS_PREFIX}/{checkpoint.schemas}.json named by the checkpoint are missing from "
            "the lakehouse: restore them from a backup."
        )
    shapes = {}
    for name, shape in d.items():
        table = TableRef.parse(name)
        parsed = shape_from_json(table, shape)
        if parsed is not None:
            shapes[table] = parsed
    return shapes


def save_schemas(store: ObjectStore, name: str, schemas: dict[TableRef, TableShape]) -> None:
    body = {str(t): shape_json(s) for t, s in sorted(schemas.items(), key=lambda kv: str(kv[0]))}
    store.put(f"{SCHEMAS_PREFIX}/{name}.json", json.dumps(body, indent=1, sort_keys=True).encode())


COLUMN_POLICIES_KEY = f"{STATE}/column_policies.json"


@dataclass
class PolicyRecord:
    """The column policy each captured table was captured under (core/column_policy): its rules per column, the
    hash key's fingerprint (never the key), and the tables a snapshot accepted a policy change for. `found` is False
    for a lakehouse that never wrote one (its tables were captured before column policies: every column clear)."""

    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    key_fingerprint: str | None = None
    accepted: set[str] = field(default_factory=set)
    found: bool = True
    # table -> columns a policy was added to after they were captured, whose earlier layers may hold clear values
    # until `cdc-lakehouse forget TABLE --rewrite-policies` rewrites them (which drops the table from here)
    rewrite: dict[str, dict[str, str]] = field(default_factory=dict)


def load_policy_record(store: ObjectStore) -> PolicyRecord:
    d = _load_json(store, COLUMN_POLICIES_KEY)
    if d is None:
        return PolicyRecord(found=False)
    return PolicyRecord(
        dict(d.get("tables") or {}), d.get("key_fingerprint"), set(d.get("accepted") or ()),
        rewrite=dict(d.get("rewrite") or {}),
    )


def save_policy_record(store: ObjectStore, record: PolicyRecord) -> None:
    body = {
        "tables": record.tables, "key_fingerprint": record.key_fingerprint, "accepted": sorted(record.accepted),
        "rewrite": record.rewrite,
    }
    store.put(COLUMN_POLICIES_KEY, json.dumps(body, indent=1, sort_keys=True).encode())
    record.found = True


def accept_policies(store: ObjectStore, tables: Collection[str]) -> None:
    """A snapshot loads these tables under today's column policy: the next capture takes a policy change of theirs
    (even one taken away) as accepted, rather than refusing it."""
    record = load_policy_record(store)
    if not record.found or set(tables) <= record.accepted:
        return
    record.accepted |= set(tables)
    save_policy_record(store, record)


def policies_rewritten(store: ObjectStore, table: str) -> None:
    """Every layer of `table` rewritten under today's column policy (`forget --rewrite-policies`): no clear value
    of a column policed since it was captured is left, so comparisons no longer allow for them."""
    record = load_policy_record(store)
    if record.rewrite.pop(table, None) is not None:
        save_policy_record(store, record)


TABLES_KEY = f"{STATE}/tables.json"


def load_registry(store: ObjectStore) -> dict[str, dict[str, str | None]]:
    """`schema.table` -> {"first_batch", "last_batch"}: the first and newest raw batch with a change of the table.

    Written only by capture (and snapshot) under the capture lock, so it has a single writer; it
    tells every later stage which tables exist and which have changes they have not taken in.
    """
    registry = _load_json(store, TABLES_KEY)
    if registry is None:
        return {}
    if not isinstance(registry, dict) or any(not isinstance(e, dict) for e in registry.values()):
        raise CdcUserError(
            f"The table registry {TABLES_KEY} in the lakehouse is corrupt (not an object of tables): restore it "
            "from a backup."
        )
    if any("columns" in e for e in registry.values()):
        raise CdcUserError(
            f"{TABLES_KEY} in the lakehouse was written by an earlier cdc-lakehouse (a catalog of table versions): "
            "point CDC_LAKEHOUSE at a new location, or delete the lakehouse to capture again from the oldest binlog."
        )
    # one text form per table (cdc_assets.core.names), whichever form an earlier version wrote
    return {str(TableRef.parse(name)): entry for name, entry in registry.items()}


def save_registry(store: ObjectStore, registry: dict[str, dict[str, str | None]]) -> None:
    store.put(TABLES_KEY, json.dumps(registry, indent=1, sort_keys=True).encode())


def register_batch(registry: dict[str, dict[str, str | None]], batch: str, tables: list[str]) -> bool:
    """Record that `batch` changes `tables`; returns whether the registry changed."""
    changed = False
    for table in tables:
        entry = registry.setdefault(table, {"first_batch": None, "last_batch": None})
        if entry.get("first_batch") is None:
            entry["first_batch"] = batch
            changed = True
        if entry.get("last_batch") is None or entry["last_batch"] < batch:
            entry["last_batch"] = batch
            changed = True
    return changed


def known_tables(store: ObjectStore, requested: Collection[str] | None = None) -> list[str]:
    """The tables the lakehouse has seen, sorted; with `requested`, only those of them (a run's tables)."""
    known = load_registry(store)
    return sorted(known if requested is None else set(requested) & set(known))


@dataclass(frozen=True)
class TableProgress:
    """How far one stage has taken one table: the last raw batch it has fully taken in.

    The change-log stage also keeps the table's shape (columns and key) of the newest changes it
    appended, which the current-state stage needs; it is saved only after those changes landed.
    The current-state stage also keeps whether the table's current state existed when it saved
    (`present`: None in state written before it was recorded) and the seq of the last snapshot that
    loaded it (its rows then come partly from the source, not only from the change log).
    """

    batch: str | None
    shape: TableShape | None = None
    dropped_seq: int | None = None  # current-state stage: the `_cdc_seq` of the DROP that removed the table
    present: bool | None = None
    snapshot_seq: int | None = None


def _progress_key(stage: str, table: str) -> str:
    return f"{STATE}/progress/{stage}/{TableRef.parse(table).path}.json"


def load_progress(store: ObjectStore, stage: str, table: str) -> TableProgress:
    d = _load_json(store, _progress_key(stage, table))
    if d is None:
        return TableProgress(None)
    if not isinstance(d, dict):
        raise CdcUserError(
            f"The progress file {_progress_key(stage, table)} in the lakehouse is corrupt: delete it, and the "
            f"{stage} stage takes {table} in again from its first raw batch (nothing is applied twice)."
        )
    shape = shape_from_json(TableRef.parse(table), d.get("version"))
    return TableProgress(d.get("batch"), shape, d.get("dropped_seq"), d.get("present"), d.get("snapshot_seq"))


def save_progress(store: ObjectStore, stage: str, table: str, progress: TableProgress) -> None:
    body = {"batch": progress.batch, "version": shape_json(progress.shape), "dropped_seq": progress.dropped_seq}
    if progress.present is not None:
        body["present"] = progress.present
    if progress.snapshot_seq is not None:
        body["snapshot_seq"] = progress.snapshot_seq
    store.put(_progress_key(stage, table), json.dumps(body, indent=1, sort_keys=True).encode())


def needs_work(registry_entry: dict[str, str | None], progress: TableProgress) -> bool:
    """Whether a raw batch newer than the stage's progress changes the table."""
    last = registry_entry.get("last_batch")
    return last is not None and (progress.batch is None or progress.batch < last)


def tables_behind(
    store: ObjectStore, stage: str, registry: dict[str, dict[str, str | None]] | None = None
) -> dict[str, TableProgress]:
    """Tables with a raw batch newer than the stage's progress, with that progress."""
    registry = load_registry(store) if registry is None else registry
    behind = {}
    for table, entry in sorted(registry.items()):
        progress = load_progress(store, stage, table)
        if needs_work(entry, progress):
            behind[table] = progress
    return behind
