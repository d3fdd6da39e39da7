"""Forgetting a person: every row and version of some keys of one table removed from the raw batches, the change log,
current state and the history, and from storage (`layers.rewrite_table_layers`), recorded under `_state/forgotten/`
with a hash of each key, never the key.

Keys are matched as every layer keys its rows: the JSON array of the key columns' canonical texts
(`stages.changes.keys`), so `042` given for an INT key forgets the key 42, and a key whose column type was widened
since is still found. A key-changing update from a forgotten key to another one keeps the other key's row (as an
insert of it); one from another key into a forgotten one keeps the other key's removal (as a delete of it).

Why it holds the snapshot, capture, change-log and current-state locks for its whole run, and first brings the
table up to date (capture, then the table's change log and current state, on Arrow): a DELETE at the source not yet
captured would bring the person's whole row back (a delete carries its before-image) with the next sync; and with the
DELETE applied, current state lacks the keys as the source does at every step a crash may stop the rewrite at, so a
sync in between passes its checks. Capture then only reads on past the checkpoint, so nothing before it is read
again; a sync after a crash may take rows of a batch not yet rewritten into a change log already rewritten, and the
forget run again removes them with the rest.

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
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core import ops
from cdc_assets.core.column_policy import CLEAR, HASH, ColumnPolicy
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import decode_column, encode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, FORGOTTEN_STATE
from cdc_assets.lake.raw_batches import batch_folders, read_folder_manifest, read_folder_rows
from cdc_assets.lake.store import Lakehouse, MissingObject
from cdc_assets.stages.changes.keys import json_key_texts, json_keys
from cdc_assets.stages.rewrite.layers import LayerCount, TableRewrite
from cdc_assets.stages.rewrite.run import PENDING, run_rewrite

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


def canonical_keys(shape: TableShape, keys: list[list[str]], policy: ColumnPolicy | None = None) -> dict[str, str]:
    """Each key's JSON text as every layer holds it, mapped to its JSON text at the source: each value read at its
    column's type and written back in the canonical form (`core.mysql_types`); a key column a column policy hashes
    (`CDC_HASH_COLUMNS`) holds the value's keyed hash in the lakehouse. `shape` is the source's."""
    columns = [shape.columns[i] for i in shape.key_indexes()]
    rules = policy.rules(shape) if policy is not None else {}
    clear, lake = [], []
    for n, column in enumerate(columns):
        given = pa.array([key[n] for key in keys], pa.string())
        try:
            typed = decode_column(column, given)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise CdcUserError(
                f"A value given for the key column {column.name} of {shape.table} is not a {column.type.upper()}: "
                "give each key's values as the source prints them."
            ) from exc
        texts = encode_column(column, typed)
        clear.append(pa.array(texts, pa.string()))
        if policy is not None and rules.get(column.name, CLEAR) == HASH:
            texts = [None if t is None else policy.police_text(HASH, column, t) for t in texts]
        lake.append(pa.array(texts, pa.string()))
    return dict(zip(json_key_texts(lake).to_pylist(), json_key_texts(clear).to_pylist(), strict=True))


def hashed_key(shape: TableShape, policy: ColumnPolicy | None) -> bool:
    """Whether a column policy hashes a key column of the table (its lakehouse keys are not the source's)."""
    return policy is not None and any(policy.rule(shape.table, name) == HASH for name in shape.primary_key)


def key_hash(table: TableRef, key: str) -> str:
    """What the record keeps of a key: SHA-256 of the table and the key's canonical text. It tells the same key
    again (a forget run again after a crash finds its record), without the key; a key of few possible values (a
    small number) can still be found by trying each, which is why the record is no public list."""
    return hashlib.sha256(f"{table}\n{key}".encode()).hexdigest()


# -- the rewrite ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForgetKeys:
    """`layers.TableRewrite` that drops every row and version of the keys whose `key_hash` is in `hashes`. Rows
    are matched by the hash, not the key, so a forget stopped midway is finished from its record alone: the keys
    linked by a key change (`linked_keys`) may no longer be found once a layer has lost their rows."""

    table: TableRef
    hashes: frozenset[str]

    def raw_shape(self, shape: TableShape) -> TableShape:
        return shape

    def _gone(self, keys: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        """Whether each key text is one of the keys (False for NULL: a change of no row, a schema change)."""
        texts = pc.unique(pc.drop_null(keys)).to_pylist() if len(keys) else []
        found = [text for text in texts if key_hash(self.table, text) in self.hashes]
        return pc.fill_null(pc.is_in(keys, value_set=pa.array(found, pa.string())), False)

    def raw_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        index = shape.key_indexes()
        gone = pc.or_(self._gone(json_keys(rows.column("after"), index)), self._gone(json_keys(rows.column("before"), index)))
        return rows.filter(pc.invert(gone)) if pc.any(gone).as_py() else None

    def change_rows(self, rows: pa.Table) -> pa.Table | None:
        gone = pc.or_(self._gone(rows.column("_cdc_key")), self._gone(rows.column("_cdc_before_key")))
        return rows.filter(pc.invert(gone)) if pc.any(gone).as_py() else None

    def current_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        return self._typed_rows(rows, shape)

    def history_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        return self._typed_rows(rows, shape)

    def _typed_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        """Rows of typed key columns (current state, history versions) without those of the keys: each row's key
        texts written back from its typed values (`encode_column`, what `decode_column` reads)."""
        if not rows.num_rows:
            return None
        columns = [shape.columns[i] for i in shape.key_indexes()]
        gone = self._gone(json_key_texts([pa.array(encode_column(c, rows.column(c.name)), pa.string()) for c in columns]))
        return rows.filter(pc.invert(gone)) if pc.any(gone).as_py() else None


def linked_keys(lakehouse: Lakehouse, table: TableRef, keys: Iterable[str]) -> list[str]:
    """`keys` and every key a key-changing update of the table's raw batches linked to one of them, either way and
    through any number of changes: the same source row under another key holds the same person's values."""
    links: dict[str, set[str]] = {}
    store = lakehouse.store
    for folder in batch_folders(store):
        manifest = read_folder_manifest(store, folder)
        versions = {v: shape for v, shape in manifest.shapes.items() if shape.table == table}
        if not versions:
            continue
        rows = read_folder_rows(store, folder, manifest)
        mine = pc.and_(pc.equal(rows.column("schema"), table.schema), pc.equal(rows.column("table"), table.table))
        updates = rows.filter(pc.and_(mine, pc.equal(rows.column("op"), ops.UPDATE)))
        for version, shape in versions.items():
            part = updates.filter(pc.equal(updates.column("table_version"), version))
            index = shape.key_indexes()
            before, after = json_keys(part.column("before"), index), json_keys(part.column("after"), index)
            for old, new in zip(before.to_pylist(), after.to_pylist(), strict=True):
                if old is not None and new is not None and old != new:
                    links.setdefault(old, set()).add(new)
                    links.setdefault(new, set()).add(old)
    found, pending = set(keys), list(keys)
    while pending:
        for other in links.get(pending.pop(), ()):
            if other not in found:
                found.add(other)
                pending.append(other)
    return sorted(found)


# -- the record -----------------------------------------------------------------------------------------------------


@dataclass
class ForgetRecord:
    """What one forget did, under `_state/forgotten/<schema>/<table>/<id>.json`: no clear key."""

    id: str
    table: str
    given: list[str]  # the hashes of the keys given (a forget run again with them finds this record)
    key_hashes: list[str]  # the hashes of every key forgotten: those given and those a key change linked to them
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
            "given": self.given,
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
            d["id"], d["table"], list(d["given"]), list(d["key_hashes"]), float(d["started_at"]), d["status"], d.get("finished_at"),
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
    catch_up: Callable[[], None],
    lakehouse: Lakehouse,
    table: TableRef,
    keys: list[str],
    source_holds: Callable[[TableShape, list[str]], int],
    owner: str = "cdc-lakehouse forget",
    published_by: Callable[[int], list[str]] = lambda _: [],
) -> ForgetRecord:
    """Remove every row and version of `keys` (JSON key texts as the lakehouse holds them, `canonical_keys`) of
    `table`, and of the keys key changes linked to them, from every layer and from storage, and record it.
    `source_holds(shape, keys)`: how many of the keys the source still has (forget refuses then). `published_by(seq)`: the sinks that have sent
    the table's changes up to `seq`. Both are asked before anything is rewritten; a forget run again after a crash
    finds its pending record and finishes it, keeping what its first run found."""
    given = sorted({key_hash(table, key) for key in keys})

    def begin(shape: TableShape) -> tuple[ForgetRecord, TableRewrite]:
        record = next((r for r in forget_records(lakehouse, table) if r.status == PENDING and r.given == given), None)
        if record is None:
            linked = linked_keys(lakehouse, table, keys)
            still = source_holds(shape, linked)
            if still:
                raise CdcUserError(
                    f"The source still holds {still} of the {len(linked)} key{'s' if len(linked) != 1 else ''} in "
                    f"{table}{' (with those key changes linked to the keys given)' if len(linked) > len(keys) else ''}: "
                    "delete those rows at the source first (forget follows a DELETE there), then run forget again."
                )
            began = time.time()
            hashes = sorted({key_hash(table, key) for key in linked})
            digest = hashlib.sha256("".join(given).encode()).hexdigest()[:12]
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(began))
            record = ForgetRecord(f"{stamp}-{digest}", str(table), given, hashes, began)
            record.first_seq = first_seq_of(lakehouse, table, linked)
            record.published_by = published_by(record.first_seq) if record.first_seq is not None else []
            save_record(lakehouse, record)
        return record, ForgetKeys(table, frozenset(record.key_hashes))

    return run_rewrite(catch_up, lakehouse, table, owner, begin, lambda record: save_record(lakehouse, record))
