"""core.ops without a server: what each change operation does to its key's row and to its table, as a table to
check at a glance, and every caller doing just that to a one-key example: the history's `advance`, the current-state
rules (and the plan that cuts a table's changes at its statements), the sinks' envelope replayed as a consumer would,
and the messages the delivery check expects. A caller that decided an operation on its own would differ here."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import (
    AFTER,
    ALTER,
    BEFORE,
    CREATE,
    DELETE,
    DROP,
    EFFECTS,
    INSERT,
    REPAIR,
    REPAIR_DELETE,
    ROWS_CHANGED,
    ROWS_REMOVED,
    TRUNCATE,
    UPDATE,
    Effect,
    effect,
)
from cdc_assets.core.shapes import SchemaChange, TableShape
from cdc_assets.sinks.consume import Received
from cdc_assets.sinks.delivery import owed_messages, replayed_rows
from cdc_assets.sinks.events import SCHEMA_CHANGE, ShapeTimeline, TableColumns, table_events
from cdc_assets.stages.changes.rows import change_log_schema
from cdc_assets.stages.current.rows import current_schema
from cdc_assets.stages.current.rules import (
    after_truncate,
    copy_changes,
    copy_moves,
    merge_rows,
    newest_rows,
    written_rows,
)
from cdc_assets.stages.current.steps import SchemaStep, Span, table_plan
from cdc_assets.stages.history.rows import (
    DELETED,
    IS_CURRENT,
    KEY,
    VALID_FROM,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_SEQ,
    Versions,
    advance,
    is_dropped,
    key_columns,
    start,
)

# Read across: what the operation leaves of its key's row, what its before-image is, then what it does to the table.
EFFECTS_AT_A_GLANCE = """
| op            | key's row afterwards | before-image is | moves key | clears table | schema change | new shape | reshapes rows | unlogged | repair |
|---------------|----------------------|-----------------|-----------|--------------|---------------|-----------|---------------|----------|--------|
| insert        | after-image          | no row          |           |              |               |           |               |          |        |
| update        | after-image          | the key's row   | yes       |              |               |           |               |          |        |
| repair        | after-image          | if given        |           |              |               |           |               |          | yes    |
| delete        | none                 | the key's row   |           |              |               |           |               |          |        |
| repair_delete | none                 | the key's row   |           |              |               |           |               |          | yes    |
| truncate      |                      |                 |           | yes          |               |           |               |          |        |
| create        |                      |                 |           |              | yes           | yes       |               |          |        |
| alter         |                      |                 |           |              | yes           | yes       | yes           |          |        |
| drop          |                      |                 |           | yes          | yes           |           |               |          |        |
| rows_removed  |                      |                 |           |              | yes           |           |               | yes      |        |
| rows_changed  |                      |                 |           |              | yes           |           |               | yes      |        |
"""
ROW_WORDS: dict[str, str | None] = {"after-image": AFTER, "none": BEFORE, "": None}
HAD_ROW_WORDS: dict[str, bool | None] = {"the key's row": True, "no row": False, "if given": None, "": None}


def _table_as_read() -> dict[str, Effect]:
    lines = [line for line in EFFECTS_AT_A_GLANCE.strip().splitlines()[2:]]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    return {
        op: Effect(ROW_WORDS[row], HAD_ROW_WORDS[had_row], *(flag == "yes" for flag in flags))
        for op, row, had_row, *flags in cells
    }


def test_each_operation_does_what_its_line_of_the_table_says() -> None:
    assert list(_table_as_read().items()) == list(EFFECTS.items())
    assert [effect(op) for op in EFFECTS] == list(EFFECTS.values())
    with pytest.raises(ValueError, match="unknown change-log operation 'upsert'"):
        effect("upsert")


T = TableRef("s", "t")
COLUMNS = (ColumnSpec("id", "varchar", length=10), ColumnSpec("v", "varchar", length=10))
KEYED = TableShape(T, COLUMNS, ("id",))
KEYLESS = TableShape(T, COLUMNS, ())
NEW_KEY = TableShape(T, COLUMNS, ("v",))  # the shape a CREATE or an ALTER leaves: another key
FIELDS = [pa.field("id", pa.string()), pa.field("v", pa.string())]
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
OLD, NEW, MOVED, OTHER = {"id": "a", "v": "old"}, {"id": "a", "v": "new"}, {"id": "b", "v": "new"}, {"id": "c", "v": "other"}
START = [OLD, OTHER]  # inserted at seqs 1 and 2; each example's operation comes at seq 3


@dataclass(frozen=True)
class Example:
    """One change-log row of an operation: its images as capture or a repair writes them."""

    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    keyless_too: bool = True  # a repair of a table without a key adds or removes copies, never both


EXAMPLES = [
    Example(INSERT, None, MOVED),
    Example(INSERT, OLD, MOVED),  # a before-image an insert carried would not be its key's row
    Example(UPDATE, OLD, NEW),
    Example(UPDATE, OLD, MOVED),  # to another key
    Example(REPAIR, OLD, NEW, keyless_too=False),  # the source's row over the lakehouse's
    Example(REPAIR, None, MOVED),  # the source's row where the lakehouse had none
    Example(DELETE, OLD, None),
    Example(REPAIR_DELETE, OLD, None),
    *(Example(op, None, None) for op in (TRUNCATE, CREATE, ALTER, DROP, ROWS_REMOVED, ROWS_CHANGED)),
]
CASES = [(e, s) for e in EXAMPLES for s in (KEYED, KEYLESS) if s is KEYED or e.keyless_too]
def _case_id(example: Example, shape: TableShape) -> str:
    images = " to ".join(f"{i['id']}={i['v']}" for i in (example.before, example.after) if i is not None)
    return f"{example.op} {images} {'keyed' if shape.primary_key else 'keyless'}".replace("  ", " ")


CASE_IDS = [_case_id(e, s) for e, s in CASES]


def test_every_operation_has_an_example() -> None:
    assert {e.op for e in EXAMPLES} == set(EFFECTS)


def _key(image: dict[str, Any] | None, shape: TableShape) -> str | None:
    return None if image is None else json.dumps([image[c] for c in key_columns(shape)])


def _ddl(op: str, shape: TableShape) -> str | None:
    befores_and_afters = {CREATE: (None, NEW_KEY), ALTER: (shape, NEW_KEY), DROP: (shape, None)}
    befores_and_afters |= {ROWS_REMOVED: (shape, shape), ROWS_CHANGED: (shape, shape)}
    if op not in befores_and_afters:
        return None
    return json.dumps(SchemaChange(T, op, *befores_and_afters[op]).to_json())


def _log_row(seq: int, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, shape: TableShape) -> dict[str, Any]:
    """As the change-log stage writes it: the after-image in the columns (the removed row for a remove)."""
    image = after or before or {}
    return {
        **{c.name: image.get(c.name) for c in COLUMNS},
        "_cdc_op": op,
        "_cdc_seq": seq,
        "_cdc_commit_ts": T0 + dt.timedelta(seconds=seq),
        "_cdc_gtid": None,
        "_cdc_batch": "b",
        "_cdc_before": before,
        "_cdc_key": _key(after, shape) or _key(before, shape),
        "_cdc_before_key": _key(before, shape),
        "_cdc_ddl": _ddl(op, shape),
    }


def _log(example: Example, shape: TableShape) -> pa.Table:
    rows = [_log_row(1, INSERT, None, OLD, shape), _log_row(2, INSERT, None, OTHER, shape)]
    rows.append(_log_row(3, example.op, example.before, example.after, shape))
    return pa.Table.from_pylist(rows, schema=change_log_schema(shape, with_ddl=True))


def _rows(images: Any) -> list[tuple[Any, Any]]:
    return sorted((r["id"], r["v"]) for r in images)


def _said(example: Example, shape: TableShape) -> dict[str | None, dict[str, Any]]:
    """The table's rows by key once the operation is done, as `effect` says: a table cleared has none; the key's row
    is the after-image, or gone; a before-image that was its key's row goes where the after-image moves the key."""
    does = effect(example.op)
    rows = {_key(r, shape): r for r in ([] if does.clears_table else START)}
    before = example.before if does.had_row is not False else None
    if does.row == BEFORE:
        rows.pop(_key(example.before, shape))
    if does.row == AFTER:
        if before is not None and does.moves_key:
            rows.pop(_key(before, shape), None)
        rows[_key(example.after, shape)] = example.after
    return rows


