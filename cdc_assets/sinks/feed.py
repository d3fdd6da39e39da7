"""What a sink still owes: the changes of its tables' change logs (`changes/<schema>/<table>`) above its
checkpoint, as messages merged across tables in `_cdc_seq` order, a window at a time. A sink needs no binlog
reader of its own: it follows the change logs, which hold every change exactly once."""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import max_seq, read_query
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE
from cdc_assets.lake.state import load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.sinks.checkpoint import SinkCheckpoint
from cdc_assets.sinks.events import ShapeTimeline, SinkEvent, TableColumns, table_events
from cdc_assets.sinks.settings import SinkSettings

READ_ROWS = 5_000  # the most change-log rows read per table and query
# rows held at once across all tables (as messages): a table's query reads this divided by the tables behind, so a
# backlog over thousands of tables does not need memory in proportion to them
READ_BUDGET_ROWS = 200_000


def sink_tables(lakehouse: Lakehouse, sink: SinkSettings) -> list[TableRef]:
    """The change logs the sink publishes: every table of `changes/` its globs include."""
    return sorted(t for t in lakehouse.tables(CHANGES) if sink.includes(t.schema, t.table))


def _ddl_rows(rows: pa.Table) -> list[tuple[int, dict]]:
    if "_cdc_ddl" not in rows.column_names:
        return []
    found = rows.filter(pc.is_valid(rows.column("_cdc_ddl")))
    return [(int(s), json.loads(d)) for s, d in zip(found.column("_cdc_seq").to_pylist(), found.column("_cdc_ddl").to_pylist(), strict=True)]


def _timeline(lakehouse: Lakehouse, table: TableRef, log: DeltaTable, whole_log: pa.Table | None = None) -> ShapeTimeline:
    """The table's shapes over its change log, from its schema-change rows: those of `whole_log` when the caller
    has read every row already, else a query of them."""
    names = [f.name for f in log.schema().to_arrow()]
    if whole_log is not None:
        ddl_rows = _ddl_rows(whole_log)
    elif "_cdc_ddl" in names:
        ddl_rows = _ddl_rows(read_query(log, "SELECT _cdc_seq, _cdc_ddl FROM changes WHERE _cdc_ddl IS NOT NULL", "changes"))
    else:
        ddl_rows = []
    shape = load_progress(lakehouse.store, CHANGES_STAGE, str(table)).shape
    if shape is not None:
        fallback = TableColumns(tuple(shape.column_names), tuple(shape.primary_key))
    else:  # no shape recorded: every source column of the log, keyed by the whole row
        fallback = TableColumns(tuple(n for n in names if not n.startswith("_cdc_")), ())
    return ShapeTimeline(ddl_rows, fallback)


@dataclass
class _Cursor:
    """One table's change log read in order above `read_after`, a query at a time, up to `top` (its highest
    `_cdc_seq` when the feed opened it)."""

    table: TableRef
    log: DeltaTable
    read_after: int
    top: int
    chunk_rows: int = READ_ROWS
    timeline: ShapeTimeline | None = None
    buffer: deque[SinkEvent] = field(default_factory=deque)

    def head(self, lakehouse: Lakehouse, built_ms: Callable[[], int]) -> SinkEvent | None:
        while not self.buffer and self.read_after < self.top:
            rows = read_query(
                self.log,
                f"SELECT * FROM changes WHERE _cdc_seq > {self.read_after} ORDER BY _cdc_seq LIMIT {self.chunk_rows}",
                "changes",
            )
            if self.timeline is None:  # a first read of the whole log holds every schema-change row: no query
                whole = self.read_after == 0 and rows.num_rows < self.chunk_rows
                self.timeline = _timeline(lakehouse, self.table, self.log, rows if whole else None)
            if rows.num_rows == 0:
                self.read_after = self.top
                break
            self.read_after = int(pc.max(rows.column("_cdc_seq")).as_py())
            self.buffer.extend(table_events(self.table, rows, self.timeline, built_ms))
        return self.buffer[0] if self.buffer else None


@dataclass
class Window:
    """Messages to publish together, in order, and per table the highest `_cdc_seq` they cover (the
    checkpoint moves there once all are acknowledged)."""

    events: list[SinkEvent]
    table_seqs: dict[str, int]
    held_back: bool = False  # stopped at a change younger than the de-duplication window


class ChangeFeed:
    """The messages a sink owes, merged across its tables in `_cdc_seq` order."""

    def __init__(self, lakehouse: Lakehouse, sink: SinkSettings, checkpoint: SinkCheckpoint, built_ms: Callable[[], int]) -> None:
        self.lakehouse = lakehouse
        self.built_ms = built_ms
        self.cursors: list[_Cursor] = []
        for table in sink_tables(lakehouse, sink):
            log = lakehouse.open(CHANGES, table)
            top = max_seq(log)
            after = checkpoint.seq_of(str(table))
            if log is not None and top is not None and top > after:
                self.cursors.append(_Cursor(table, log, after, top))
        chunk = max(100, min(READ_ROWS, READ_BUDGET_ROWS // max(1, len(self.cursors))))
        for cursor in self.cursors:
            cursor.chunk_rows = chunk
        self.heap: list[tuple[int, int]] = []
        for index, cursor in enumerate(self.cursors):
            self._push(index, cursor)

    def _push(self, index: int, cursor: _Cursor) -> None:
        head = cursor.head(self.lakehouse, self.built_ms)
        if head is not None:
            heapq.heappush(self.heap, (head.seq, index))

    def opened(self) -> dict[TableRef, tuple[DeltaTable, int]]:
        """The change logs the feed found behind the checkpoint, with their highest seq then (for the lag)."""
        return {c.table: (c.log, c.top) for c in self.cursors}

    def next_window(self, max_events: int, hold_after: float | None = None) -> Window:
        """The next messages in `_cdc_seq` order: about `max_events` (the messages of one change are never split),
        stopping before the first change committed after `hold_after` (seconds since the epoch) when given."""
        events: list[SinkEvent] = []
        table_seqs: dict[str, int] = {}
        while self.heap and len(events) < max_events:
            seq, index = self.heap[0]
            cursor = self.cursors[index]
            if hold_after is not None and cursor.buffer[0].commit_ts > hold_after:
                return Window(events, table_seqs, held_back=True)
            heapq.heappop(self.heap)
            while cursor.buffer and cursor.buffer[0].seq == seq:
                events.append(cursor.buffer.popleft())
            table_seqs[str(cursor.table)] = seq
            self._push(index, cursor)
        return Window(events, table_seqs)
