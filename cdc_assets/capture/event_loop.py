"""Reading the binlog as a replica (cdc_assets.capture.binlog) and feeding each event to a `BatchBuilder`
(capture/batch_builder), which cuts it into raw batches at transaction boundaries: `capture_batches`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from cdc_assets.capture.batch_builder import BatchBuilder, classify_query, xa_statement
from cdc_assets.capture.binlog.compression import (
    MARIADB_COMPRESSED_ROWS,
    MARIADB_QUERY_COMPRESSED,
    MARIADB_UNCOMPRESSED_TYPE,
    expand_payloads,
    mariadb_decompressed,
)
from cdc_assets.capture.binlog.events import (
    FORMAT_DESCRIPTION,
    MARIADB_GTID,
    MARIADB_GTID_STANDALONE,
    MYSQL_GTID,
    MYSQL_GTID_TAGGED,
    MYSQL_PREVIOUS_GTIDS,
    QUERY,
    ROTATE,
    ROW_EVENTS,
    TABLE_MAP,
    XA_PREPARE,
    XID,
    format_post_header_lengths,
    mariadb_gtid,
    mysql_gtid,
    mysql_previous_gtids,
    mysql_tagged_gtid,
    query_text,
    refuse_unreadable,
    rotate_target,
    xa_prepare_is_one_phase,
)
from cdc_assets.capture.binlog.protocol import RawEvent, dump_events
from cdc_assets.capture.binlog.row_images import RowDecoder
from cdc_assets.capture.binlog.table_map import TableMap, parse_table_map, table_map_table, with_known_types
from cdc_assets.core import mysql_charsets
from cdc_assets.core.column_policy import ColumnPolicy, Rules
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition, binlog_file_number
from cdc_assets.core.settings import MySQLUrl, TableFilter
from cdc_assets.core.shapes import SchemaChange, TableShape, is_sequence
from cdc_assets.core.system_versioning import VersionedColumns, current_row_changes, versioned_columns
from cdc_assets.lake.raw_batches import RawBatch
from cdc_assets.source import server as source
from cdc_assets.source.server import ServerInfo


@dataclass(frozen=True)
class CaptureOptions:
    table_filter: TableFilter
    server_id: int
    max_batch_rows: int
    left_out: frozenset[str] = frozenset()  # tables quarantined at capture (lake/quarantine): read as if excluded
    policy: ColumnPolicy = field(default_factory=ColumnPolicy)  # column policies (core/column_policy)


def capture_batches(
    url: MySQLUrl,
    server: ServerInfo,
    start: BinlogPosition,
    start_gtid: str | None,
    next_seq: int,
    end: BinlogPosition,
    options: CaptureOptions,
    schemas: dict[TableRef, TableShape] | None = None,
    hold_for_xa: bool = True,
    recorded_rules: dict[str, Rules] | None = None,
    policy_changes: list[tuple[SchemaChange, Rules]] | None = None,
) -> Iterator[RawBatch]:
    """Batches from `start` up to `end` (a transaction boundary), each ending at a boundary.

    The caller makes each batch durable before asking for the next one, so the stream position
    never runs far ahead of what is written.
    """
    end = end.in_epoch(start.epoch)  # the server's position, named in the epoch capture follows it in
    if not start < end:
        return
    gtid_state = GtidState.parse(start_gtid)
    if server.flavor == "mysql" and server.has_gtid and start.log_pos > 4 and _executed_set_unknown(gtid_state):
        gtid_state = executed_set_at(url, options.server_id, start)
    builder = BatchBuilder(
        start=start,
        next_seq=next_seq,
        gtid_state=gtid_state,
        max_rows=options.max_batch_rows,
        server=server.to_json(),
        schemas=dict(schemas or {}),
        table_filter=options.table_filter,
        hold_for_xa=hold_for_xa,
        policy=options.policy,
        recorded_rules=recorded_rules,
    )
    builder.policy_changed(policy_changes or [])
    conn = source.connect(url)
    charsets = source.ServerCharsets(url)  # the rare charsets Python has no exact codec for: the server converts
    mysql_charsets.use_server(charsets.table, charsets.value)
    try:
        events = expand_payloads(dump_events(conn, options.server_id, start))  # compressed transactions as if plain
        yield from _batches(events, builder, end, options, server)
    finally:
        conn.close()
        charsets.close()


def _executed_set_unknown(state: GtidState) -> bool:
    """Whether a MySQL checkpoint's GTID state is not the executed set there: none (captured before the server had
    GTIDs), or the last GTID per source, as checkpoints once kept it."""
    return not state.executed or state.last_gtids_only()


def executed_set_at(url: MySQLUrl, server_id: int, position: BinlogPosition) -> GtidState:
    """MySQL's executed GTID set at `position` (a transaction boundary), read from its binlog file: the set before the
    file (its PREVIOUS_GTIDS) and every transaction from the file's start up to the position."""
    state = GtidState()
    log_file = None
    conn = source.connect(url)
    try:
        for event in dump_events(conn, server_id, BinlogPosition(position.log_file, 4)):
            if event.type == ROTATE:
                log_file = rotate_target(event.body)[0]
                continue
            if log_file != position.log_file or (event.log_pos and event.log_pos > position.log_pos):
                break
            if event.type == MYSQL_PREVIOUS_GTIDS:
                state.update(mysql_previous_gtids(event.body))
            elif event.type == MYSQL_GTID:
                state.add(mysql_gtid(event.body))
            elif event.type == MYSQL_GTID_TAGGED:
                state.add(mysql_tagged_gtid(event.body))
    finally:
        conn.close()
    return state


