"""What a change-log row's `_cdc_op` says, and what it does to the row of its key: the names, one table of their
effects (`EFFECTS`) and the one function that reads it (`effect`). The current-state rules of both engines, the
history and the sinks all ask `effect` (or `ops_where`, for a vectorised rule), so no two of them can disagree on an
operation. Other modules are to name an operation by these constants, not by its string.

Row changes come from the binlog (`insert`, `update`, `delete`) or from `cdc-lakehouse repair` (`repair`: the row
as the source holds it at the repair's point, written whether the lakehouse had the key or not; `repair_delete`:
a row the source does not hold, removed). The schema changes change a table's columns or the table itself
(`create`, `alter`, `drop`; a TRUNCATE is its own statement), or say that a statement changed its rows without
row events (`rows_removed`: a partition emptied or dropped; `rows_changed`: a partition exchanged or converted), which
only a repair can make up for (lake/repair_marks).

A change log keeps a row change's after-image in the table's own columns, with its key in `_cdc_key`, and its
before-image in `_cdc_before`, with its key in `_cdc_before_key`; a remove keeps the row it removes in both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"
REPAIR = "repair"
REPAIR_DELETE = "repair_delete"
TRUNCATE = "truncate"  # also the `kind` of a TRUNCATE statement in a raw batch
CREATE = "create"  # this and the others below are also a schema change's `action` (core.shapes.SchemaChange)
ALTER = "alter"
DROP = "drop"
ROWS_REMOVED = "rows_removed"
ROWS_CHANGED = "rows_changed"

AFTER = "after"  # a row change's after-image: the key's row once it is done
BEFORE = "before"  # its before-image: the key's row it found


@dataclass(frozen=True)
class Effect:
    """What one operation does to the row of its key, and to its table.

    row: AFTER, the key's row afterwards is the after-image (it exists); BEFORE, the key has no row afterwards and
    the before-image is the row that went; None, a statement, of no one key.
    had_row: True, the before-image is the key's row before it; False, the key had none (an insert, whatever
    `_cdc_before` holds); None, as `_cdc_before` says (a repair: the lakehouse's row, where it had one).
    moves_key: an after-image under another key than the before-image's removes the old key's row.
    clears_table: every row written before it goes.
    schema_change: a statement on the table's columns, the table itself or its rows without row events: it
    carries `_cdc_ddl`, ends a current-state span and is a sink's schema_change message.
    new_shape: the table's columns and key are its `_cdc_ddl`'s `after` from here on.
    reshapes_rows: the rows there are go on at that shape (an ALTER's added, renamed, converted columns).
    unlogged: its rows changed without row events: the table owes a repair.
    repair: written by `cdc-lakehouse repair`, not read from the binlog.
    """

    row: str | None
    had_row: bool | None
    moves_key: bool
    clears_table: bool
    schema_change: bool
    new_shape: bool
    reshapes_rows: bool
    unlogged: bool
    repair: bool


# One row per operation; read across: what it does to its key's row, then to its table.
# fmt: off
EFFECTS: dict[str, Effect] = {
    #                     row     had_row  moves_key  clears_table  schema_change  new_shape  reshapes_rows  unlogged  repair
    INSERT:        Effect(AFTER,  False,   False,     False,        False,         False,     False,         False,    False),
    UPDATE:        Effect(AFTER,  True,    True,      False,        False,         False,     False,         False,    False),
    REPAIR:        Effect(AFTER,  None,    False,     False,        False,         False,     False,         False,    True),
    DELETE:        Effect(BEFORE, True,    False,     False,        False,         False,     False,         False,    False),
    REPAIR_DELETE: Effect(BEFORE, True,    False,     False,        False,         False,     False,         False,    True),
    TRUNCATE:      Effect(None,   None,    False,     True,         False,         False,     False,         False,    False),
    CREATE:        Effect(None,   None,    False,     False,        True,          True,      False,         False,    False),
    ALTER:         Effect(None,   None,    False,     False,        True,          True,      True,          False,    False),
    DROP:          Effect(None,   None,    False,     True,         True,          False,     False,         False,    False),
    ROWS_REMOVED:  Effect(None,   None,    False,     False,        True,          False,     False,         True,     False),
    ROWS_CHANGED:  Effect(None,   None,    False,     False,        True,          False,     False,         True,     False),
}
# fmt: on


def effect(op: str) -> Effect:
    """What `op` does to its key's row and its table. An op the table does not hold is a change log this code
    cannot read (a newer version wrote it, or a bug did): guessing would apply it wrongly, so it raises."""
    found = EFFECTS.get(op)
    if found is None:
        raise ValueError(f"unknown change-log operation {op!r}: the known ones are {', '.join(EFFECTS)}")
    return found


def ops_where(test: Callable[[Effect], bool]) -> tuple[str, ...]:
    """Every operation whose effect passes `test`, in the table's order: what a vectorised rule compares a column of
    `_cdc_op` with (pyarrow's is_in, Spark's isin, SQL's IN)."""
    return tuple(op for op, does in EFFECTS.items() if test(does))


WRITES = ops_where(lambda e: e.row == AFTER)  # the after-image is the key's row
REMOVES = ops_where(lambda e: e.row == BEFORE)  # the before-image is gone
ROW_OPS = ops_where(lambda e: e.row is not None)  # every change made row by row
REPAIRS = ops_where(lambda e: e.repair)
UNLOGGED_ROWS = ops_where(lambda e: e.unlogged)  # rows changed without row events: the table owes a repair
SCHEMA_OPS = ops_where(lambda e: e.schema_change)
