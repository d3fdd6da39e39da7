"""What a consumer read back, compared with the change logs: every change there exactly once after
de-duplication by id, nothing else, and each key's messages in `_cdc_seq` order on the stream they came on.

The expected messages are derived from the change-log rows' own columns (op, seq, keys), not from the envelope
code, so a message the envelope forgets or invents shows up here."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import AFTER, DELETE, DROP, INSERT, TRUNCATE, effect
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE
from cdc_assets.lake.state import load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.sinks.consume import Received
from cdc_assets.sinks.events import DEBEZIUM_OPS, HEARTBEAT, SCHEMA_CHANGE
from cdc_assets.sinks.feed import sink_tables
from cdc_assets.sinks.settings import SinkSettings


@dataclass(frozen=True)
class Expected:
    id: str
    seq: int
    table: str
    kind: str  # c, u, d, t or schema_change
    # what it must stay in order with: its key, or for a table without one the values of the rows it removes and adds
    # (changes of distinct values commute); empty for a table-wide message
    units: tuple[str, ...] = ()


def expected_messages(lakehouse: Lakehouse, sink: SinkSettings) -> list[Expected]:
    """The messages the sink owes for everything its tables' change logs hold, in `_cdc_seq` order."""
    expected: list[Expected] = []
    for table in sink_tables(lakehouse, sink):
        log = lakehouse.open(CHANGES, table)
        if log is None:
            continue
        shape = load_progress(lakehouse.store, CHANGES_STAGE, str(table)).shape
        keyed = bool(shape and shape.primary_key)
        rows = read_query(log, "SELECT _cdc_seq, _cdc_op, _cdc_key, _cdc_before_key FROM changes ORDER BY _cdc_seq", "changes")
        for seq, op, key, before_key in zip(*(rows.column(i).to_pylist() for i in range(4)), strict=True):
            expected += owed_messages(str(table), keyed, seq, op, key, before_key)
    return sorted(expected, key=lambda e: (e.seq, e.id))


def owed_messages(table: str, keyed: bool, seq: int, op: str, key: str | None, before_key: str | None) -> list[Expected]:
    """The messages one change-log row owes, from its own op (core.ops.effect), seq and keys: a schema change's,
    a TRUNCATE's, a key change's two halves, or one change of its key (of its rows' values without a key)."""
    does = effect(op)
    if does.schema_change:
        return [Expected(str(seq), seq, table, SCHEMA_CHANGE)]
    if does.clears_table:
        return [Expected(str(seq), seq, table, DEBEZIUM_OPS[op])]
    if does.moves_key and keyed and before_key is not None and before_key != key:
        return [
            Expected(f"{seq}:old-key", seq, table, DEBEZIUM_OPS[DELETE], ("key:" + before_key,)),
            Expected(f"{seq}:new-key", seq, table, DEBEZIUM_OPS[INSERT], ("key:" + str(key),)),
        ]
    if keyed:
        its_key = key if does.row == AFTER else before_key or key
        return [Expected(str(seq), seq, table, DEBEZIUM_OPS[op], ("key:" + str(its_key),))]
    rows = tuple("row:" + v for v in dict.fromkeys((before_key, key)) if v is not None)
    return [Expected(str(seq), seq, table, DEBEZIUM_OPS[op], rows)]


@dataclass
class DeliveryReport:
    expected: int
    received: int  # messages read, heartbeats and re-sent copies included
    heartbeats: int
    duplicates: int  # copies of an id already read on the same stream (re-sent after a crash or reconnect)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # an id whose body says another seq, table or op
    out_of_order: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong or self.out_of_order)

    def describe(self) -> str:
        if self.ok:
            return (
                f"all {self.expected} messages the change logs call for, each once after de-duplication by id and in "
                f"order per key ({self.duplicates} re-sent copies, {self.heartbeats} heartbeats)"
            )
        return (
            f"missing {self.missing[:5]} ({len(self.missing)}), unexpected {self.unexpected[:5]} ({len(self.unexpected)}), "
            f"wrong {self.wrong[:5]}, out of order {self.out_of_order[:5]} ({len(self.out_of_order)})"
        )


def _kind(body: dict[str, Any]) -> str:
    return SCHEMA_CHANGE if body.get("type") == SCHEMA_CHANGE else str(body.get("op"))


