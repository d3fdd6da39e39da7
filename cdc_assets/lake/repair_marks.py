"""Tables whose rows a statement changed without row events, until a repair has made them equal again.

Some statements change rows the binlog never shows one by one: a partition emptied, dropped or exchanged with
another table (`ALTER TABLE … TRUNCATE | DROP | EXCHANGE | CONVERT PARTITION`). Capture records them as schema
changes of the tables they touch (`rows_removed`, `rows_changed`: core.ops), the change log keeps them, and:

- the current-state stage, reaching one, marks its table here (`_state/repair/<schema>/<table>.json`): the table
  owes a repair from that seq;
- the checks and `verify` report a marked table as differing, with the sentence that names `repair`;
- `cdc-lakehouse sync` repairs the tables its capture found such statements for (and every marked one), right after
  capturing; `cdc-lakehouse repair` does too. A repair at a point past the statement records `repaired_through`:
  the mark is settled, and the statement, reached later by a stage or seen by a comparison, asks nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ROWS_REMOVED
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import MissingObject, ObjectStore

REPAIR_STATE = f"{STATE}/repair"


@dataclass(frozen=True)
class RepairMark:
    """What a table owes: the statements (seq, action) past its last repair, and the seq that repair reached."""

    table: str
    pending: tuple[tuple[int, str], ...] = ()
    repaired_through: int | None = None

    def settled(self, seq: int) -> bool:
        """Whether a repair at or after `seq` has made up for the statement there."""
        return self.repaired_through is not None and seq <= self.repaired_through

    def sentence(self) -> str:
        seq, action = self.pending[0]
        what = "removed rows" if action == ROWS_REMOVED else "changed rows"
        return (
            f"{self.table}: a statement at _cdc_seq {seq} {what} without row events (a partition emptied, dropped or "
            f"exchanged): the next `cdc-lakehouse sync` repairs it, as `cdc-lakehouse repair {self.table}` does"
        )

    def to_json(self) -> dict[str, Any]:
        return {"pending": [list(p) for p in self.pending], "repaired_through": self.repaired_through}


def _key(table: str) -> str:
    return f"{REPAIR_STATE}/{TableRef.parse(table).path}.json"


def load_mark(store: ObjectStore, table: str) -> RepairMark:
    try:
        data = json.loads(store.get(_key(table)))
    except MissingObject:
        return RepairMark(table)
    return RepairMark(table, tuple((int(s), str(a)) for s, a in data.get("pending", [])), data.get("repaired_through"))


def _save(store: ObjectStore, mark: RepairMark) -> None:
    store.put(_key(mark.table), json.dumps(mark.to_json()).encode())


def mark_for_repair(store: ObjectStore, table: str, seq: int, action: str) -> RepairMark:
    """Record that the statement at `seq` changed `table`'s rows without row events (idempotent); a statement a
    repair has already made up for records nothing."""
    mark = load_mark(store, table)
    if mark.settled(seq) or (seq, action) in mark.pending:
        return mark
    mark = RepairMark(table, tuple(sorted({*mark.pending, (seq, action)})), mark.repaired_through)
    _save(store, mark)
    return mark


def repaired(store: ObjectStore, table: str, through: int) -> None:
    """A repair made `table` equal to its source at a point whose changes end at seq `through`: every statement up
    to there is made up for."""
    mark = load_mark(store, table)
    if mark.repaired_through is not None and mark.repaired_through >= through:
        return
    _save(store, RepairMark(table, tuple(p for p in mark.pending if p[0] > through), through))


def owing_repair(store: ObjectStore, tables: Collection[str]) -> dict[str, RepairMark]:
    """The tables (of `tables`) marked and not yet repaired."""
    marks = {t: load_mark(store, t) for t in tables}
    return {t: m for t, m in marks.items() if m.pending}
