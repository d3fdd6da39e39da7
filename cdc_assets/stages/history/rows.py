"""The rows of the history tables (`history/<schema>/<table>`, SCD type 2), as plain data: the versions a table's
change-log rows open and close, in `_cdc_seq` order. The history stage applies them to the Delta table; an as-of
read with no history table replays a change log through the same function, so both give the same versions.

A version is a source row's values between two changes: it opens at an insert or update (`_cdc_valid_from`,
`_cdc_valid_from_seq`) and closes at the next change of its key (`_cdc_valid_to`, `_cdc_valid_to_seq`);
while open it is current (`_cdc_is_current`). A version closed because its row left the table (a delete, the
old key of a key-changing update, a TRUNCATE, a DROP TABLE) has `_cdc_deleted = true`. An ALTER TABLE closes
every open version and opens it again with the row's values as the ALTER left them (an added column's default,
a renamed column's values under the new name, converted types), so an as-of read after it sees what the
source held. `_cdc_key` (the row's primary key as a JSON array) and `_cdc_valid_from_seq` identify a version.

A snapshot seeds a history (stages.history.run.seed_history): every loaded row a version open from the snapshot's
seq S. A snapshot on Spark reads its rows after S (see stages/snapshot/on_spark), so a seeded row may already
hold a change made after S. `advance` fixes each seeded version (still open, opened at the seed's seq) at its
key's first change after S, whose before-image is the row as it was at S: an update or delete sets the
version's values to that image; an insert (or a key-changing update into the key) shows the key was not there
at S, so the seeded version is dropped (`is_dropped`: closed where it opened, deleted from the table).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.mysql_conversions import InexactConversion
from cdc_assets.core.mysql_types import arrow_type
from cdc_assets.core.ops import AFTER, BEFORE, effect
from cdc_assets.core.shapes import SchemaChange, TableShape
from cdc_assets.lake.delta import plain_type
from cdc_assets.stages.changes.rows import COMMIT_TS_TYPE, DDL_COLUMN, SEQ_TYPE, cast_column, unified_schema
from cdc_assets.stages.current.rows import _default_column, convert_column

KEY = "_cdc_key"
VALID_FROM, VALID_TO = "_cdc_valid_from", "_cdc_valid_to"
VALID_FROM_SEQ, VALID_TO_SEQ = "_cdc_valid_from_seq", "_cdc_valid_to_seq"
IS_CURRENT, DELETED = "_cdc_is_current", "_cdc_deleted"

HISTORY_META = [
    pa.field(KEY, pa.string(), nullable=False),
    pa.field(VALID_FROM, COMMIT_TS_TYPE),
    pa.field(VALID_TO, COMMIT_TS_TYPE),
    pa.field(VALID_FROM_SEQ, SEQ_TYPE),
    pa.field(VALID_TO_SEQ, SEQ_TYPE),
    pa.field(IS_CURRENT, pa.bool_()),
    pa.field(DELETED, pa.bool_()),
]


def source_fields(log_schema: pa.Schema) -> list[pa.Field]:
    """A change log's source columns (every column any version of the table had, at a type holding them all)."""
    return [f.with_nullable(True) for f in log_schema if not f.name.startswith("_cdc_")]


def history_columns(log_schema: pa.Schema, history: pa.Schema | None) -> list[pa.Field]:
    """The source columns a pass over change-log rows works at: the change log's, then the history table's others,
    each at a type holding both (`unified_type`). A history is never narrowed, and keeps every column: a lakehouse
    begun again (its checkpoint was purged) has a new change log at the source's columns and types now, beside a
    history that may have widened a column before (text and binary: bytes that are not UTF-8 have no text) or hold
    a column dropped before."""
    fields = source_fields(log_schema)
    if history is None:
        return fields
    kept = [f.with_type(plain_type(f.type)) for f in source_fields(history)]
    named = {f.name.lower(): f.name for f in fields}  # a column renamed in case alone: the change log's (newer) name
    return [
        f.with_name(named.get(f.name.lower(), f.name)).with_nullable(True)
        for f in unified_schema([pa.schema(fields), pa.schema(kept)])
    ]


def at_types(changes: pa.Table, columns: Sequence[pa.Field]) -> pa.Table:
    """Change-log rows with their source columns and before-images at the types of `columns` (history_columns)."""
    types = {f.name: f.type for f in columns}
    for i, column in enumerate(changes.schema):
        target = types.get(column.name)
        if column.name == "_cdc_before" and pa.types.is_struct(column.type):
            target = pa.struct([f.with_type(types.get(f.name, f.type)) for f in column.type])
        if target is not None and target != column.type:
            changes = changes.set_column(i, column.with_type(target), cast_column(changes.column(i), target))
    return changes