@pytest.mark.parametrize(("example", "shape"), CASES, ids=CASE_IDS)
def test_the_history_does_what_the_operation_says(example: Example, shape: TableShape) -> None:
    does = effect(example.op)
    state = advance(start([], shape), FIELDS, _log(example, shape))
    assert _rows(state.current()) == _rows(_said(example, shape).values())
    gone = {_key(r, shape) for r in START} - set(_said(example, shape))
    assert {_key(v, shape) for v in state.opened if v[DELETED]} == gone  # closed as deleted: the rows that left
    untouched = [v for v in state.current() if v["id"] == OTHER["id"]]
    assert [v[VALID_FROM_SEQ] for v in untouched] == ([] if does.clears_table else [3 if does.reshapes_rows else 2])
    assert state.key == key_columns(NEW_KEY if does.new_shape else shape)
    if example.after is not None:
        _seeded_versions_follow_whether_the_key_had_a_row(example, shape, does)


def _seeded_versions_follow_whether_the_key_had_a_row(example: Example, shape: TableShape, does: Effect) -> None:
    """A snapshot seeded at seq 2 read the rows after it, the example's after-image among them: the seeded version of
    a key the operation found without a row never was (dropped), one it found with a row is fixed to that row."""
    assert example.after is not None
    seeded = {_key(r, shape): r for r in [*START, example.after]}
    versions = [
        {**r, KEY: k, VALID_FROM: T0, VALID_TO: None, VALID_FROM_SEQ: 2, VALID_TO_SEQ: None, IS_CURRENT: True, DELETED: False}
        for k, r in seeded.items()
    ]
    state: Versions = advance(start(versions, shape, seed=2), FIELDS, _log(example, shape).slice(2))
    before = example.before if does.had_row is not False else None
    had_no_row = before is None or (does.moves_key and _key(before, shape) != _key(example.after, shape))
    assert {v[KEY] for v in state.closed if is_dropped(v)} == ({_key(example.after, shape)} if had_no_row else set())


