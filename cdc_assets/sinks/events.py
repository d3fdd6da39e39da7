"""Change-log rows as sink messages: a JSON envelope shaped like Debezium's (`before`, `after`, `source`, `op`,
`ts_ms`), with `_cdc_seq`, the GTID and a stable message id. Plain functions over Arrow rows (docs/sinks.md, "Event
format").

- A row change is one message (`op` c, u, d); an update that changes the primary key is two, as Debezium
  sends it: a delete under the old key (id `<seq>:old-key`) and a create under the new one (`<seq>:new-key`),
  both with the update's `_cdc_seq`, so each key's messages stay in order on its own partition.
- A TRUNCATE (`op` t) and a schema change (`type` schema_change, with the statement and the columns before and
  after) are messages of their own, at their own `_cdc_seq`.
- Values are JSON as the change log types them: integers and floats as numbers, DECIMAL as an exact string,
  DATE `YYYY-MM-DD`, DATETIME `YYYY-MM-DDTHH:MM:SS.ffffff`, TIMESTAMP the same in UTC with `Z`, TIME and text
  as strings, binary as base64.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import AFTER, ALTER, DELETE, DROP, INSERT, REPAIR, REPAIR_DELETE, TRUNCATE, UPDATE, effect

CONNECTOR = "cdc-lakehouse"
CONNECTOR_VERSION = "0.1.0"
HEARTBEAT_KEY = "heartbeat"  # RabbitMQ routing key and Kinesis partition key of heartbeats (no table's: no dot)
KINESIS_MAX_PARTITION_KEY = 256  # characters, Kinesis's limit
# Debezium's letters for our operations (core.ops); a repair's row is the source's as read at the repair's point, as
# Debezium's snapshot reads are
DEBEZIUM_OPS = {INSERT: "c", UPDATE: "u", DELETE: "d", TRUNCATE: "t", REPAIR: "r", REPAIR_DELETE: "d"}

CHANGE = "change"  # a message's `type` (a row change's; a TRUNCATE's is core.ops.TRUNCATE, its operation's name)
SCHEMA_CHANGE = "schema_change"
HEARTBEAT = "heartbeat"


@dataclass(frozen=True)
class SinkEvent:
    """One message: its id, body and where it goes, and what de-duplication and ordering need to know."""

    id: str
    seq: int
    kind: str  # change, truncate, schema_change, heartbeat
    table: str | None  # `schema.table` text form; None for a heartbeat
    op: str | None  # c, u, d, t for changes and truncates
    key: str | None  # the change log's key text (`_cdc_key`: JSON array of the key's values); None without a primary key
    routing_key: str  # RabbitMQ: `<schema>.<table>`
    partition_key: str  # Kinesis: table and primary key (the table alone without a key or for a statement)
    body: bytes
    commit_ts: float  # seconds since the epoch
    broadcast: bool = False  # Kinesis: put on every shard (a TRUNCATE or schema change concerns every key)
    key_change: bool = False  # one half of an update that changed the primary key
    # a change of a table without a primary key: the values (`_cdc_before_key`, `_cdc_key`) of the rows it removes
    # and adds; it need only stay in order with changes of identical rows (RabbitMQ's `in_flight`)
    row_values: tuple[str, ...] = ()


@dataclass(frozen=True)
class TableColumns:
    """A table's column names (source order) and primary key at one point of its change log."""

    names: tuple[str, ...]
    primary_key: tuple[str, ...]

    @staticmethod
    def from_shape_json(shape: dict[str, Any]) -> TableColumns:
        return TableColumns(tuple(c["name"] for c in shape["columns"]), tuple(shape.get("primary_key") or ()))


