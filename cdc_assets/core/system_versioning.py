"""MariaDB's system-versioned tables (`WITH SYSTEM VERSIONING`) as their current rows, which is what `SELECT *` shows.

Such a table has two invisible system columns, `row_start` and `row_end`, and MariaDB adds `row_end` to its primary
key. The binlog logs history as rows: an UPDATE is an update of the current row and an insert of the old version
(its `row_end` the time it ended); a DELETE is an update that ends the current row. The lakehouse keeps the current
rows only: a row whose `row_end` is not the maximum is history (an insert of one is left out; an update that ends a
row is the row's delete), and the two system columns are neither in the images nor in the shape. A pure function
over decoded images: capture calls it for a table whose key holds `row_end` (`versioned_columns`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from cdc_assets.core.ops import DELETE, INSERT, UPDATE
from cdc_assets.core.shapes import TableShape

ROW_START, ROW_END = "row_start", "row_end"
# the end of a current row: MariaDB's largest TIMESTAMP (10.11; 2106 from 11.5 on) or transaction id
_OPEN_ENDS = ("2038-01-19 03:14:07.999999", "2106-02-07 06:28:15.999999", "18446744073709551615")

Image = list[str | None]


@dataclass(frozen=True)
class VersionedColumns:
    """Where a system-versioned table's system columns are, and its shape without them."""

    start: int
    end: int
    shape: TableShape  # the table as SELECT * shows it: no system columns, `row_end` out of the key


def versioned_columns(shape: TableShape) -> VersionedColumns | None:
    """The system columns of a system-versioned table's binlog shape (None: not one)."""
    names = [c.name for c in shape.columns]
    if ROW_START not in names or ROW_END not in names or ROW_END not in shape.primary_key:
        return None
    start, end = names.index(ROW_START), names.index(ROW_END)
    columns = tuple(c for i, c in enumerate(shape.columns) if i not in (start, end))
    key = tuple(k for k in shape.primary_key if k != ROW_END)
    return VersionedColumns(start, end, replace(shape, columns=columns, primary_key=key))


def _current(image: Image | None, end: int) -> bool:
    return image is not None and image[end] in _OPEN_ENDS


def _without(image: Image | None, versioned: VersionedColumns) -> Image | None:
    if image is None:
        return None
    return [v for i, v in enumerate(image) if i != versioned.start and i != versioned.end]


def current_row_changes(
    versioned: VersionedColumns, op: str, befores: Sequence[Image | None], afters: Sequence[Image | None]
) -> Iterator[tuple[str, list[Image | None], list[Image | None]]]:
    """A row event's changes of the current rows, in order, as runs of one operation: (op, befores, afters)."""
    runs: list[tuple[str, list[Image | None], list[Image | None]]] = []
    end = versioned.end
    for before, after in zip(befores, afters, strict=True):
        if op == INSERT:
            kept = (INSERT, None, after) if _current(after, end) else None
        elif op == UPDATE:
            if _current(after, end):
                kept = (UPDATE, before, after) if _current(before, end) else (INSERT, None, after)
            else:
                kept = (DELETE, before, None) if _current(before, end) else None
        else:
            kept = (DELETE, before, None) if _current(before, end) else None  # DELETE HISTORY removes history
        if kept is None:
            continue
        kind, old, new = kept
        if not runs or runs[-1][0] != kind:
            runs.append((kind, [], []))
        runs[-1][1].append(_without(old, versioned))
        runs[-1][2].append(_without(new, versioned))
    yield from runs