@dataclass
class _TableMaps:
    """Table maps by binlog table id, each parsed once per distinct definition (the same bytes arrive before
    every transaction that touches the table); None for a table the filter leaves out, whose map is read no
    further than its name."""

    mariadb: bool
    table_filter: TableFilter
    post_header_length: int = 8
    left_out: set[str] = field(default_factory=set)  # quarantined tables: never parsed, their rows never read
    by_id: dict[int, tuple[TableMap, RowDecoder] | None] = field(default_factory=dict)
    _parsed: dict[bytes, tuple[TableRef, TableShape | None, tuple[TableMap, RowDecoder] | None]] = field(default_factory=dict)

    def leave_out(self, table: TableRef) -> None:
        """From now on `table` is read as if excluded (it was quarantined)."""
        self.left_out.add(str(table))
        for key, mapped in list(self.by_id.items()):
            if mapped is not None and mapped[0].table == table:
                self.by_id[key] = None
        for body, (named, shape, _) in list(self._parsed.items()):
            if named == table:
                self._parsed[body] = (named, shape, None)

    def read(self, body: bytes, schemas: dict[TableRef, TableShape]) -> tuple[TableMap, RowDecoder] | None:
        """The map and its row decoder; `schemas` (capture's shapes now) tell MariaDB's UUID and INET columns, so a
        map is parsed again only when its table's known shape is another object than when it was parsed."""
        seen = self._parsed.get(body)
        if seen is not None and (not self.mariadb or schemas.get(seen[0]) is seen[1]):
            known = seen[2]
        else:
            table = table_map_table(body, self.post_header_length)[1]
            shape = schemas.get(table) if self.mariadb else None
            known = None
            if self.table_filter.matches(table.schema, table.table) and str(table) not in self.left_out:
                table_map = with_known_types(parse_table_map(body, self.mariadb, self.post_header_length), shape)
                # a MariaDB SEQUENCE's row is the server's state, not data: skipped as an excluded table is
                known = None if self.mariadb and is_sequence(table_map.shape) else (table_map, RowDecoder(table_map))
            self._parsed[body] = (table, shape, known)
        self.by_id[int.from_bytes(body[:6], "little")] = known
        return known