class ShapeTimeline:
    """Which columns and key a row change had, by its `_cdc_seq`: a change log holds the union of every version's
    columns, so each row's own are read from the schema-change rows around it (the last one before it: its
    `after`; none before: the first one after it: its `before`), else the change-log stage's newest shape."""

    def __init__(self, ddl_rows: list[tuple[int, dict[str, Any]]], fallback: TableColumns) -> None:
        self.ddl = sorted(ddl_rows, key=lambda item: item[0])
        self.fallback = fallback

    def at(self, seq: int) -> TableColumns:
        before = [change for ddl_seq, change in self.ddl if ddl_seq < seq]
        if before:
            after = before[-1].get("after")
            return TableColumns.from_shape_json(after) if after else self.fallback
        later = [change for ddl_seq, change in self.ddl if ddl_seq > seq]
        if later and later[0].get("before"):
            return TableColumns.from_shape_json(later[0]["before"])
        return self.fallback


def json_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A change-log column's values as JSON-ready Python values (see the module docstring)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    t = column.type
    if pa.types.is_struct(t):
        fields = {f.name: json_values(column.field(f.name)) for f in t}
        valid = column.is_valid().to_pylist()
        return [{n: v[i] for n, v in fields.items()} if valid[i] else None for i in range(len(column))]
    if pa.types.is_decimal(t) or pa.types.is_date(t):
        return pc.cast(column, pa.string()).to_pylist()
    if pa.types.is_timestamp(t):
        return pc.strftime(column, "%Y-%m-%dT%H:%M:%S" + ("Z" if t.tz else "")).to_pylist()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return [None if v is None else base64.b64encode(v).decode("ascii") for v in column.to_pylist()]
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t):
        return column.to_pylist()
    if pa.types.is_list(t) and pa.types.is_floating(t.value_type):  # a VECTOR: a JSON array of its numbers
        return column.to_pylist()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pc.cast(column, pa.string()).to_pylist()
    return [None if v is None else str(v) for v in column.to_pylist()]


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def partition_key(table: str, key: str | None) -> str:
    """Kinesis partition key: the table and the key's values, hashed when longer than Kinesis allows (the same
    key always gives the same text, so its changes stay on one shard)."""
    text = table if key is None else f"{table}:{key}"
    if len(text) <= KINESIS_MAX_PARTITION_KEY:
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _source(table: TableRef, seq: int, commit_ms: int, gtid: str | None, batch: str | None) -> dict[str, Any]:
    return {
        "version": CONNECTOR_VERSION,
        "connector": CONNECTOR,
        "ts_ms": commit_ms,
        "snapshot": "false",
        "db": table.schema,
        "table": table.table,
        "gtid": gtid,
        "seq": seq,
        "batch": batch,
    }


def _column_types(shape: dict[str, Any] | None) -> dict[str, Any] | None:
    """A shape as Debezium's `tableChanges[].table`: key column names and each column's name, type, position."""
    if not shape:
        return None
    columns = []
    for position, column in enumerate(shape["columns"], start=1):
        described = {"name": column["name"], "typeName": str(column["type"]).upper(), "position": position}
        for extra in ("unsigned", "precision", "scale", "fsp", "charset", "members", "length"):
            if column.get(extra) not in (None, False, [], ()):
                described[extra] = column[extra]
        columns.append(described)
    return {"primaryKeyColumnNames": list(shape.get("primary_key") or []), "columns": columns}


def schema_change_body(table: TableRef, seq: int, commit_ms: int, gtid: str | None, batch: str | None, ddl: dict[str, Any], built_ms: int) -> dict[str, Any]:
    change = {k: v for k, v in ddl.items() if k not in ("statement", "seq", "table")}
    action = str(ddl.get("action") or ALTER)
    shape = ddl.get("after") if action != DROP else ddl.get("before")
    return {
        "id": str(seq),
        "type": SCHEMA_CHANGE,
        "ts_ms": built_ms,
        "source": _source(table, seq, commit_ms, gtid, batch),
        "databaseName": table.schema,
        "ddl": ddl.get("statement"),
        "tableChanges": [
            {
                "type": action.upper(),
                "id": f'"{table.schema}"."{table.table}"',
                "table": _column_types(shape) if action != DROP else None,
            }
        ],
        "change": change,
        "_cdc_seq": seq,
        "_cdc_gtid": gtid,
    }


