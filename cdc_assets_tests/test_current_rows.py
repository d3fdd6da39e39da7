"""The rules of applying changes, which both engines call on Arrow batches (the Arrow engine in the run's process,
Spark in its tasks): the newest change per key, the seq guard of a keyed merge, a keyless table's copies, what a
TRUNCATE leaves; and a keyed table's copy on write: the files a change may touch (no server needed)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa

from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.stages.changes.rows import change_log_schema
from cdc_assets.stages.current.rows import (
    DUP_COLUMN,
    current_schema,
    home_files,
    pieces,
    range_groups,
    touched_by,
)
from cdc_assets.stages.current.rules import (
    OUTCOME_COLUMN,
    copy_changes,
    copy_moves,
    merge_rows,
    newest_rows,
)

SHAPE = TableShape(TableRef("s", "t"), (ColumnSpec("id", "int"), ColumnSpec("v", "varchar", length=10)), ("id",))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _change(seq: int, op: str, key: int | None, v: str | None, before_key: int | None = None, before_v: str | None = None) -> dict:
    return {
        "id": key if op != "delete" else before_key,
        "v": v,
        "_cdc_op": op,
        "_cdc_seq": seq,
        "_cdc_commit_ts": T0 + dt.timedelta(seconds=seq),
        "_cdc_gtid": None,
        "_cdc_batch": "b",
        "_cdc_before": None if before_key is None else {"id": before_key, "v": before_v},
        "_cdc_key": json.dumps([str(key if op != "delete" else before_key)]),
        "_cdc_before_key": None if before_key is None else json.dumps([str(before_key)]),
    }


def _current(rows: list[tuple[int, str, int]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "v": v, "_cdc_seq": seq, "_cdc_commit_ts": T0 + dt.timedelta(seconds=seq)} for i, v, seq in rows],
        schema=current_schema(SHAPE),
    )


def test_the_newest_change_per_key_merged_into_the_rows_it_touches() -> None:
    changes = pa.Table.from_pylist(
        [
            _change(6, "update", 1, "a", 1, "one"),
            _change(7, "delete", None, None, 2, "two"),
            _change(8, "insert", 4, "four"),
            _change(9, "update", 5, "three", 3, "three"),  # the row moves from key 3 to key 5
            _change(10, "update", 1, "b", 1, "a"),
            _change(11, "insert", 2, "back"),  # deleted, then inserted again
            _change(12, "update", 6, "old", 6, "six"),  # older than the row (seq 20): ignored
        ],
        schema=change_log_schema(SHAPE),
    )
    newest = newest_rows(changes, SHAPE, None)
    assert sorted((r["id"], r["_cdc_seq"], r["_cdc_action"]) for r in newest.to_pylist()) == [
        (1, 10, "upsert"), (2, 11, "upsert"), (3, 9, "delete"), (4, 8, "upsert"), (5, 9, "upsert"), (6, 12, "upsert"),
    ]  # fmt: skip
    existing = _current([(1, "one", 5), (2, "two", 5), (3, "three", 5), (6, "six", 20)])
    merged, counts = merge_rows(existing, newest, ["id"])
    assert [(r["id"], r["v"], r["_cdc_seq"]) for r in merged.to_pylist()] == [
        (1, "b", 10), (2, "back", 11), (4, "four", 8), (5, "three", 9), (6, "six", 20),
    ]  # fmt: skip
    assert counts == {"inserted": 2, "updated": 2, "deleted": 1}
    assert merged.schema == current_schema(SHAPE)


def test_after_a_truncate_only_later_changes_count_and_a_delete_of_nothing_does_nothing() -> None:
    changes = pa.Table.from_pylist(
        [_change(3, "insert", 1, "before"), _change(5, "insert", 2, "after"), _change(6, "delete", None, None, 9, "x")],
        schema=change_log_schema(SHAPE),
    )
    newest = newest_rows(changes, SHAPE, truncate_seq=4)
    merged, counts = merge_rows(_current([]), newest, ["id"])
    assert [(r["id"], r["v"]) for r in merged.to_pylist()] == [(2, "after")]
    assert counts == {"inserted": 1, "updated": 0, "deleted": 0}


KEYLESS = TableShape(TableRef("s", "k"), (ColumnSpec("v", "varchar", length=10),), ())


def _keyless_change(seq: int, op: str, v: str | None, before_v: str | None = None) -> dict:
    return {
        "v": v,
        "_cdc_op": op,
        "_cdc_seq": seq,
        "_cdc_commit_ts": T0 + dt.timedelta(seconds=seq),
        "_cdc_gtid": None,
        "_cdc_batch": "b",
        "_cdc_before": None if before_v is None else {"v": before_v},
        "_cdc_key": None,
        "_cdc_before_key": None,
    }


def test_a_keyless_table_keeps_as_many_copies_of_a_row_as_its_changes_leave() -> None:
    existing = pa.Table.from_pylist(
        [
            {"v": v, "_cdc_seq": 1, "_cdc_commit_ts": T0, DUP_COLUMN: dup}
            for v, dup in (("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0))
        ],
        schema=current_schema(KEYLESS),
    )
    changes = pa.Table.from_pylist(
        [
            _keyless_change(5, "delete", None, "a"),  # one copy of three goes
            _keyless_change(6, "update", "b", "c"),  # c becomes a second b
            _keyless_change(7, "insert", "d"),
            _keyless_change(8, "insert", "d"),
            _keyless_change(9, "delete", None, "d"),  # two written, one removed: one d
            _keyless_change(10, "delete", None, "z"),  # a copy that is not there: none left, never fewer
        ],
        schema=change_log_schema(KEYLESS),
    )
    marked = copy_changes(existing, copy_moves(changes, KEYLESS), KEYLESS)
    outcomes = sorted((r["v"], r[DUP_COLUMN], r[OUTCOME_COLUMN], r["_cdc_seq"]) for r in marked.to_pylist())
    assert outcomes == [
        ("a", 0, "kept", 1), ("a", 1, "kept", 1), ("a", 2, "deleted", 1),
        ("b", 0, "kept", 1), ("b", 1, "inserted", 6),
        ("c", 0, "deleted", 1),
        ("d", 0, "inserted", 9),
    ]  # fmt: skip


def test_a_change_touches_the_files_whose_key_range_holds_its_key() -> None:
    ranges = [
        {"path": "a", "min": {"id": 1}, "max": {"id": 10}},
        {"path": "b", "min": {"id": 11}, "max": {"id": 20}},
        {"path": "c", "min": {"id": 21}, "max": {"id": 30}},
        {"path": "d", "min": {"id": None}, "max": {"id": None}},  # no statistics: may hold any key
    ]
    keys = pa.table({"id": pa.array([5, 25, 40], pa.int32())})
    assert touched_by(keys, ranges) == {"a", "c", "d"}


RANGES = [
    {"path": "a", "min": {"id": 1}, "max": {"id": 10}},
    {"path": "b", "min": {"id": 21}, "max": {"id": 30}},
    {"path": "c", "min": {"id": 41}, "max": {"id": 50}},
]


def test_a_new_key_joins_the_file_just_below_it_so_no_file_of_its_own_is_opened() -> None:
    keys = pa.table({"id": pa.array([5, 15, 60, 0], pa.int32())})  # 5 is a's already; 15 past a, 60 past c, 0 below a
    assert home_files(keys, RANGES) == {"a", "c"}
    assert home_files(pa.table({"id": pa.array([25], pa.int32())}), RANGES) == set()
    two_columns = pa.table({"id": pa.array([60], pa.int32()), "v": pa.array(["x"])})
    assert home_files(two_columns, RANGES) == set()  # a key of several columns: new rows go to a file of their own
    unbounded = [*RANGES, {"path": "d", "min": {"id": None}, "max": {"id": None}}]
    assert home_files(keys, unbounded) == set()


def test_merged_rows_are_cut_where_a_files_key_range_ends_so_no_file_spans_another() -> None:
    rows = pa.table({"id": pa.array([0, 3, 15, 22, 29, 35, 41, 60], pa.int32())})
    parts = range_groups(rows, ["id"], RANGES)
    assert [p.column("id").to_pylist() for p in parts] == [[0, 3, 15], [22, 29, 35], [41, 60]]
    overlapping = [*RANGES, {"path": "e", "min": {"id": 8}, "max": {"id": 22}}]  # a, e and b overlap: one part
    assert [p.column("id").to_pylist() for p in range_groups(rows, ["id"], overlapping)] == [[0, 3, 15, 22, 29, 35], [41, 60]]


def test_rewritten_rows_are_written_as_pieces_of_at_least_the_piece_size_and_under_twice_it() -> None:
    assert pieces(10, 100.0, 1000) == [(0, 10)]  # 1,000 bytes: one piece
    assert pieces(5, 100.0, 1000) == [(0, 5)]  # fewer rows than a piece: all of them
    parts = pieces(35, 100.0, 1000)
    assert [length for _, length in parts] == [11, 12, 12] and parts[0][0] == 0 and sum(n for _, n in parts) == 35
    assert all(10 <= length < 20 for _, length in parts)


def test_rows_in_key_order_are_written_as_pieces_each_a_stretch_of_consecutive_keys(tmp_path) -> None:
    import pyarrow.parquet as pq

    from cdc_assets.lake.files import FileAccess, write_files

    ids = pa.array(range(100_000), pa.int64())
    parts = [pa.table({"id": ids.slice(n, 30_000), "v": pa.array([f"row {i}" for i in range(n, min(n + 30_000, 100_000))])}) for n in range(0, 100_000, 30_000)]
    actions = list(write_files(FileAccess(str(tmp_path)), "t", "s.t", parts, piece_bytes=16 * 1024))
    assert len(actions) > 10
    read = [pq.read_table(tmp_path / "t" / a["path"]).column("id").to_pylist() for a in actions]
    assert [i for ids in read for i in ids] == list(range(100_000))  # every row once, in order, file after file
    assert all(16 * 1024 * 0.7 <= a["size"] < 2 * 16 * 1024 for a in actions[1:-1])  # the first one measures


def test_few_changes_into_many_rows_are_put_in_place_in_key_order() -> None:
    """The path that joins only the changed rows and slices them in among the others gives what the full join gives."""
    existing = _current([(i, f"r{i}", 5) for i in range(0, 2000, 2)])  # even keys
    changes = pa.Table.from_pylist(
        [
            _change(6, "update", 10, "ten", 10, "r10"),
            _change(7, "delete", None, None, 500, "r500"),
            _change(8, "insert", 7, "seven"),  # between two rows
            _change(9, "insert", 5001, "past the end"),
            _change(10, "update", 4, "old", 4, "r4"),
        ],
        schema=change_log_schema(SHAPE),
    )
    newest = newest_rows(changes, SHAPE, None)
    fast, counts = merge_rows(existing, newest, ["id"])
    from cdc_assets.stages.current.rules import _merge_joined

    full, full_counts = _merge_joined(existing, newest, ["id"])
    assert fast.to_pylist() == full.to_pylist() and counts == full_counts
    ids = fast.column("id").to_pylist()
    assert ids == sorted(ids) and 7 in ids and 5001 in ids and 500 not in ids
    assert counts == {"inserted": 2, "updated": 2, "deleted": 1}
