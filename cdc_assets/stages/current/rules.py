"""Every rule of applying changes to a current-state table, written once, on Arrow: the Arrow engine calls these
in the run's process (stages.current.apply), the Spark engine in its tasks (stages.current.spark_tasks), so the
two engines cannot disagree on a row. The rules: what a TRUNCATE leaves (`after_truncate`), the newest change
per key (`key_images`, `newest_per_key`, `newest_rows`), the seq guard of a keyed merge (`merged_with_outcomes`),
and a keyless table's copies (`copy_moves`, `copy_changes`). delta-rs's MERGE, the Arrow engine's fallback for
merges too large to hold, states the seq guard in its own SQL (test_engines_agree holds it to these)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import hashable, lists_from_bytes, sorted_rows, where, whole, with_lists_as_bytes
from cdc_assets.core.ops import AFTER, BEFORE, Effect, ops_where
from cdc_assets.core.shapes import TableShape
from cdc_assets.stages.changes.rows import cast_column, named_as
from cdc_assets.stages.current.rows import DUP_COLUMN, current_schema

ACTION_COLUMN = "_cdc_action"  # what the newest change of a key does: one of the two below
UPSERT_ACTION = "upsert"  # the key's row is the image (a change's after-image)
DELETE_ACTION = "delete"  # the key has no row (the image is a change's before-image, the row that went)
KEY_COLUMN = "_cdc_k"  # the change log's key text of an image: what picks the newest change of a key
WEIGHT_COLUMN = "_cdc_weight"  # keyless tables: +1 for a copy a change writes, -1 for one it removes
OUTCOME_COLUMN = "_cdc_outcome"  # kept, inserted, updated or deleted: what a merge did to a row (never written)


def after_truncate(rows: pa.Table, truncate_seq: int | None) -> pa.Table:
    """What a TRUNCATE at `truncate_seq` leaves of change-log or current-state rows: those after it (all without one)."""
    return rows if truncate_seq is None else where(rows, pc.greater(rows.column("_cdc_seq"), truncate_seq))


def image_schema(shape: TableShape) -> pa.Schema:
    """A row image in the current state's types, with its change's seq and time (no `_cdc_dup`)."""
    return pa.schema([f for f in current_schema(shape) if f.name != DUP_COLUMN])


def _images(rows: pa.Table, shape: TableShape, values: Any, extra: dict[str, pa.Array]) -> pa.Table:
    schema = image_schema(shape)
    names = shape.column_names
    arrays = [cast_column(values(rows, f.name), f.type) for f in schema if f.name in names]
    arrays += [rows.column("_cdc_seq"), rows.column("_cdc_commit_ts")]
    table = pa.Table.from_arrays([whole(a) if isinstance(a, pa.ChunkedArray) else a for a in arrays], schema=schema)
    for name, array in extra.items():
        table = table.append_column(name, array)
    return table


def _after(rows: pa.Table, name: str) -> Any:
    return rows.column(name)


def _before(rows: pa.Table, name: str) -> Any:
    return pc.struct_field(whole(rows.column("_cdc_before")), name)


def _ops(test: Callable[[Effect], bool]) -> pa.Array:
    """The operations whose effect (core.ops) passes `test`, to test a column of `_cdc_op` against."""
    return pa.array(ops_where(test), pa.string())


def key_images(changes: pa.Table, shape: TableShape) -> pa.Table:
    """Change-log rows (all under `shape`) as the rows they leave their keys (`upsert`, the after-image: inserts,
    updates, REPLACEs, repairs) and the keys they leave without one (`delete`, the before-image: deletes, and the
    old key of an update that moves a row to another key), with the key's text (`_cdc_key`), in the current state's
    types. Rows are independent: any batch of changes will do."""
    changes = named_as(changes, shape.column_names)  # the log keeps its first name of a column renamed in case alone
    op = changes.column("_cdc_op")
    writes = where(changes, pc.is_in(op, _ops(lambda e: e.row == AFTER)))
    moved = pc.and_kleene(
        pc.is_in(op, _ops(lambda e: e.moves_key)),
        pc.not_equal(changes.column("_cdc_before_key"), changes.column("_cdc_key")),
    )
    removes = where(changes, pc.fill_null(pc.or_kleene(pc.is_in(op, _ops(lambda e: e.row == BEFORE)), moved), False))

    def tagged(rows: pa.Table, key: str, action: str) -> dict[str, pa.Array]:
        return {KEY_COLUMN: whole(rows.column(key)), ACTION_COLUMN: pa.array([action] * rows.num_rows, pa.string())}

    return pa.concat_tables(
        [
            _images(writes, shape, _after, tagged(writes, "_cdc_key", UPSERT_ACTION)),
            _images(removes, shape, _before, tagged(removes, "_cdc_before_key", DELETE_ACTION)),
        ]
    )


def newest_per_key(images: pa.Table) -> pa.Table:
    """Of `key_images` (every image of each key present), the newest per key: the seq decides, as it orders every
    change of a table. Returns the images without `_cdc_k`, in their order. The join is of the keys, seqs and row
    numbers only: Acero joins no list column (a VECTOR)."""
    slim = pa.table(
        {KEY_COLUMN: images.column(KEY_COLUMN), "_cdc_seq": images.column("_cdc_seq"), _ROW: np.arange(images.num_rows)}
    )
    newest = slim.group_by(KEY_COLUMN, use_threads=False).aggregate([("_cdc_seq", "max")])
    newest = newest.rename_columns([KEY_COLUMN, "_cdc_seq"])
    rows = whole(slim.join(newest, keys=[KEY_COLUMN, "_cdc_seq"], join_type="inner", use_threads=False).column(_ROW))
    return images.take(rows.take(pc.sort_indices(rows))).drop_columns([KEY_COLUMN])


def newest_rows(changes: pa.Table, shape: TableShape, truncate_seq: int | None) -> pa.Table:
    """Per key, the newest of a table's change-log rows (all of them under `shape`): the row it upserts or the
    key it deletes (`_cdc_action`), in the current state's types. After a TRUNCATE only the changes that follow it
    count."""
    return newest_per_key(key_images(after_truncate(changes, truncate_seq), shape))


def copy_moves(changes: pa.Table, shape: TableShape) -> pa.Table:
    """A keyless table's change-log rows as the copies they add (`_cdc_weight` +1: each after-image an insert,
    update or repair writes) and remove (-1: each before-image an update, delete or repair replaces, where the key
    had a row), with the change's seq and time."""
    changes = named_as(changes, shape.column_names)
    op = changes.column("_cdc_op")
    writes = where(changes, pc.is_in(op, _ops(lambda e: e.row == AFTER)))
    replaced = _ops(lambda e: e.row is not None and e.had_row is not False)
    removes = where(changes, pc.and_(pc.is_in(op, replaced), pc.is_valid(changes.column("_cdc_before"))))
    return pa.concat_tables(
        [
            _images(writes, shape, _after, {WEIGHT_COLUMN: pa.array([1] * writes.num_rows, pa.int64())}),
            _images(removes, shape, _before, {WEIGHT_COLUMN: pa.array([-1] * removes.num_rows, pa.int64())}),
        ]
    )