def _batches(
    events: Iterator[RawEvent], builder: BatchBuilder, end: BinlogPosition, options: CaptureOptions, server: ServerInfo
) -> Iterator[RawBatch]:
    """Feed the builder from binlog events, cutting a batch at the first boundary past `max_rows`."""
    with _no_cycle_collection():
        yield from _read_events(events, builder, end, options, server)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Capture makes millions of short-lived lists and strings, and no reference cycles: the cyclic garbage
    collector would only walk the growing batch again and again (about 5% of capture time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_events(
    events: Iterator[RawEvent], builder: BatchBuilder, end: BinlogPosition, options: CaptureOptions, server: ServerInfo
) -> Iterator[RawBatch]:
    maps = _TableMaps(server.flavor == "mariadb", options.table_filter, left_out=set(options.left_out))
    post_headers = b""
    log_file = builder.start.log_file
    epoch = builder.start.epoch
    file_number = binlog_file_number(log_file)
    end_key = end.sort_key
    shapes: dict[int, TableShape] = {}  # binlog table id -> the shape of a captured table
    versioned: dict[int, VersionedColumns | None] = {}  # binlog table id -> its system columns, if it has them
    in_transaction = False  # between BEGIN (or a non-standalone MariaDB GTID) and its COMMIT / Xid
    xa_id: str | None = None  # the XID of the XA transaction being read (from its XA END)
    for event in events:
        kind = event.type
        if kind == ROTATE:
            log_file = rotate_target(event.body)[0]
            file_number = binlog_file_number(log_file)
            continue
        if kind == FORMAT_DESCRIPTION:
            post_headers = format_post_header_lengths(event.body)
            maps.post_header_length = _post_header(post_headers, TABLE_MAP, 8)
            continue
        if kind not in _CAPTURED:
            refuse_unreadable(kind)
            continue
        end_pos = event.log_pos
        if not in_transaction and not (file_number, end_pos - event.size) < end_key:
            # `end` is a boundary and this event starts at or after it (say, after a rotation's
            # file headers): stop before the next transaction rather than overshoot.
            builder.advance_idle_to(end)
            break
        if kind == MYSQL_PREVIOUS_GTIDS:  # a new file's start: not an event of a transaction
            builder.previous_gtids(mysql_previous_gtids(event.body))
            continue
        boundary = False
        if kind == TABLE_MAP:
            try:
                mapped = maps.read(event.body, builder.schemas)
            except Exception as exc:  # noqa: BLE001 - the table's own map: it alone is left out (lake/quarantine)
                table = table_map_table(event.body, maps.post_header_length)[1]
                builder.quarantine(table, exc, BinlogPosition(log_file, end_pos - event.size, epoch))
                maps.leave_out(table)
                maps.by_id[int.from_bytes(event.body[:6], "little")] = None
                continue
            if mapped is not None and not builder.skipping:  # a skipped transaction's maps may be of older shapes
                table_map = mapped[0]
                versioned[table_map.table_id] = versioned_columns(table_map.shape)
                shape = versioned[table_map.table_id].shape if versioned[table_map.table_id] else table_map.shape
                shapes[table_map.table_id] = shape
                builder.version_of(shape)
            continue
        if kind in ROW_EVENTS or kind in MARIADB_COMPRESSED_ROWS:
            table_id = int.from_bytes(event.body[:6], "little")
            if table_id not in maps.by_id:  # no table map read for it (the stream resumed inside a statement)
                continue
            builder.count_event()
            known = maps.by_id[table_id]
            if known is None or builder.skipping:  # a table capture leaves out: its rows are not read (nor decompressed)
                continue
            body = event.body
            if kind in MARIADB_COMPRESSED_ROWS:
                plain = MARIADB_UNCOMPRESSED_TYPE[kind]
                kind, body = mariadb_decompressed(kind, body, _post_header(post_headers, plain, 8 if plain < 30 else 10))
            decoder = known[1]
            try:
                befores, afters = decoder.rows(kind, body, _post_header(post_headers, kind, 8 if kind < 30 else 10))
            except Exception as exc:  # noqa: BLE001 - a value of this table cannot be read: it alone is left out
                builder.quarantine(known[0].table, exc, BinlogPosition(log_file, end_pos - event.size, epoch))
                maps.leave_out(known[0].table)
                continue
            if versioned.get(table_id) is None:
                builder.row_changes(shapes[table_id], ROW_EVENTS[kind], befores, afters)
            else:  # a system-versioned table: its current rows only (core/system_versioning)
                for op, old, new in current_row_changes(versioned[table_id], ROW_EVENTS[kind], befores, afters):
                    builder.row_changes(shapes[table_id], op, old, new)
            del body, befores, afters  # the builder has the rows: a huge event is not held while the batch is cut
            continue
        builder.count_event()
        if kind == MARIADB_QUERY_COMPRESSED:
            kind, body = mariadb_decompressed(kind, event.body, _post_header(post_headers, QUERY, 13))
            event = event._replace(type=kind, body=body)
        if kind == MARIADB_GTID or kind == MYSQL_GTID or kind == MYSQL_GTID_TAGGED:
            if kind == MARIADB_GTID:
                gtid, flags = mariadb_gtid(event.body, event.server_id)
            elif kind == MYSQL_GTID:
                gtid, flags = mysql_gtid(event.body), MARIADB_GTID_STANDALONE
            else:
                gtid, flags = mysql_tagged_gtid(event.body), MARIADB_GTID_STANDALONE
            builder.begin(gtid, BinlogPosition(log_file, end_pos - event.size, epoch))
            in_transaction = not flags & MARIADB_GTID_STANDALONE
        elif kind == XID:
            boundary = True
        elif kind == XA_PREPARE:
            if xa_id is not None and not xa_prepare_is_one_phase(event.body) and not builder.skipping:
                builder.prepare_xa(xa_id)
            boundary = True
        elif kind == QUERY:
            schema, query, literal_charset = query_text(
                event.body, _post_header(post_headers, QUERY, 13), server.flavor, server_written=in_transaction
            )
            statement_kind = classify_query(query)
            xa = xa_statement(query)
            if xa is not None and xa[0] == "END":
                xa_id = xa[1]
            elif xa is not None and not builder.skipping:
                builder.resolve_xa(xa[1], committed=xa[0] == "COMMIT")
            if statement_kind == "begin":
                in_transaction = True
            elif statement_kind == "end":
                boundary = True
            elif statement_kind == "ddl":
                builder.statement(schema, query, event.timestamp, literal_charset)
                for name in builder.quarantined.keys() - maps.left_out:  # held by the DDL: its rows are not read
                    maps.leave_out(TableRef.parse(name))
                # A DDL is a transaction of its own, unless it opens one (CREATE TABLE ... SELECT).
                boundary = not in_transaction
        if boundary:
            in_transaction = False
            builder.commit(BinlogPosition(log_file, end_pos, epoch), event.timestamp)
            if not (file_number, end_pos) < end_key:
                break
            if builder.is_full() and not builder.holding:
                yield builder.cut()
    else:
        # The stream ran dry before a transaction ended at or after `end`: what lies between the
        # last boundary and `end` holds no transaction (a rotation, file headers), so `end` is a
        # boundary too, unless a transaction is still open.
        builder.advance_idle_to(end)
    if builder.has_progress():
        yield builder.cut()


_CAPTURED = frozenset(
    {TABLE_MAP, XID, XA_PREPARE, QUERY, MARIADB_GTID, MYSQL_GTID, MYSQL_GTID_TAGGED, MYSQL_PREVIOUS_GTIDS}
    | ROW_EVENTS.keys()
    | MARIADB_UNCOMPRESSED_TYPE.keys()
)


def _post_header(lengths: bytes, event_type: int, default: int) -> int:
    """The post-header length the format description declares for an event type."""
    return lengths[event_type - 1] if len(lengths) >= event_type else default