def history_schema(columns: Sequence[pa.Field]) -> pa.Schema:
    """The history table's columns: the change log's source columns, then the version's key and validity."""
    return pa.schema(list(columns) + HISTORY_META)


def key_columns(shape: TableShape) -> tuple[str, ...]:
    """What tells a table's rows apart: its primary key, or (no key) all its columns (identical rows are then
    copies of one key, closed oldest first)."""
    return shape.primary_key or tuple(shape.column_names)


@dataclass
class Versions:
    """The versions one pass over a table's changes touched: `closed`, those it was given open and closed;
    `opened`, those it opened (closed again or still open). `open` maps each key to its open versions."""

    open: dict[str, list[dict[str, Any]]]
    key: tuple[str, ...]
    keyless: bool  # the key is the whole row (no primary key): identical rows are copies of one key
    seed: int | None = None  # the seq a snapshot seeded the history at: its versions are fixed at their first change
    closed: list[dict[str, Any]] = field(default_factory=list)
    opened: list[dict[str, Any]] = field(default_factory=list)

    def current(self) -> list[dict[str, Any]]:
        return [v for versions in self.open.values() for v in versions]


def key_text(row: dict[str, Any], key: Sequence[str]) -> str:
    return json.dumps([row.get(k) for k in key], default=str, ensure_ascii=False)


def start(open_versions: list[dict[str, Any]], shape: TableShape, seed: int | None = None) -> Versions:
    """The state before a pass: the versions open now (read from the history table), by key, under the table
    shape in force then; `seed`: the seq a snapshot seeded the history at (its table's SEED_SEQ_KEY).

    Each version is found by the key its values give at the pass's column types, which is its `_cdc_key` unless
    the change log has widened a key column's type since it opened (text to binary, an integer to text): a change
    read at the wider type still closes it (its `_cdc_key` stays, so its commit finds it in the table), and the
    versions opened from there on have the key at the wider type."""
    key = key_columns(shape)
    by_key: dict[str, list[dict[str, Any]]] = {}
    for v in sorted(open_versions, key=lambda v: v[VALID_FROM_SEQ]):
        by_key.setdefault(key_text(v, key), []).append(v)
    return Versions(by_key, key, not shape.primary_key, seed)


def is_dropped(version: dict[str, Any]) -> bool:
    """A seeded version found not to have existed (closed at the seq it opened at): deleted from the table."""
    return version[VALID_TO_SEQ] is not None and version[VALID_TO_SEQ] == version[VALID_FROM_SEQ]


def advance(state: Versions, columns: Sequence[pa.Field], changes: pa.Table) -> Versions:
    """`state` moved through a table's change-log rows (any order; taken by `_cdc_seq`), each as its operation's
    effect (core.ops.effect) says: the same answers the current-state rules and the sinks act on."""
    names = [f.name for f in columns]
    given = {id(v) for vs in state.open.values() for v in vs}
    rows = changes.sort_by("_cdc_seq").to_pylist()

    def close(version: dict[str, Any], seq: int, ts: dt.datetime, deleted: bool) -> None:
        version.update({VALID_TO: ts, VALID_TO_SEQ: seq, IS_CURRENT: False, DELETED: deleted})
        if id(version) in given:
            state.closed.append(version)

    def close_key(key: str, seq: int, ts: dt.datetime, deleted: bool) -> None:
        versions = state.open.get(key)
        if versions:
            close(versions.pop(0), seq, ts, deleted)
            if not versions:
                del state.open[key]

    def close_all(seq: int, ts: dt.datetime, deleted: bool) -> list[dict[str, Any]]:
        were = state.current()
        for version in were:
            close(version, seq, ts, deleted)
        state.open.clear()
        return were

    def seeded(key: str) -> dict[str, Any] | None:
        """The key's version the seed opened and no change has touched since, if any."""
        versions = state.open.get(key) if state.seed is not None else None
        if versions and versions[0][VALID_FROM_SEQ] == state.seed and id(versions[0]) in given:
            return versions[0]
        return None

    def fix(key: str, image: dict[str, Any]) -> None:  # the key's first change after the seed: its row then
        version = seeded(key)
        if version is not None:
            version.update({n: image.get(n) for n in names})

    def drop(key: str) -> None:  # the key was written anew: the seeded version (read after S) never was
        version = seeded(key)
        if version is not None:
            close(version, version[VALID_FROM_SEQ], version[VALID_FROM], True)
            state.open[key].pop(0)
            if not state.open[key]:
                del state.open[key]

    def open_version(values: dict[str, Any], seq: int, ts: dt.datetime) -> None:
        version = {n: values.get(n) for n in names}
        version.update(
            {KEY: key_text(version, state.key), VALID_FROM: ts, VALID_TO: None, VALID_FROM_SEQ: seq}
            | {VALID_TO_SEQ: None, IS_CURRENT: True, DELETED: False}
        )
        if not state.keyless:  # a keyed row written again: the old version ends here
            close_key(version[KEY], seq, ts, False)
        state.open.setdefault(version[KEY], []).append(version)
        state.opened.append(version)

    for row in rows:
        seq, ts = row["_cdc_seq"], row["_cdc_commit_ts"]
        does = effect(row["_cdc_op"])
        if does.row == BEFORE:  # the key's row goes: the change log's columns hold it, as they were
            key = key_text(row, state.key)
            fix(key, row)
            close_key(key, seq, ts, True)
        elif does.row == AFTER:  # the after-image is the key's row from here
            key = key_text(row, state.key)
            before = row["_cdc_before"] if does.had_row is not False else None
            if before is None:  # the key had no row: a seeded version of it (read after S) never was
                drop(key)
            else:  # the key's row until now: a key-changing update's is under the old key, which it leaves
                old = key_text(before, state.key) if does.moves_key else key
                fix(old, before)
                if key != old:
                    drop(key)
                close_key(old, seq, ts, old != key)
            open_version(row, seq, ts)
        if does.clears_table:
            close_all(seq, ts, True)
        if does.new_shape and row.get(DDL_COLUMN):
            change = SchemaChange.from_json(json.loads(row[DDL_COLUMN]))
            if change.after is None:
                continue
            were = close_all(seq, ts, False) if does.reshapes_rows else []
            state.key, state.keyless = key_columns(change.after), not change.after.primary_key
            for values in altered(were, change, columns, ts):
                open_version(values, seq, ts)
    return state


