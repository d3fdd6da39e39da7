"""Forgetting a person: every row and version of some keys of one table removed from the raw batches, the change log,
current state and the history, and from storage (`layers.rewrite_table_layers`), recorded under `_state/forgotten/`
with a hash of each key, never the key.

Keys are matched as every layer keys its rows: the JSON array of the key columns' canonical texts
(`stages.changes.keys`), so `042` given for an INT key forgets the key 42, and a key whose column type was widened
since is still found. A key-changing update from a forgotten key to another one keeps the other key's row (as an
insert of it); one from another key into a forgotten one keeps the other key's removal (as a delete of it).

Why it holds the capture, change-log and current-state locks for its whole run, and captures first: a sync between
two layers' rewrites would take the rows of a batch not yet rewritten into a change log already rewritten; and a
DELETE at the source not yet captured would bring the person's whole row back (a delete carries its before-image)
with the next sync. Capture then only reads on past the checkpoint, so nothing before it is read again.

Why it is exactly once across crashes: the record is written (`pending`) before any layer is touched, each layer's
rewrite can be run again (a file already without the keys is not written again; old versions are purged every
time), and the record says `done` only after every layer. A forget run again with the same keys finds its pending
record by the keys' hashes and finishes it, keeping what the first run found (the sinks that had published them).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.capture.run import capture
from cdc_assets.core import failpoints, ops
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import decode_column, encode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import (
    CAPTURE_LOCK,
    CHANGES,
    CHANGES_LOCK,
    CHANGES_STAGE,
    CURRENT_LOCK,
    FORGOTTEN_STATE,
    SNAPSHOT_LOCK,
)
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.state import load_checkpoint, load_progress, load_registry, load_schemas
from cdc_assets.lake.store import Lakehouse, MissingObject
from cdc_assets.stages.changes.keys import json_key_texts, json_keys
from cdc_assets.stages.rewrite.layers import LAYERS, LayerCount, rewrite_table_layers
from cdc_assets.stages.snapshot.records import load_record

PENDING, DONE = "pending", "done"


# -- the keys ----------------------------------------------------------------------------------------------------


def parse_key(text: str, arity: int) -> list[str]:
    """One key as the user gives it: the value itself for a one-column key, or a JSON array of the values in the
    primary key's column order (any key may be given so; a one-column key whose value starts with `[` must be)."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except ValueError:
            values = None
        if not isinstance(values, list) or any(isinstance(v, dict | list) or v is None for v in values):
            raise CdcUserError(
                "A key given as a JSON array is not an array of values: write it as e.g. '[42, \"abc\"]', one value "
                "per primary-key column."
            )
        parts = [v if isinstance(v, str) else json.dumps(v) for v in values]
    else:
        parts = [text]
    if len(parts) != arity:
        raise CdcUserError(
            f"A key has {len(parts)} value{'s' if len(parts) != 1 else ''} but the table's primary key has {arity} "
            f"column{'s' if arity != 1 else ''}: give each key as a JSON array of {arity} values in the key's column "
            "order, e.g. '[42, \"abc\"]'."
        )
    return parts


def canonical_keys(shape: TableShape, keys: list[list[str]]) -> list[str]:
    """The keys' JSON texts as every layer holds them: each value read at its column's type and written back in the
    canonical form (`core.mysql_types`)."""
    columns = [shape.columns[i] for i in shape.key_indexes()]
    texts = []
    for n, column in enumerate(columns):
        given = pa.array([key[n] for key in keys], pa.string())
        try:
            typed = decode_column(column, given)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise CdcUserError(
                f"A value given for the key column {column.name} of {shape.table} is not a {column.type.upper()}: "
                "give each key's values as the source prints them."
            ) from exc
        texts.append(pa.array(encode_column(column, typed), pa.string()))
    return sorted(set(json_key_texts(texts).to_pylist()))


def key_hash(table: TableRef, key: str) -> str:
    """What the record keeps of a key: SHA-256 of the table and the key's canonical text. It tells the same key
    again (a forget run again after a crash finds its record), without the key; a key of few possible values (a
    small number) can still be found by trying each, which is why the record is no public list."""
    return hashlib.sha256(f"{table}\n{key}".encode()).hexdigest()