def _table(body: dict[str, Any]) -> str:
    return str(TableRef(body["source"]["db"], body["source"]["table"]))


def _units(message: Received, want: Expected) -> list[str]:
    """What a message must be in order with: its partition key's messages on Kinesis; on RabbitMQ its key's, or for
    a table without a key those of identical rows."""
    if message.partition_key is not None:
        return [message.partition_key]
    return [f"{want.table}:{unit}" for unit in want.units]


def check_delivery(expected: list[Expected], received: list[Received]) -> DeliveryReport:
    by_id = {e.id: e for e in expected}
    heartbeats = sum(1 for m in received if m.body.get("type") == HEARTBEAT)
    messages = [m for m in received if m.body.get("type") != HEARTBEAT]
    streams: dict[str, list[Received]] = defaultdict(list)
    duplicates = 0
    seen_in: dict[str, set[str]] = defaultdict(set)
    for message in messages:
        if message.id in seen_in[message.stream]:
            duplicates += 1
            continue
        seen_in[message.stream].add(message.id)
        streams[message.stream].append(message)
    got = {m.id for m in messages}
    report = DeliveryReport(len(expected), len(received), heartbeats, duplicates)
    report.missing = [e.id for e in expected if e.id not in got]
    report.unexpected = sorted(got - set(by_id))
    for stream, firsts in streams.items():
        last_in_unit: dict[str, int] = {}
        per_table: dict[str, list[tuple[int, str | None]]] = defaultdict(list)  # seq, id of a table-wide message
        for message in firsts:
            want = by_id.get(message.id)
            if want is None:
                continue
            body = message.body
            if (body.get("_cdc_seq"), _table(body), _kind(body)) != (want.seq, want.table, want.kind):
                report.wrong.append(message.id)
            table_wide = want.kind in (DEBEZIUM_OPS[TRUNCATE], SCHEMA_CHANGE)
            per_table[want.table].append((want.seq, message.id if table_wide else None))
            if table_wide:
                continue
            for unit in _units(message, want):
                if unit in last_in_unit and last_in_unit[unit] >= want.seq:
                    report.out_of_order.append(f"{message.id} after seq {last_in_unit[unit]} of {unit} on {stream}")
                last_in_unit[unit] = want.seq
        # a TRUNCATE or schema change concerns every key of its table: on each stream, every message of the table
        # before it must be older and every one after it newer
        for entries in per_table.values():
            highest_before, lowest_after = [], []
            top = -1
            for seq, _ in entries:
                highest_before.append(top)
                top = max(top, seq)
            bottom = None
            for seq, _ in reversed(entries):
                lowest_after.append(bottom)
                bottom = seq if bottom is None else min(bottom, seq)
            lowest_after.reverse()
            for (seq, table_wide_id), before, after in zip(entries, highest_before, lowest_after, strict=True):
                if table_wide_id is not None and (before > seq or (after is not None and after < seq)):
                    report.out_of_order.append(f"{table_wide_id} on {stream}")
    return report


def replayed_rows(received: list[Received]) -> dict[str, dict[str, dict[str, Any]]]:
    """What a consumer that applies the messages in order (first copy of each id, per stream in the order read)
    ends up with: per keyed table, its rows by key. Tables without a key are left out (no identity to apply by)."""
    tables: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    seen: set[tuple[str, str]] = set()
    ordered = sorted(
        ((m.body.get("_cdc_seq") or 0, 0 if str(m.id).endswith(":old-key") else 1, m) for m in received),
        key=lambda item: (item[0], item[1]),
    )
    for _seq, _half, message in ordered:
        body = message.body
        if body.get("type") == HEARTBEAT or (message.stream, message.id) in seen:
            continue
        seen.add((message.stream, message.id))
        table = _table(body)
        if body.get("type") == SCHEMA_CHANGE:
            if (body.get("change") or {}).get("action") == DROP:
                tables.pop(table, None)
            continue
        if body.get("op") == DEBEZIUM_OPS[TRUNCATE]:
            tables[table] = {}
            continue
        key = body.get("key")
        if key is None:
            continue
        text = json.dumps(key, sort_keys=True)
        if body.get("op") == DEBEZIUM_OPS[DELETE]:  # a delete's, a repair_delete's or a key change's old key
            tables[table].pop(text, None)
        else:
            tables[table][text] = body["after"]
    return dict(tables)
