"""Pipeline state under `_state/`: the binlog checkpoint and the change-log cursor.

The checkpoint is only ever a transaction boundary and is written only after the batch that ends
there is durable (CONTRACT §6). Each state object is one small JSON file replaced atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import STATE, MissingObject, ObjectStore
from cdc_assets.positions import FIRST_SEQ, BinlogPosition

CHECKPOINT_KEY = f"{STATE}/checkpoint.json"
CHANGES_CURSOR_KEY = f"{STATE}/changes_cursor.json"


@dataclass(frozen=True)
class Checkpoint:
    """Where the next capture starts: a transaction boundary, with the GTID state there if any."""

    position: BinlogPosition
    gtid: str | None = None
    last_batch: str | None = None
    last_commit_ts: int | None = None
    next_seq: int = FIRST_SEQ  # `_cdc_seq` of the next change captured

    def lag_seconds(self, lag_bytes: int, now: float) -> float:
        """While the binlog holds more than the checkpoint, the age of the newest captured commit; else 0."""
        if not lag_bytes or not self.last_commit_ts:
            return 0.0
        return max(now - self.last_commit_ts, 0.0)

    def to_json(self) -> dict[str, object]:
        return {
            "position": self.position.to_json(),
            "gtid": self.gtid,
            "last_batch": self.last_batch,
            "last_commit_ts": self.last_commit_ts,
            "next_seq": self.next_seq,
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
    d = _load_json(store, CHECKPOINT_KEY)
    if d is None:
        return None
    return Checkpoint(
        position=BinlogPosition.from_json(d["position"]),
        gtid=d.get("gtid"),
        last_batch=d.get("last_batch"),
        last_commit_ts=d.get("last_commit_ts"),
        next_seq=int(d.get("next_seq", FIRST_SEQ)),
    )


def save_checkpoint(store: ObjectStore, checkpoint: Checkpoint) -> None:
    store.put(CHECKPOINT_KEY, json.dumps(checkpoint.to_json(), indent=1).encode())


def load_changes_cursor(store: ObjectStore) -> str | None:
    """Name of the last raw batch whose changes are in every change log."""
    d = _load_json(store, CHANGES_CURSOR_KEY)
    return None if d is None else d.get("last_batch")


def save_changes_cursor(store: ObjectStore, last_batch: str) -> None:
    store.put(CHANGES_CURSOR_KEY, json.dumps({"last_batch": last_batch}).encode())


CATALOG_KEY = f"{STATE}/tables.json"


def load_catalog(store: ObjectStore) -> dict[str, dict]:
    """`schema.table` -> the newest table version seen (columns and primary key), as JSON."""
    return _load_json(store, CATALOG_KEY) or {}


def save_catalog(store: ObjectStore, catalog: dict[str, dict]) -> None:
    store.put(CATALOG_KEY, json.dumps(catalog, indent=1, sort_keys=True).encode())