def table_events(table: TableRef, rows: pa.Table, timeline: ShapeTimeline, built_ms: Callable[[], int]) -> list[SinkEvent]:
    """Every message of one table's change-log rows, in `_cdc_seq` order."""
    if rows.num_rows == 0:
        return []
    rows = rows.sort_by("_cdc_seq")
    name = str(table)
    source_names = [n for n in rows.column_names if not n.startswith("_cdc_")]
    values = {n: json_values(rows.column(n)) for n in source_names}
    before_values = json_values(rows.column("_cdc_before")) if "_cdc_before" in rows.column_names else [None] * rows.num_rows
    ops = rows.column("_cdc_op").to_pylist()
    seqs = rows.column("_cdc_seq").to_pylist()
    commit_us = pc.cast(rows.column("_cdc_commit_ts"), pa.int64()).to_pylist()
    gtids = rows.column("_cdc_gtid").to_pylist()
    batches = rows.column("_cdc_batch").to_pylist() if "_cdc_batch" in rows.column_names else [None] * rows.num_rows
    keys = rows.column("_cdc_key").to_pylist()
    before_keys = rows.column("_cdc_before_key").to_pylist()
    ddls = rows.column("_cdc_ddl").to_pylist() if "_cdc_ddl" in rows.column_names else [None] * rows.num_rows
    events: list[SinkEvent] = []
    built = built_ms()
    for i, op in enumerate(ops):
        seq, commit_ms = int(seqs[i]), int(commit_us[i] or 0) // 1000
        source = _source(table, seq, commit_ms, gtids[i], batches[i])
        does = effect(op)
        if does.schema_change:
            ddl = json.loads(ddls[i]) if ddls[i] else {"action": op}
            body = schema_change_body(table, seq, commit_ms, gtids[i], batches[i], ddl, built)
            events.append(_event(body, seq, SCHEMA_CHANGE, name, None, None, partition_key(name, None), commit_ms, broadcast=True))
            continue
        if does.clears_table:  # a TRUNCATE (a DROP is a schema change): a message of its own, for every key
            letter = DEBEZIUM_OPS[TRUNCATE]
            body = {"id": str(seq), "type": TRUNCATE, "before": None, "after": None, "op": letter, "ts_ms": built,
                    "source": source, "_cdc_seq": seq, "_cdc_gtid": gtids[i]}  # fmt: skip
            events.append(_event(body, seq, TRUNCATE, name, letter, None, partition_key(name, None), commit_ms, broadcast=True))
            continue
        shape = timeline.at(seq)
        writes = does.row == AFTER
        after = {c: values[c][i] if c in values else None for c in shape.names} if writes else None
        old = before_values[i]
        before = {c: old.get(c) for c in shape.names} if old is not None and does.had_row is not False else None
        keyed = bool(shape.primary_key)

        def key_of(image: dict[str, Any] | None) -> dict[str, Any] | None:
            return {k: image.get(k) for k in shape.primary_key} if keyed and image is not None else None  # noqa: B023

        if does.moves_key and keyed and before_keys[i] is not None and before_keys[i] != keys[i]:
            moved = {"from": key_of(before), "to": key_of(after)}
            deleted, created = DEBEZIUM_OPS[DELETE], DEBEZIUM_OPS[INSERT]
            gone = {"id": f"{seq}:old-key", "type": CHANGE, "before": before, "after": None, "op": deleted, "ts_ms": built,
                    "source": source, "key": moved["from"], "key_change": moved, "_cdc_seq": seq, "_cdc_gtid": gtids[i]}  # fmt: skip
            came = {"id": f"{seq}:new-key", "type": CHANGE, "before": None, "after": after, "op": created, "ts_ms": built,
                    "source": source, "key": moved["to"], "key_change": moved, "_cdc_seq": seq, "_cdc_gtid": gtids[i]}  # fmt: skip
            events.append(_event(gone, seq, CHANGE, name, deleted, before_keys[i], partition_key(name, before_keys[i]), commit_ms, key_change=True))
            events.append(_event(came, seq, CHANGE, name, created, keys[i], partition_key(name, keys[i]), commit_ms, key_change=True))
            continue
        letter = DEBEZIUM_OPS[op]
        key_text = keys[i] if writes else (before_keys[i] or keys[i])
        body = {"id": str(seq), "type": CHANGE, "before": before, "after": after, "op": letter, "ts_ms": built,
                "source": source, "key": key_of(after if writes else before), "_cdc_seq": seq, "_cdc_gtid": gtids[i]}  # fmt: skip
        # a table without a primary key has no row identity (its `_cdc_key` is the row's values, which two distinct
        # rows may share): no key, so nothing collapses its changes, and they share the table's partition, in order
        row_key = key_text if keyed else None
        rows_touched = () if keyed else tuple(dict.fromkeys(v for v in (before_keys[i], keys[i]) if v is not None))
        events.append(
            _event(body, seq, CHANGE, name, letter, row_key, partition_key(name, row_key), commit_ms, row_values=rows_touched)
        )
    return events