@pytest.mark.parametrize(("example", "shape"), CASES, ids=CASE_IDS)
def test_the_current_state_rules_do_what_the_operation_says(example: Example, shape: TableShape) -> None:
    """Both engines call these rules; the plan cuts a table's changes at its statements on both, as `run` reads them."""
    does = effect(example.op)
    log = _log(example, shape)
    statements = [r for r in log.to_pylist() if effect(r["_cdc_op"]).row is None]
    plan = table_plan(statements, shape, 0, 3, lambda lower, upper: True)
    assert [s.seq for s in plan if isinstance(s, SchemaStep)] == ([3] if does.schema_change else [])
    truncates = [s.truncate_seq for s in plan if isinstance(s, Span) and s.truncate_seq is not None]
    assert truncates == ([3] if does.clears_table and not does.schema_change else [])
    if does.schema_change:
        return  # applied by the stage's schema step (current-state DDL), not by these rules
    rows = current_schema(shape).empty_table()
    for span in [s for s in plan if isinstance(s, Span)]:
        seqs = log.column("_cdc_seq")
        changes = log.filter(pc.and_(pc.greater(seqs, span.after), pc.less_equal(seqs, span.upto)))
        if span.truncate_seq is not None:
            rows = current_schema(shape).empty_table()  # every row written before it goes
        if shape.primary_key:
            rows, _ = merge_rows(rows, newest_rows(changes, span.shape, span.truncate_seq), list(shape.primary_key))
        else:
            moves = copy_moves(after_truncate(changes, span.truncate_seq), span.shape)
            rows, _ = written_rows(copy_changes(rows, moves, span.shape))
    assert _rows(rows.to_pylist()) == _rows(_said(example, shape).values())


@pytest.mark.parametrize(("example", "shape"), CASES, ids=CASE_IDS)
def test_the_sinks_send_what_the_operation_says(example: Example, shape: TableShape) -> None:
    does = effect(example.op)
    log = _log(example, shape)
    events = table_events(T, log, ShapeTimeline([], TableColumns(("id", "v"), shape.primary_key)), lambda: 0)
    bodies = [json.loads(e.body) for e in events if e.seq == 3]
    sent = [(b["id"], SCHEMA_CHANGE if b["type"] == SCHEMA_CHANGE else b["op"]) for b in bodies]
    row = log.slice(2).to_pylist()[0]
    owed = owed_messages(str(T), bool(shape.primary_key), 3, row["_cdc_op"], row["_cdc_key"], row["_cdc_before_key"])
    assert sent == [(e.id, e.kind) for e in owed]  # the delivery check expects what the envelope sends
    if does.row is not None:
        before = example.before if does.had_row is not False else None
        assert [b["after"] for b in bodies if b["after"] is not None] == ([example.after] if does.row == AFTER else [])
        assert [b["before"] for b in bodies if b["before"] is not None] == ([before] if before is not None else [])
    if shape.primary_key:  # a consumer applies keyed tables' messages by key
        replayed = replayed_rows([Received("queue", e.id, json.loads(e.body)) for e in events])
        assert _rows(replayed.get(str(T), {}).values()) == _rows(_said(example, shape).values())
