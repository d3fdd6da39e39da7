"""What a change-log row's `_cdc_op` says, and what it does to the row of its key: one vocabulary every engine,
the history, the checks and the sinks read, so no two of them can disagree on an operation.

Row changes come from the binlog (`insert`, `update`, `delete`) or from `cdc-lakehouse repair` (`repair`: the row
as the source holds it at the repair's point, written whether the lakehouse had the key or not; `repair_delete`:
a row the source does not hold, removed). The schema changes change a table's columns or the table itself
(`create`, `alter`, `drop`; a TRUNCATE is its own statement), or say that a statement changed its rows without
row events (`rows_removed`: a partition emptied or dropped; `rows_changed`: a partition exchanged or converted), which
only a repair can make up for (lake/repair_marks).
"""

from __future__ import annotations

INSERT = "insert"
UPDATE = "update"
DELETE = "delete"
REPAIR = "repair"
REPAIR_DELETE = "repair_delete"

WRITES = (INSERT, UPDATE, REPAIR)  # the row after the change (its after-image) is the key's row
REMOVES = (DELETE, REPAIR_DELETE)  # the row before the change (its before-image) is gone
ROW_OPS = WRITES + REMOVES  # every change made row by row
REPAIRS = (REPAIR, REPAIR_DELETE)
ROWS_REMOVED = "rows_removed"
ROWS_CHANGED = "rows_changed"
UNLOGGED_ROWS = (ROWS_REMOVED, ROWS_CHANGED)  # rows changed without row events: the table owes a repair
SCHEMA_OPS = ("create", "alter", "drop", *UNLOGGED_ROWS)
TRUNCATE = "truncate"  # every row written before it goes
