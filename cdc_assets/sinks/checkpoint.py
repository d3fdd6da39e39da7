"""Each sink's own checkpoint, `_state/sinks/<sink>.json`: per table, the `_cdc_seq` up to which every message
has been acknowledged by the broker, and running totals.

A change log only ever grows by changes above its highest `_cdc_seq` (lake.delta's watermark), so a table's
seq here is a complete prefix: what lies above it is exactly what the sink still owes. The file is replaced
atomically (lake.store) and only after the broker acknowledged a whole window of messages; a crash before
that re-sends the window (at-least-once), never skips it. Written only under the sink's lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from cdc_assets.core.errors import CdcUserError
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import MissingObject, ObjectStore

SINKS_STATE = f"{STATE}/sinks"


def checkpoint_key(sink: str) -> str:
    return f"{SINKS_STATE}/{sink}.json"


@dataclass(frozen=True)
class SinkCheckpoint:
    sink: str
    tables: dict[str, int] = field(default_factory=dict)  # `schema.table` -> last acknowledged `_cdc_seq`
    messages: int = 0  # messages acknowledged since the sink began (re-sent ones count again)
    bytes: int = 0
    last_seq: int | None = None  # the highest `_cdc_seq` acknowledged
    updated_at: float | None = None
    last_heartbeat_at: float | None = None
    destination: str | None = None  # where the last window went (no secret), to notice a changed destination

    def seq_of(self, table: str) -> int:
        return self.tables.get(table, 0)

    def advanced(self, table_seqs: dict[str, int], messages: int, size: int, now: float, destination: str) -> SinkCheckpoint:
        tables = dict(self.tables)
        for table, seq in table_seqs.items():
            tables[table] = max(seq, tables.get(table, 0))
        top = max(table_seqs.values(), default=None)
        last = top if self.last_seq is None or (top is not None and top > self.last_seq) else self.last_seq
        return replace(
            self,
            tables=tables,
            messages=self.messages + messages,
            bytes=self.bytes + size,
            last_seq=last,
            updated_at=now,
            destination=destination,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "sink": self.sink,
            "destination": self.destination,
            "tables": dict(sorted(self.tables.items())),
            "messages": self.messages,
            "bytes": self.bytes,
            "last_seq": self.last_seq,
            "updated_at": self.updated_at,
            "last_heartbeat_at": self.last_heartbeat_at,
        }


def load_checkpoint(store: ObjectStore, sink: str) -> SinkCheckpoint:
    """The sink's checkpoint; an empty one when it has never published."""
    key = checkpoint_key(sink)
    try:
        raw = store.get(key)
    except MissingObject:
        return SinkCheckpoint(sink)
    try:
        d = json.loads(raw)
        tables = {str(t): int(s) for t, s in d["tables"].items()}
        return SinkCheckpoint(
            sink=sink,
            tables=tables,
            messages=int(d.get("messages") or 0),
            bytes=int(d.get("bytes") or 0),
            last_seq=None if d.get("last_seq") is None else int(d["last_seq"]),
            updated_at=d.get("updated_at"),
            last_heartbeat_at=d.get("last_heartbeat_at"),
            destination=d.get("destination"),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CdcUserError(
            f"The {sink} sink's checkpoint {key} in the lakehouse is corrupt: restore it from a backup, or delete it "
            "to publish every change log from its first change again."
        ) from exc


def save_checkpoint(store: ObjectStore, checkpoint: SinkCheckpoint) -> None:
    store.put(checkpoint_key(checkpoint.sink), json.dumps(checkpoint.to_json(), indent=1).encode())


def sinks_published(store: ObjectStore, table: str, seq: int) -> list[str]:
    """The sinks whose checkpoint for `table` is at or past `seq`: they have sent that change on (a forget names
    them, as they cannot unsend it)."""
    suffix = ".json"
    names = [key.rsplit("/", 1)[-1][: -len(suffix)] for key in store.list_keys(SINKS_STATE) if key.endswith(suffix)]
    return sorted(name for name in names if load_checkpoint(store, name).seq_of(table) >= seq)
