"""stages.history.rows without a server: the versions a run of change-log rows opens and closes, and a second pass
that starts from the first one's open versions giving what one pass over all the rows gives."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.stages.history.rows import advance, is_dropped, start

T = TableRef("s", "t")
COLUMNS = [pa.field("id", pa.int32()), pa.field("v", pa.string())]
BEFORE = pa.struct(COLUMNS)


def _shape(key: tuple[str, ...]) -> TableShape:
    return TableShape(T, (ColumnSpec("id", "int"), ColumnSpec("v", "varchar")), key)


def _changes(*rows: tuple) -> pa.Table:
    """(op, id, v, before) per change, seqs 1, 2, 3… a second apart."""
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return pa.table(
        {
            "id": [r[1] for r in rows],
            "v": [r[2] for r in rows],
            "_cdc_op": [r[0] for r in rows],
            "_cdc_seq": pa.array(range(1, len(rows) + 1), pa.int64()),
            "_cdc_commit_ts": pa.array([base + dt.timedelta(seconds=i) for i in range(len(rows))], pa.timestamp("us", "UTC")),
            "_cdc_before": pa.array([r[3] for r in rows], BEFORE),
        }
    )


def _versions(state) -> list[tuple]:
    every = {id(v): v for v in state.closed + state.opened + state.current()}.values()
    return sorted((v["id"], v["v"], v["_cdc_valid_from_seq"], v["_cdc_valid_to_seq"], v["_cdc_deleted"]) for v in every)


def test_keyed_versions_and_a_pass_in_two_parts() -> None:
    changes = _changes(
        ("insert", 1, "a", None),
        ("insert", 2, "b", None),
        ("update", 1, "A", {"id": 1, "v": "a"}),
        ("update", 20, "b", {"id": 2, "v": "b"}),  # a key change
        ("delete", 1, "A", {"id": 1, "v": "A"}),
        ("insert", 1, "again", None),  # a re-insert
        ("truncate", None, None, None),
        ("insert", 3, "c", None),
    )
    expected = [
        (1, "A", 3, 5, True),
        (1, "a", 1, 3, False),
        (1, "again", 6, 7, True),
        (2, "b", 2, 4, True),
        (3, "c", 8, None, False),
        (20, "b", 4, 7, True),
    ]
    whole = advance(start([], _shape(("id",))), COLUMNS, changes)
    assert _versions(whole) == expected
    first = advance(start([], _shape(("id",))), COLUMNS, changes.slice(0, 4))
    second = advance(start(first.current(), _shape(("id",))), COLUMNS, changes.slice(4))
    closed_later = {(v["id"], v["_cdc_valid_from_seq"]) for v in second.closed}
    assert closed_later == {(1, 3), (20, 4)}  # the versions the first part left open, closed by the second
    combined = {(v[0], v[2]): v for v in _versions(first)} | {(v[0], v[2]): v for v in _versions(second)}
    assert sorted(combined.values()) == expected


def test_keyless_copies_close_oldest_first() -> None:
    changes = _changes(
        ("insert", 1, "x", None),
        ("insert", 1, "x", None),
        ("delete", 1, "x", {"id": 1, "v": "x"}),
    )
    state = advance(start([], _shape(())), COLUMNS, changes)
    assert [(v["id"], v["_cdc_valid_from_seq"]) for v in state.current()] == [(1, 2)]
    assert _versions(state) == [(1, "x", 1, 3, True), (1, "x", 2, None, False)]


def test_seeded_versions_are_fixed_at_their_first_change() -> None:
    """A Spark snapshot at seq 0 read its rows later: 1 after its update, 3 after its insert, 50 after 5 moved
    there. Each seeded version ends up as the row was at seq 0, and those that did not exist then are dropped."""
    taken = dt.datetime(2025, 12, 31, tzinfo=dt.UTC)

    def seeded(i: int, v: str) -> dict:
        validity = {"_cdc_valid_from": taken, "_cdc_valid_to": None, "_cdc_valid_from_seq": 0, "_cdc_valid_to_seq": None}
        return {"id": i, "v": v, "_cdc_key": f"[{i}]", "_cdc_is_current": True, "_cdc_deleted": False} | validity

    changes = _changes(
        ("update", 1, "a-later", {"id": 1, "v": "a"}),
        ("delete", 2, "b", {"id": 2, "v": "b"}),
        ("insert", 3, "c-new", None),
        ("update", 50, "e", {"id": 5, "v": "e"}),
        ("update", 4, "d2", {"id": 4, "v": "d"}),
    )
    rows = [seeded(1, "a-later"), seeded(2, "b"), seeded(3, "c-new"), seeded(4, "d"), seeded(50, "e")]
    state = advance(start(rows, _shape(("id",)), seed=0), COLUMNS, changes)
    dropped = sorted(v["id"] for v in state.closed if is_dropped(v))
    assert dropped == [3, 50]
    kept = [v for v in state.closed + state.opened + state.current() if not is_dropped(v)]
    assert _versions(type(state)({}, (), False, closed=kept)) == [
        (1, "a", 0, 1, False),  # the row at seq 0, not as the snapshot read it
        (1, "a-later", 1, None, False),
        (2, "b", 0, 2, True),
        (3, "c-new", 3, None, False),
        (4, "d", 0, 5, False),
        (4, "d2", 5, None, False),
        (50, "e", 4, None, False),
    ]
    unseeded = advance(start([seeded(1, "a-later")], _shape(("id",))), COLUMNS, changes.slice(0, 1))
    assert _versions(unseeded) == [(1, "a-later", 0, 1, False), (1, "a-later", 1, None, False)]  # no seed: as read