def copy_changes(existing: pa.Table, moves: pa.Table, shape: TableShape) -> pa.Table:
    """A keyless table's rows (`existing`, in the current state's schema: all the copies of every distinct row the
    `moves` touch, and any others) with `copy_moves` applied, each marked with its `_cdc_outcome`: per distinct row
    the moves' net count of copies is added to the copies there are (never below none); copies numbered past what
    is left are `deleted`, the others `kept`, and new ones are `inserted` with the next `_cdc_dup` numbers and the
    newest move's seq and time."""
    schema = current_schema(shape)
    columns = shape.column_names
    net = with_lists_as_bytes(moves.select([*columns, WEIGHT_COLUMN, "_cdc_seq", "_cdc_commit_ts"]))
    net = net.group_by(columns, use_threads=False).aggregate(  # Arrow groups by no list (a VECTOR): as bytes
        [(WEIGHT_COLUMN, "sum"), ("_cdc_seq", "max"), ("_cdc_commit_ts", "max")]
    )
    net = lists_from_bytes(net, schema)
    existing = existing.select(schema.names).cast(schema)
    rows = [hashable(v) for v in zip(*(existing.column(c).to_pylist() for c in columns), strict=True)] if existing.num_rows else []
    have: dict[tuple, int] = {}
    for values in rows:
        have[values] = have.get(values, 0) + 1
    want: dict[tuple, int] = {}
    added: list[dict[str, Any]] = []
    for row in net.to_pylist():
        values = hashable(tuple(row[c] for c in columns))
        there = have.get(values, 0)
        want[values] = max(there + int(row[f"{WEIGHT_COLUMN}_sum"]), 0)
        meta = {"_cdc_seq": row["_cdc_seq_max"], "_cdc_commit_ts": row["_cdc_commit_ts_max"]}
        image = {c: row[c] for c in columns}
        added += [{**image, **meta, DUP_COLUMN: n} for n in range(there, want[values])]
    dups = existing.column(DUP_COLUMN).to_pylist()
    outcome = ["deleted" if v in want and dup >= want[v] else "kept" for v, dup in zip(rows, dups, strict=True)]
    kept = existing.append_column(OUTCOME_COLUMN, pa.array(outcome, pa.string()))
    inserted = pa.Table.from_pylist(added, schema=schema).append_column(
        OUTCOME_COLUMN, pa.array(["inserted"] * len(added), pa.string())
    )
    return pa.concat_tables([kept, inserted])


_CHANGE = "\x00change."
_ROW = "\x00row"  # a row's number in the rows, or its change's after them


def merge_rows(existing: pa.Table, newest: pa.Table, key: list[str]) -> tuple[pa.Table, dict[str, int]]:
    """Current-state rows (those of the files a change may touch) with the newest changes applied
    (`merged_with_outcomes`). Returns the rows to write, sorted by key, and how many were inserted, updated and
    deleted.

    With a single-column key only the rows whose key changed go through the join: a few hundred changes spread
    over the files of a large table then cost a filter and a sort of their rows, not a join of all of them."""
    if len(key) == 1 and existing.num_rows > newest.num_rows:
        hit = pc.is_in(existing.column(key[0]), value_set=whole(newest.column(key[0])))
        merged, counts = _merge_joined(where(existing, hit), newest, key)
        rest = where(existing, pc.invert(hit))
        return _interleaved(rest, merged, key[0]), counts
    return _merge_joined(existing, newest, key)