# -- the rewrite ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetKeys:
    """`layers.TableRewrite` that drops every row and version of `keys` (canonical JSON key texts)."""

    keys: frozenset[str]

    def _gone(self, keys: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        return pc.fill_null(pc.is_in(keys, value_set=pa.array(sorted(self.keys), pa.string())), False)

    def raw_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        index = shape.key_indexes()
        after, before = rows.column("after"), rows.column("before")
        after_gone, before_gone = self._gone(json_keys(after, index)), self._gone(json_keys(before, index))
        keep_after = pc.and_(pc.is_valid(after), pc.invert(after_gone))
        keep_before = pc.and_(pc.is_valid(before), pc.invert(before_gone))
        if not pc.any(pc.or_(after_gone, before_gone)).as_py():
            return None
        update = pc.equal(rows.column("op"), ops.UPDATE)
        op = pc.if_else(pc.and_(update, pc.invert(keep_before)), ops.INSERT, rows.column("op"))  # a key left it
        op = pc.if_else(pc.and_(update, pc.invert(keep_after)), ops.DELETE, op)  # a key moved into a forgotten one
        null_images = pa.nulls(rows.num_rows, after.type)
        rows = rows.set_column(rows.column_names.index("op"), "op", op)
        rows = rows.set_column(rows.column_names.index("after"), "after", pc.if_else(keep_after, after, null_images))
        rows = rows.set_column(rows.column_names.index("before"), "before", pc.if_else(keep_before, before, null_images))
        return rows.filter(pc.or_(keep_after, keep_before))

    def change_rows(self, rows: pa.Table) -> pa.Table | None:
        key, before_key = rows.column("_cdc_key"), rows.column("_cdc_before_key")
        gone, before_gone = self._gone(key), self._gone(before_key)
        if not pc.any(pc.or_(gone, before_gone)).as_py():
            return None
        update = pc.equal(rows.column("_cdc_op"), ops.UPDATE)
        # an update between a forgotten key and another: the other key's half stays, as an insert or a delete
        to_insert = pc.and_(update, pc.and_(pc.invert(gone), before_gone))
        to_delete = pc.and_(update, pc.and_(gone, pc.and_(pc.is_valid(before_key), pc.invert(before_gone))))
        if pc.any(to_insert).as_py() or pc.any(to_delete).as_py():
            rows = _half_of_key_change(rows, to_insert, to_delete)
        drop = pc.or_(pc.and_(gone, pc.invert(to_delete)), pc.and_(before_gone, pc.invert(to_insert)))
        return rows.filter(pc.invert(drop))

    def current_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        columns = [shape.columns[i] for i in shape.key_indexes()]
        texts = [pa.array(encode_column(c, rows.column(c.name)), pa.string()) for c in columns]
        gone = self._gone(json_key_texts(texts)) if rows.num_rows else pa.array([], pa.bool_())
        return rows.filter(pc.invert(gone)) if pc.any(gone).as_py() else None

    def history_rows(self, rows: pa.Table) -> pa.Table | None:
        gone = self._gone(rows.column("_cdc_key"))
        return rows.filter(pc.invert(gone)) if pc.any(gone).as_py() else None


def _half_of_key_change(rows: pa.Table, to_insert: pa.Array, to_delete: pa.Array) -> pa.Table:
    """Change-log rows of key-changing updates turned into the half that stays: an insert of the new key (no
    before-image), or a delete of the old key (its row, from the before-image, as a delete's columns hold it)."""
    names = rows.column_names
    before = rows.column("_cdc_before").combine_chunks()
    columns = {}
    for name in names:
        column = rows.column(name)
        if name == "_cdc_op":
            column = pc.if_else(to_delete, ops.DELETE, pc.if_else(to_insert, ops.INSERT, column))
        elif name == "_cdc_key":
            column = pc.if_else(to_delete, rows.column("_cdc_before_key"), column)
        elif name == "_cdc_before_key":
            column = pc.if_else(to_insert, pa.scalar(None, pa.string()), column)
        elif name == "_cdc_before":
            column = pc.if_else(to_insert, pa.nulls(rows.num_rows, column.type), column)
        elif not name.startswith("_cdc_") and name in before.type.names:
            column = pc.if_else(to_delete, before.field(name), column)
        columns[name] = column
    return pa.table(columns, schema=rows.schema)


# -- the record -----------------------------------------------------------------------------------------------------


@dataclass
class ForgetRecord:
    """What one forget did, under `_state/forgotten/<schema>/<table>/<id>.json`: no clear key."""

    id: str
    table: str
    key_hashes: list[str]
    started_at: float
    status: str = PENDING
    finished_at: float | None = None
    first_seq: int | None = None  # the oldest change of the keys in the change log (None: it held none)
    published_by: list[str] = field(default_factory=list)  # sinks that had sent a change of the keys
    layers: dict[str, LayerCount] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{FORGOTTEN_STATE}/{TableRef.parse(self.table).path}/{self.id}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "table": self.table,
            "key_hashes": self.key_hashes,
            "keys": len(self.key_hashes),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status,
            "first_seq": self.first_seq,
            "published_by": self.published_by,
            "layers": {layer: count.to_json() for layer, count in self.layers.items()},
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> ForgetRecord:
        return ForgetRecord(
            d["id"], d["table"], list(d["key_hashes"]), float(d["started_at"]), d["status"], d.get("finished_at"),
            d.get("first_seq"), list(d.get("published_by", [])),
            {layer: LayerCount.from_json(c) for layer, c in (d.get("layers") or {}).items()},
        )  # fmt: skip


def save_record(lakehouse: Lakehouse, record: ForgetRecord) -> None:
    lakehouse.store.put(record.key, json.dumps(record.to_json(), indent=1, sort_keys=True).encode())


def forget_records(lakehouse: Lakehouse, table: TableRef | None = None) -> list[ForgetRecord]:
    """The forget records (of one table), oldest first."""
    prefix = FORGOTTEN_STATE if table is None else f"{FORGOTTEN_STATE}/{table.path}"
    records = []
    for key in lakehouse.store.list_keys(prefix):
        try:
            records.append(ForgetRecord.from_json(json.loads(lakehouse.store.get(key))))
        except (MissingObject, ValueError, KeyError, TypeError):
            raise CdcUserError(f"The forget record {key} in the lakehouse is corrupt: restore it from a backup.") from None
    return sorted(records, key=lambda r: (r.started_at, r.id))


# -- the run --------------------------------------------------------------------------------------------------------


def table_shape(lakehouse: Lakehouse, table: TableRef) -> TableShape:
    """The table's newest shape the lakehouse knows (capture's at the checkpoint, else the change log's), or one
    sentence when the lakehouse does not know the table or it has no primary key."""
    store = lakehouse.store
    if str(table) not in load_registry(store):
        raise CdcUserError(
            f"The lakehouse has no table {table}: give a captured table as schema.table (`cdc-lakehouse status` lists them)."
        )
    shape = load_schemas(store, load_checkpoint(store)).get(table) or load_progress(store, CHANGES_STAGE, str(table)).shape
    if shape is None:
        raise CdcUserError(f"{table} was dropped at the source: the lakehouse keeps no rows of it to forget.")
    if not shape.primary_key:
        raise CdcUserError(
            f"{table} has no primary key, so no row of it can be named by a key: forget works on tables with one."
        )
    return shape


def first_seq_of(lakehouse: Lakehouse, table: TableRef, keys: Iterable[str]) -> int | None:
    """The oldest `_cdc_seq` of a change of `keys` in the table's change log (None: none there)."""
    log = lakehouse.open(CHANGES, table)
    wanted = list(keys)
    if log is None or not wanted:
        return None
    found = read_query(log, "SELECT _cdc_seq, _cdc_key, _cdc_before_key FROM t")
    hit = pc.or_(
        pc.fill_null(pc.is_in(found.column("_cdc_key"), value_set=pa.array(wanted, pa.string())), False),
        pc.fill_null(pc.is_in(found.column("_cdc_before_key"), value_set=pa.array(wanted, pa.string())), False),
    )
    low = pc.min(found.filter(hit).column("_cdc_seq")).as_py() if pc.any(hit).as_py() else None
    return None if low is None else int(low)


def forget(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    table: TableRef,
    keys: list[str],
    owner: str = "cdc-lakehouse forget",
    published_by: Callable[[int], list[str]] = lambda _: [],
) -> ForgetRecord:
    """Remove every row and version of `keys` (canonical JSON key texts, `canonical_keys`) of `table` from every
    layer and from storage, and record it. `published_by(seq)`: the sinks that have sent the table's changes up to
    `seq`, asked before anything is rewritten (a resumed forget keeps what its first run found)."""
    hashes = sorted({key_hash(table, key) for key in keys})
    wait = lakehouse.lock_wait_seconds
    with ExitStack() as held:
        held.enter_context(lakehouse.faults_are_user_errors())
        for name, purpose in (
            (SNAPSHOT_LOCK, "snapshot"),
            (CAPTURE_LOCK, "capture"),
            (CHANGES_LOCK, "change-log update"),
            (CURRENT_LOCK, "current-state update"),
        ):
            held.enter_context(lakehouse_lock(lakehouse, name, purpose, owner, wait))
        if load_record(lakehouse.store, table) is not None:
            raise CdcUserError(
                f"A snapshot of {table} was stopped part-way: finish it with `cdc-lakehouse snapshot {table}`, then "
                "run forget again."
            )
        capture(settings, lakehouse, owner=owner)  # the source's DELETE of the keys, before the layers are rewritten
        shape = table_shape(lakehouse, table)
        record = next(
            (r for r in forget_records(lakehouse, table) if r.status == PENDING and r.key_hashes == hashes), None
        )
        if record is None:
            began = time.time()
            digest = hashlib.sha256("".join(hashes).encode()).hexdigest()[:12]
            record = ForgetRecord(f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(began))}-{digest}", str(table), hashes, began)
            record.first_seq = first_seq_of(lakehouse, table, keys)
            record.published_by = published_by(record.first_seq) if record.first_seq is not None else []
            save_record(lakehouse, record)

        def layer_done(layer: str, count: LayerCount) -> None:
            record.layers[layer] = record.layers.get(layer, LayerCount()).add(count)
            save_record(lakehouse, record)

        rewrite_table_layers(lakehouse, table, ForgetKeys(frozenset(keys)), shape, layer_done)
        failpoints.hit("forget.layers_rewritten")
        record.status, record.finished_at = DONE, time.time()
        record.layers = {layer: record.layers.get(layer, LayerCount()) for layer in LAYERS}
        save_record(lakehouse, record)
        return record