def altered(
    versions: list[dict[str, Any]], change: SchemaChange, columns: Sequence[pa.Field], ts: dt.datetime
) -> list[dict[str, Any]]:
    """The rows of `versions` as an ALTER TABLE leaves them (see stages.current.rows.reshape_rows): added columns take
    their default, renamed ones keep their values under the new name, modified ones are converted, dropped ones
    are NULL. Values are at the history's column types (`columns`, the change log's), as the change rows after the
    ALTER are, so a key reads the same from either (a key column changed between text and binary: its bytes)."""
    after = change.after
    assert after is not None
    if not versions:
        return []
    before = {c.name: c for c in change.before.columns} if change.before is not None else {}
    types = {f.name: f.type for f in columns}
    held = {f.name.lower(): f.name for f in columns}  # the versions' names (a column renamed in case: its newest)

    def at_history_type(values: pa.Array, name: str) -> list[Any]:
        return (cast_column(values, types[name]) if name in types else values).to_pylist()

    out: list[dict[str, Any]] = [{} for _ in versions]
    for spec in after.columns:
        if spec.name in change.defaults:
            value = _default_column(spec, change.defaults[spec.name], 1, ts)
            values = at_history_type(value, spec.name) * len(versions)
        else:
            old = change.renames.get(spec.name, spec.name)
            name = held.get(old.lower(), old)
            values = [v.get(name) for v in versions]
            if old in before and before[old] != spec:
                try:  # the values at the old column's type, from the history's (which holds old and new ones)
                    held_values = pa.array(values, types[name]) if name in types else pa.array(values)
                    typed = cast_column(held_values, arrow_type(before[old]))
                    converted = convert_column(typed, before[old], spec, change.flavor, ts, change.by_policy)
                    values = at_history_type(converted, spec.name)
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, InexactConversion):
                    pass  # the values as they are, at the history column's type
        for row, value in zip(out, values, strict=True):
            row[spec.name] = value
    return out


def version_rows(versions: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Versions as an Arrow table of the history schema."""
    return pa.Table.from_pylist(versions, schema=schema)


def schema_changes(changes: pa.Table) -> list[tuple[int, SchemaChange]]:
    """The schema changes among change-log rows, with their seqs, in order."""
    if DDL_COLUMN not in changes.column_names:
        return []
    rows = changes.select(["_cdc_seq", DDL_COLUMN]).filter(pc.is_valid(changes.column(DDL_COLUMN)))
    found = [
        (seq, SchemaChange.from_json(json.loads(ddl))) for seq, ddl in zip(*rows.to_pydict().values(), strict=True)
    ]
    return sorted(found, key=lambda e: e[0])


def shape_at(changes: list[tuple[int, SchemaChange]], seq: int | None, latest: TableShape) -> TableShape:
    """The table's shape just after `seq` (None: before every one of `changes`): that of the last schema change
    at or before it, else the one the first change after it started from, else `latest`."""
    done = [c for s, c in changes if seq is not None and s <= seq and c.after is not None]
    if done:
        assert done[-1].after is not None
        return done[-1].after
    later = [c for s, c in changes if (seq is None or s > seq) and c.before is not None]
    if later:
        assert later[0].before is not None
        return later[0].before
    return latest