INTERLEAVE_MAX_ROWS = 10_000  # changed rows put in place by slices; more are sorted in with the rest


def _interleaved(rest: pa.Table, merged: pa.Table, key: str) -> pa.Table:
    """`rest` and `merged` (each sorted by an integer `key`, no key in both) as one table sorted by it: slices of
    `rest` with each merged row between them, no copy of `rest` (a sort would copy every column); a sort when the
    key is not an integer, `rest` is not in order or there are many merged rows."""
    kind = rest.schema.field(key).type
    if pa.types.is_integer(kind) and 0 < merged.num_rows <= INTERLEAVE_MAX_ROWS and rest.num_rows:
        keys = rest.column(key).to_numpy()
        if bool(np.all(keys[1:] > keys[:-1])):
            at = np.searchsorted(keys, merged.column(key).to_numpy())
            parts, start = [], 0
            for row, position in enumerate(at.tolist()):
                parts += [rest.slice(start, position - start), merged.slice(row, 1)]
                start = position
            parts.append(rest.slice(start))
            return pa.concat_tables(parts)
    return sorted_rows(pa.concat_tables([rest, merged]), [(key, "ascending")])


def _merge_joined(existing: pa.Table, newest: pa.Table, key: list[str]) -> tuple[pa.Table, dict[str, int]]:
    merged, counts = written_rows(merged_with_outcomes(existing, newest, key))
    return sorted_rows(merged, [(k, "ascending") for k in key]), counts


def written_rows(marked: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """Of rows marked with their `_cdc_outcome`, those a merge writes (all but the deleted, without the mark), and
    how many were inserted, updated and deleted."""
    outcome = marked.column(OUTCOME_COLUMN)
    counts = {name: int(pc.sum(pc.equal(outcome, name)).as_py() or 0) for name in ("inserted", "updated", "deleted")}
    return where(marked, pc.not_equal(outcome, "deleted")).drop_columns([OUTCOME_COLUMN]), counts


def merged_with_outcomes(existing: pa.Table, newest: pa.Table, key: list[str]) -> pa.Table:
    """The seq guard of a keyed table's merge: current-state rows (`existing`) and the newest change per key
    (`newest_rows`) as the rows the merge leaves, each with its `_cdc_outcome`. A change newer than its key's row
    replaces it (`updated`) or deletes it (`deleted`); a change not newer than the row's `_cdc_seq` is ignored, so
    replaying changes is a no-op (`kept`); an upsert of a key with no row is `inserted`, and a delete of a key with
    no row does nothing (no row). Rows come in no particular order.

    The join is of the keys, seqs and row numbers only: Acero joins no list column (a VECTOR), and each other
    column is then gathered once, from the row or from its change."""
    schema = existing.schema
    rows = pa.array(np.arange(existing.num_rows, dtype=np.int64))
    changes = pa.array(np.arange(existing.num_rows, existing.num_rows + newest.num_rows, dtype=np.int64))
    left = existing.select([*key, "_cdc_seq"]).append_column(_ROW, rows)
    # the changes' columns apart from the rows' under a prefix no identifier holds (a NUL)
    right = newest.select([*key, "_cdc_seq", ACTION_COLUMN]).append_column(_ROW, changes)
    right = right.rename_columns([c if c in key else f"{_CHANGE}{c}" for c in right.column_names])
    joined = left.join(right, keys=key, join_type="full outer", use_threads=False)
    t_seq, s_seq = joined.column("_cdc_seq"), joined.column(f"{_CHANGE}_cdc_seq")
    absent = pc.is_null(t_seq)
    newer = pc.fill_null(pc.greater(s_seq, t_seq), False)
    take = pc.or_(absent, newer)
    deletes = pc.fill_null(pc.equal(joined.column(f"{_CHANGE}{ACTION_COLUMN}"), DELETE_ACTION), False)
    outcome = pc.case_when(
        pc.make_struct(pc.and_(newer, deletes), newer, absent),
        pa.scalar("deleted"), pa.scalar("updated"), pa.scalar("inserted"), pa.scalar("kept"),
    )  # fmt: skip
    source_row = pc.if_else(take, joined.column(f"{_CHANGE}{_ROW}"), joined.column(_ROW))  # into rows + changes
    arrays = [
        joined.column(f.name)
        if f.name in key
        else pa.chunked_array(
            existing.column(f.name).chunks + newest.column(f.name).cast(f.type).chunks, f.type
        ).take(source_row)
        for f in schema
    ]
    merged = pa.Table.from_arrays(arrays, schema=schema).append_column(OUTCOME_COLUMN, outcome)
    return where(merged, pc.invert(pc.and_(absent, deletes)))  # a delete of a key with no row: no row
