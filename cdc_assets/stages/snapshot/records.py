"""The resumable record of a snapshot on Spark, one per table under `_state/snapshots/`: its watermark and seq,
its key chunks and the files of each chunk written, so a snapshot started again reads only what is missing,
and `status` names the snapshots a kill or an error stopped.

The run process writes the record when it plans the chunks; each Spark task, once a chunk's files are complete,
writes that chunk's add actions as an object of its own under `_state/snapshot_chunks/` (`chunk_done_key`). A
record read back takes in those objects, so a snapshot killed at any moment loses at most the chunks in flight."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import TableShape, shape_from_json, shape_json
from cdc_assets.lake.layout import SNAPSHOT_CHUNKS_STATE, SNAPSHOTS_STATE
from cdc_assets.lake.store import MissingObject, ObjectStore


def encode_key(values: tuple) -> list[Any]:
    """A key (as PyMySQL returns it) as JSON values that `decode_key` turns back into the same Python values."""

    def one(v: Any) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, bytes):
            return {"bytes": base64.b64encode(v).decode()}
        if isinstance(v, decimal.Decimal):
            return {"decimal": str(v)}
        if isinstance(v, dt.datetime):
            return {"datetime": v.isoformat()}
        if isinstance(v, dt.date):
            return {"date": v.isoformat()}
        if isinstance(v, dt.timedelta):
            return {"time_us": (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds}
        raise TypeError(f"no record of a key value of type {type(v).__name__}")

    return [one(v) for v in values]


def decode_key(values: list[Any]) -> tuple:
    def one(v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        (kind, text), *_ = v.items()
        decoders: dict[str, Callable[[Any], Any]] = {
            "bytes": base64.b64decode,
            "decimal": decimal.Decimal,
            "datetime": dt.datetime.fromisoformat,
            "date": dt.date.fromisoformat,
            "time_us": lambda us: dt.timedelta(microseconds=us),
        }
        return decoders[kind](text)

    return tuple(one(v) for v in values)


@dataclass
class TableSnapshot:
    """One table's snapshot in progress: its low watermark and seq, its chunks and the files of those done."""

    shape: TableShape
    low: BinlogPosition
    seq: int
    taken_at: dt.datetime
    bounds: list[tuple]  # chunk n holds the keys in [bounds[n-1], bounds[n]); a keyless table: no bounds, one chunk
    done: dict[int, list[dict]] = field(default_factory=dict)  # chunk -> the add actions of its files
    committed: bool = False
    policy: str = ""  # the column policy its chunks are read under (core/column_policy.table_mark; "": none)

    @property
    def table(self) -> TableRef:
        return self.shape.table

    @property
    def keyed(self) -> bool:
        return bool(self.shape.primary_key)

    @property
    def chunks(self) -> int:
        return len(self.bounds) + 1

    @property
    def rows(self) -> int:
        return sum(int(a["rows"]) for actions in self.done.values() for a in actions)

    def chunk_range(self, n: int) -> tuple[tuple | None, tuple | None]:
        return (self.bounds[n - 1] if n else None, self.bounds[n] if n < len(self.bounds) else None)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "shape": shape_json(self.shape),
            "low": self.low.to_json(),
            "seq": self.seq,
            "taken_at": self.taken_at.isoformat(),
            "bounds": [encode_key(b) for b in self.bounds],
            "done": {str(n): actions for n, actions in sorted(self.done.items())},
            "committed": self.committed,
            "policy": self.policy,
        }

    @staticmethod
    def from_json(table: TableRef, d: dict[str, Any]) -> TableSnapshot:
        shape = shape_from_json(table, d["shape"])
        assert shape is not None
        return TableSnapshot(
            shape,
            BinlogPosition.from_json(d["low"]),
            int(d["seq"]),
            dt.datetime.fromisoformat(d["taken_at"]),
            [decode_key(b) for b in d["bounds"]],
            {int(n): actions for n, actions in d["done"].items()},
            bool(d["committed"]),
            str(d.get("policy") or ""),
        )


def record_key(table: TableRef) -> str:
    return f"{SNAPSHOTS_STATE}/{table.path}.json"


def chunks_prefix(table: TableRef, seq: int | None = None) -> str:
    """Where the tasks of the table's snapshot at `seq` record their chunks (all of its snapshots': None)."""
    return f"{SNAPSHOT_CHUNKS_STATE}/{table.path}/" + ("" if seq is None else f"{seq}/")


def chunk_done_key(table: TableRef, seq: int, chunk: int) -> str:
    """The object a task writes once a chunk's files are complete: their add actions, as a JSON list."""
    return f"{chunks_prefix(table, seq)}{chunk}.done"


def load_record(store: ObjectStore, table: TableRef) -> TableSnapshot | None:
    return _load_record(store, record_key(table))


def _load_record(store: ObjectStore, key: str) -> TableSnapshot | None:
    try:
        raw = store.get(key)
    except MissingObject:
        return None
    try:
        d = json.loads(raw)
        record = TableSnapshot.from_json(TableRef.parse(d["table"]), d)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CdcUserError(
            f"The record of a snapshot in progress ({key}) is corrupt: delete it, and that table's snapshot starts over."
        ) from exc
    record.done.update(chunks_written(store, record))
    return record


def chunks_written(store: ObjectStore, record: TableSnapshot, known: Collection[int] = ()) -> dict[int, list[dict]]:
    """The chunks the snapshot's tasks recorded as written, but those `known` already. An object cut short by
    a crash of its task is not a chunk done: its chunk is read again."""
    prefix = chunks_prefix(record.table, record.seq)
    done: dict[int, list[dict]] = {}
    for key in store.list_keys(prefix):
        name = key[len(prefix) :]
        if not name.endswith(".done") or not name[: -len(".done")].isdigit() or int(name[: -len(".done")]) in known:
            continue
        try:
            actions = json.loads(store.get(key))
        except (ValueError, MissingObject):
            continue
        if isinstance(actions, list):
            done[int(name[: -len(".done")])] = actions
    return done


def save_record(store: ObjectStore, record: TableSnapshot) -> None:
    store.put(record_key(record.table), json.dumps(record.to_json(), default=str).encode())


def forget_record(store: ObjectStore, table: TableRef) -> None:
    """The table's snapshot is committed (or must start over): its record and its chunks' objects go."""
    for key in store.list_keys(chunks_prefix(table)):
        store.delete(key)
    store.delete(record_key(table))


def snapshots_in_progress(store: ObjectStore) -> list[TableSnapshot]:
    """The snapshots a kill or an error stopped, for `status`: run `snapshot` again for them to resume."""
    found = (_load_record(store, key) for key in store.list_keys(SNAPSHOTS_STATE) if key.endswith(".json"))
    return [record for record in found if record is not None]
