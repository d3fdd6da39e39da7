"""Which published messages the broker has not confirmed yet, and whether the next one may go out before they are.

A broker that refuses one message (a RabbitMQ nack) may have accepted later ones already, so a message must not
be in flight while an earlier message it has to follow is unconfirmed: then a refused message, sent again, still
reaches the queue before every later message of its key. What a message has to follow:
- a change of a table with a primary key: the earlier messages of its key, and of its table's table-wide ones;
- a change of a table without a primary key: the earlier changes of rows with the same values as a row it removes
  or adds (its rows have no identity, but changes of distinct values commute), and the table-wide ones;
- a table-wide message (a TRUNCATE, a schema change): every earlier message of its table.
Messages of distinct keys go out together, so a window of distinct keys is still published in one go.
"""

from __future__ import annotations

from collections import Counter
from itertools import takewhile

from cdc_assets.sinks.events import SinkEvent


def table_wide(event: SinkEvent) -> bool:
    return event.table is not None and (event.broadcast or (event.key is None and not event.row_values))


def units(event: SinkEvent) -> list[tuple[str, str]]:
    """The keys, or row values, a change that is not table-wide must stay in order with."""
    assert event.table is not None
    if event.key is not None:
        return [(event.table, "key:" + event.key)]
    return [(event.table, "row:" + values) for values in event.row_values]


class InFlight:
    """Messages published and not yet confirmed, by delivery tag."""

    def __init__(self) -> None:
        self.events: dict[int, SinkEvent] = {}
        self._tables: Counter[str] = Counter()  # messages in flight per table
        self._table_wide: Counter[str] = Counter()
        self._keys: Counter[tuple[str, str]] = Counter()

    def __bool__(self) -> bool:
        return bool(self.events)

    def can_go(self, event: SinkEvent) -> bool:
        """Whether `event` may be published now without passing an unconfirmed message it must follow."""
        if event.table is None:  # a heartbeat follows nothing
            return True
        if table_wide(event):
            return self._tables[event.table] == 0
        return self._table_wide[event.table] == 0 and all(self._keys[unit] == 0 for unit in units(event))

    def add(self, tag: int, event: SinkEvent) -> None:
        self.events[tag] = event
        if event.table is None:
            return
        self._tables[event.table] += 1
        if table_wide(event):
            self._table_wide[event.table] += 1
        else:
            for unit in units(event):
                self._keys[unit] += 1

    def settle(self, tag: int, multiple: bool) -> dict[int, SinkEvent]:
        """The messages a confirm (ack or nack) of `tag` settles (every tag up to it when `multiple`), by tag."""
        if multiple:  # the dict holds tags in the order published, ascending: stop at the first above `tag`
            tags = list(takewhile(lambda t: t <= tag, self.events))
        else:
            tags = [tag] if tag in self.events else []
        settled = {}
        for t in tags:
            event = settled[t] = self.events.pop(t)
            if event.table is None:
                continue
            _release(self._tables, event.table)
            if table_wide(event):
                _release(self._table_wide, event.table)
            else:
                for unit in units(event):
                    _release(self._keys, unit)
        return settled


def _release(counts: Counter, unit: object) -> None:
    """One message of `unit` settled; a unit with none left is forgotten (a run may touch millions of keys)."""
    counts[unit] -= 1
    if counts[unit] <= 0:
        del counts[unit]