def _event(
    body: dict[str, Any],
    seq: int,
    kind: str,
    table: str,
    op: str | None,
    key: str | None,
    partition: str,
    commit_ms: int,
    broadcast: bool = False,
    key_change: bool = False,
    row_values: tuple[str, ...] = (),
) -> SinkEvent:
    return SinkEvent(
        id=body["id"],
        seq=seq,
        kind=kind,
        table=table,
        op=op,
        key=key,
        routing_key=table,
        partition_key=partition,
        body=encode(body),
        commit_ts=commit_ms / 1000,
        broadcast=broadcast,
        key_change=key_change,
        row_values=row_values,
    )


def heartbeat_event(sink: str, last_seq: int | None, now_ms: int) -> SinkEvent:
    """A heartbeat: says the sink is alive and how far it has published (`_cdc_seq` of the last change sent)."""
    body = {
        "id": f"heartbeat:{sink}:{now_ms}",
        "type": HEARTBEAT,
        "ts_ms": now_ms,
        "source": {"version": CONNECTOR_VERSION, "connector": CONNECTOR, "sink": sink, "seq": last_seq},
        "_cdc_seq": last_seq,
    }
    return SinkEvent(body["id"], last_seq or 0, HEARTBEAT, None, None, None, HEARTBEAT_KEY, HEARTBEAT_KEY, encode(body), now_ms / 1000)


def collapse_updates(events: list[SinkEvent], window_seconds: float) -> tuple[list[SinkEvent], int]:
    """Repeated updates of one key committed within `window_seconds` of the first of them collapse into the
    newest (with its own before image); any other change of the key, a key change, a TRUNCATE or a schema change
    of its table ends the run of updates. Only a primary key identifies a row: changes of a table without one
    (key None) are each a change of their own, never collapsed, however alike their rows (two identical rows
    updated together are two updates). Returns the messages kept, in order, and how many were dropped."""
    if window_seconds <= 0:
        return events, 0
    dropped: set[int] = set()
    runs: dict[str, dict[str | None, tuple[int, float]]] = {}  # table -> key -> (index of the newest, first ts)
    for index, event in enumerate(events):
        if event.table is None:
            continue
        table_runs = runs.setdefault(event.table, {})
        if event.kind != CHANGE:
            table_runs.clear()
            continue
        if event.key is None:
            continue
        if event.op != DEBEZIUM_OPS[UPDATE] or event.key_change:
            table_runs.pop(event.key, None)
            continue
        previous = table_runs.get(event.key)
        if previous is not None and event.commit_ts - previous[1] <= window_seconds:
            dropped.add(previous[0])
            table_runs[event.key] = (index, previous[1])
        else:
            table_runs[event.key] = (index, event.commit_ts)
    return [e for i, e in enumerate(events) if i not in dropped], len(dropped)
