"""The sinks' pure logic, no server: the envelope of each kind of change, collapsing repeated updates, Kinesis
request planning and retry selection, sink settings, checkpoints, and the delivery check's own failures."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.lake.store import LocalStore
from cdc_assets.sinks.checkpoint import checkpoint_key, load_checkpoint, save_checkpoint
from cdc_assets.sinks.consume import Received
from cdc_assets.sinks.delivery import Expected, check_delivery
from cdc_assets.sinks.events import (
    ShapeTimeline,
    SinkEvent,
    TableColumns,
    collapse_updates,
    heartbeat_event,
    table_events,
)
from cdc_assets.sinks.in_flight import InFlight
from cdc_assets.sinks.kinesis import MAX_RECORDS, plan_requests, refused
from cdc_assets.sinks.settings import AmqpUrl, configured_sink_names, sink_settings

UTC = dt.UTC
SHAPE_V1 = {"columns": [{"name": "id", "type": "int"}, {"name": "price", "type": "decimal"}, {"name": "made", "type": "datetime"},
                        {"name": "seen", "type": "timestamp"}, {"name": "photo", "type": "blob"}, {"name": "day", "type": "date"},
                        {"name": "note", "type": "varchar"}], "primary_key": ["id"]}  # fmt: skip
SHAPE_V2 = {**SHAPE_V1, "columns": SHAPE_V1["columns"] + [{"name": "extra", "type": "int"}]}


def _log_rows() -> pa.Table:
    """A change log as the change-log stage writes it: the union of both versions' columns (extra added by an ALTER)."""
    image = {"id": pa.int32(), "price": pa.decimal128(10, 2), "made": pa.timestamp("us"), "seen": pa.timestamp("us", tz="UTC"),
             "photo": pa.binary(), "day": pa.date32(), "note": pa.string(), "extra": pa.int32()}  # fmt: skip
    row = {"id": 1, "price": Decimal("-1.50"), "made": dt.datetime(2024, 1, 2, 3, 4, 5, 600000),
           "seen": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "photo": b"\x00\xff", "day": dt.date(2024, 2, 29),
           "note": "caf\u00e9 \U0001f600", "extra": None}  # fmt: skip
    moved = {**row, "id": 2, "note": "moved"}
    ddl = json.dumps({"statement": "ALTER TABLE s.t ADD extra INT", "action": "alter", "before": SHAPE_V1, "after": SHAPE_V2,
                      "renames": {}, "defaults": {}, "seq": "14", "table": "s.t"})  # fmt: skip
    rows = [  # op, seq, image (after; the deleted row for a delete), before, key, before key, ddl
        ("insert", 10, row, None, '["1"]', None, None),
        ("update", 11, {**row, "note": "new"}, row, '["1"]', '["1"]', None),
        ("update", 12, moved, {**row, "note": "new"}, '["2"]', '["1"]', None),
        ("delete", 13, moved, moved, '["2"]', '["2"]', None),
        ("alter", 14, None, None, None, None, ddl),
        ("insert", 15, {**row, "id": 3, "extra": 7}, None, '["3"]', None, None),
        ("truncate", 16, None, None, None, None, None),
    ]
    columns = {name: pa.array([(r[2] or {}).get(name) for r in rows], t) for name, t in image.items()}
    before_type = pa.struct([pa.field(n, t) for n, t in image.items()])
    return pa.table(
        {
            **columns,
            "_cdc_op": pa.array([r[0] for r in rows]),
            "_cdc_seq": pa.array([r[1] for r in rows], pa.int64()),
            "_cdc_commit_ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=UTC)] * len(rows), pa.timestamp("us", tz="UTC")),
            "_cdc_gtid": pa.array([f"0-1-{r[1]}" for r in rows]),
            "_cdc_batch": pa.array(["b1"] * len(rows)),
            "_cdc_before": pa.array([r[3] for r in rows], before_type),
            "_cdc_key": pa.array([r[4] for r in rows]),
            "_cdc_before_key": pa.array([r[5] for r in rows]),
            "_cdc_ddl": pa.array([r[6] for r in rows]),
        }
    )


def test_every_kind_of_change_becomes_its_debezium_style_message() -> None:
    table = TableRef("s", "t")
    timeline = ShapeTimeline([(14, json.loads(_log_rows().column("_cdc_ddl")[4].as_py()))], TableColumns(("id",), ("id",)))
    events = table_events(table, _log_rows(), timeline, lambda: 1_000)
    assert [e.id for e in events] == ["10", "11", "12:old-key", "12:new-key", "13", "14", "15", "16"]
    bodies = [json.loads(e.body) for e in events]
    assert [b.get("op") for b in bodies] == ["c", "u", "d", "c", "d", None, "c", "t"]
    assert [b["type"] for b in bodies] == ["change"] * 5 + ["schema_change", "change", "truncate"]
    insert = bodies[0]
    # values as docs/sinks.md documents them; columns of the version in force (no `extra` before the ALTER)
    assert insert["after"] == {"id": 1, "price": "-1.50", "made": "2024-01-02T03:04:05.600000", "seen": "2024-01-02T03:04:05.000000Z",
                               "photo": "AP8=", "day": "2024-02-29", "note": "caf\u00e9 \U0001f600"}  # fmt: skip
    assert insert["before"] is None and insert["key"] == {"id": 1}
    assert insert["_cdc_seq"] == 10 and insert["_cdc_gtid"] == "0-1-10" and insert["ts_ms"] == 1_000
    assert insert["source"] == {"version": "0.1.0", "connector": "cdc-lakehouse", "ts_ms": 1767225600000, "snapshot": "false",
                                "db": "s", "table": "t", "gtid": "0-1-10", "seq": 10, "batch": "b1"}  # fmt: skip
    assert "café 😀".encode() in events[0].body  # UTF-8, not escaped
    assert bodies[1]["before"]["note"] == "caf\u00e9 \U0001f600" and bodies[1]["after"]["note"] == "new"
    # a key change: a delete under the old key, then a create under the new one, with the update's seq
    gone, came = bodies[2], bodies[3]
    assert gone["key"] == {"id": 1} and gone["before"]["note"] == "new" and gone["after"] is None
    assert came["key"] == {"id": 2} and came["after"]["note"] == "moved" and came["before"] is None
    assert gone["key_change"] == came["key_change"] == {"from": {"id": 1}, "to": {"id": 2}}
    assert (events[2].partition_key, events[3].partition_key) == ('s.t:["1"]', 's.t:["2"]')
    assert bodies[4]["before"]["id"] == 2 and bodies[4]["after"] is None and events[4].partition_key == 's.t:["2"]'
    alter = bodies[5]
    assert alter["ddl"] == "ALTER TABLE s.t ADD extra INT" and alter["tableChanges"][0]["type"] == "ALTER"
    assert [c["name"] for c in alter["tableChanges"][0]["table"]["columns"]][-1] == "extra"
    assert bodies[6]["after"]["extra"] == 7  # after the ALTER the row has the new column
    assert [e.broadcast for e in events] == [False] * 5 + [True, False, True]
    assert {e.routing_key for e in events} == {"s.t"}
    assert events[5].partition_key == events[7].partition_key == "s.t"


def test_a_long_key_becomes_a_hashed_partition_key_of_kinesis_length() -> None:
    from cdc_assets.sinks.events import partition_key

    long_key = json.dumps(["x" * 300])
    assert partition_key("s.t", long_key) == partition_key("s.t", long_key)
    assert len(partition_key("s.t", long_key)) <= 256 and partition_key("s.t", long_key) != partition_key("s.t", '["y"]')


def _event(seq: int, op: str, key: str, ts: float, table: str = "s.t", kind: str = "change", key_change: bool = False) -> SinkEvent:
    partition = f"{table}:{key}" if kind == "change" else table
    return SinkEvent(str(seq), seq, kind, table, op, key, table, partition, b"{}", ts, kind != "change", key_change)


def test_repeated_updates_collapse_into_the_newest_within_the_window_only() -> None:
    events = [
        _event(1, "c", "a", 100.0),
        _event(2, "u", "a", 100.0),
        _event(3, "u", "b", 100.0),
        _event(4, "u", "a", 101.0),
        _event(5, "u", "a", 103.0),  # within 3 s of the first update of the run (seq 2)
        _event(6, "u", "a", 104.0),  # 4 s after it: a new run
        _event(7, "d", "a", 104.0),
        _event(8, "u", "b", 104.5),  # 4.5 s after seq 3: not collapsed with it
        _event(9, "t", "", 105.0, kind="truncate"),
        _event(10, "u", "b", 105.0),
    ]
    kept, dropped = collapse_updates(events, 3.0)
    assert [e.seq for e in kept] == [1, 3, 5, 6, 7, 8, 9, 10] and dropped == 2
    assert collapse_updates(events, 0.0) == (events, 0)  # off by default
    keyed_move = [_event(1, "u", "a", 1.0), _event(2, "d", "a", 1.0, key_change=True), _event(3, "u", "a", 1.0)]
    assert collapse_updates(keyed_move, 10.0)[1] == 0  # a key change ends the run
    # without a primary key there is no row identity: identical rows' updates are distinct changes, all kept
    keyless = [SinkEvent(str(s), s, "change", "s.n", "u", None, "s.n", "s.n", b"{}", 1.0) for s in (1, 2, 3)]
    assert collapse_updates(keyless, 10.0) == (keyless, 0)


def test_kinesis_requests_hold_one_record_per_key_and_put_statements_on_every_shard_alone() -> None:
    events = [_event(i, "u", str(i % 3), 1.0) for i in range(8)]
    events.insert(4, _event(100, "t", "", 1.0, kind="truncate"))
    requests = plan_requests(events, ["0", "170141183460469231731687303715884105728"])
    keys = [[r.event.partition_key for r in request] for request in requests]
    assert keys == [["s.t:0", "s.t:1", "s.t:2"], ["s.t:0"], ["s.t", "s.t"], ["s.t:1", "s.t:2", "s.t:0"], ["s.t:1"]]
    assert [r.explicit_hash_key for r in requests[2]] == ["0", "170141183460469231731687303715884105728"]
    assert [r.event.seq for request in requests for r in request if not r.event.broadcast] == [0, 1, 2, 3, 4, 5, 6, 7]
    many = [_event(i, "c", str(i), 1.0) for i in range(MAX_RECORDS + 1)]
    assert [len(r) for r in plan_requests(many, ["0"])] == [MAX_RECORDS, 1]
    huge = SinkEvent("1", 1, "change", "s.t", "c", "k", "s.t", "s.t:k", b"x" * (1024 * 1024 + 1), 1.0)
    with pytest.raises(CdcUserError, match="above Kinesis's 1 MiB per record"):
        plan_requests([huge], ["0"])
    records = requests[3]
    failed, codes = refused(records, [{"SequenceNumber": "1"}, {"ErrorCode": "ProvisionedThroughputExceededException"}, {"SequenceNumber": "2"}])
    assert [r.event.partition_key for r in failed] == ["s.t:2"] and codes == {"ProvisionedThroughputExceededException"}


def test_sink_settings_from_the_environment() -> None:
    env = {"CDC_RABBITMQ_URL": "amqp://cdc:s%40cret@broker:5673/prod", "CDC_RABBITMQ_TABLES": "shop.*",
           "CDC_KINESIS_STREAM": "changes", "CDC_KINESIS_EXCLUDE_TABLES": "shop.audit", "AWS_DEFAULT_REGION": "eu-west-1",
           "CDC_SINK_DEDUP_SECONDS": "2.5", "CDC_SINK_HEARTBEAT_SECONDS": "30"}  # fmt: skip
    assert configured_sink_names(env) == ["rabbitmq", "kinesis"]
    assert configured_sink_names({}) == []
    rabbit = sink_settings("rabbitmq", env)
    assert (rabbit.rabbitmq_url.user, rabbit.rabbitmq_url.password, rabbit.rabbitmq_url.vhost) == ("cdc", "s@cret", "prod")
    assert rabbit.exchange == "cdc" and rabbit.dedup_seconds == 2.5 and rabbit.heartbeat_seconds == 30
    assert rabbit.includes("shop", "orders") and not rabbit.includes("crm", "people")
    assert "s@cret" not in rabbit.destination and "cret" not in repr(rabbit) and "s%40cret" in rabbit.rabbitmq_url.with_password()
    kinesis = sink_settings("kinesis", env)
    assert (kinesis.stream, kinesis.region) == ("changes", "eu-west-1")
    assert kinesis.includes("shop", "orders") and not kinesis.includes("shop", "audit")
    assert AmqpUrl.parse("amqp://h").vhost == "/" and AmqpUrl.parse("amqps://h").port == 5671
    with pytest.raises(CdcUserError, match="CDC_RABBITMQ_URL is not a valid URL"):
        sink_settings("rabbitmq", {"CDC_RABBITMQ_URL": "http://broker"})
    with pytest.raises(CdcUserError, match="CDC_SINK_HEARTBEAT_SECONDS='often' is not a number of seconds"):
        sink_settings("kinesis", {**env, "CDC_SINK_HEARTBEAT_SECONDS": "often"})
    with pytest.raises(CdcUserError, match="CDC_KINESIS_STREAM='arn:aws:kinesis:eu-west-1:1:stream/x' is not a Kinesis stream name"):
        sink_settings("kinesis", {**env, "CDC_KINESIS_STREAM": "arn:aws:kinesis:eu-west-1:1:stream/x"})
    with pytest.raises(CdcUserError, match="The kinesis sink is not configured: set CDC_KINESIS_STREAM"):
        sink_settings("kinesis", {})
    with pytest.raises(CdcUserError, match="no sink named 'kafka'"):
        sink_settings("kafka", env)


def test_sink_checkpoint_round_trip_and_a_corrupt_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    assert load_checkpoint(store, "rabbitmq").tables == {}
    checkpoint = load_checkpoint(store, "rabbitmq").advanced({"s.t": 7, "s.u": 3}, 12, 900, 5.0, "somewhere")
    checkpoint = checkpoint.advanced({"s.t": 9}, 2, 100, 6.0, "somewhere")
    save_checkpoint(store, checkpoint)
    again = load_checkpoint(store, "rabbitmq")
    assert again == checkpoint and again.tables == {"s.t": 9, "s.u": 3} and again.last_seq == 9 and again.messages == 14
    (tmp_path / checkpoint_key("rabbitmq")).write_text("{not json")
    with pytest.raises(CdcUserError, match="checkpoint _state/sinks/rabbitmq.json in the lakehouse is corrupt"):
        load_checkpoint(store, "rabbitmq")


def _received(stream: str, message_id: str, seq: int, op: str, key: int | None, kind: str = "change") -> Received:
    body = {"id": message_id, "type": kind, "op": op, "_cdc_seq": seq, "key": None if key is None else {"id": key},
            "source": {"db": "s", "table": "t"}}  # fmt: skip
    return Received(stream, message_id, body)


def test_the_delivery_check_finds_gaps_strangers_reordering_and_accepts_resent_copies() -> None:
    key = ("key:[1]",)
    expected = [Expected("1", 1, "s.t", "c", key), Expected("2", 2, "s.t", "u", key), Expected("3", 3, "s.t", "t"), Expected("4", 4, "s.t", "c", key)]
    good = [_received("q", "1", 1, "c", 1), _received("q", "2", 2, "u", 1), _received("q", "1", 1, "c", 1),
            _received("q", "3", 3, "t", None, "truncate"), _received("q", "4", 4, "c", 1),
            Received("q", "heartbeat:x:1", {"id": "heartbeat:x:1", "type": "heartbeat"})]  # fmt: skip
    report = check_delivery(expected, good)
    assert report.ok and report.duplicates == 1 and report.heartbeats == 1, report.describe()
    gap = check_delivery(expected, [m for m in good if m.id != "2"])
    assert not gap.ok and gap.missing == ["2"]
    swapped = check_delivery(expected, [good[1], good[0], *good[3:5]])
    assert not swapped.ok and swapped.out_of_order
    truncate_early = check_delivery(expected, [good[0], good[3], good[1], good[4]])
    assert not truncate_early.ok and truncate_early.out_of_order
    stranger = check_delivery(expected, [*good, _received("q", "99", 99, "c", 5)])
    assert stranger.unexpected == ["99"]
    wrong_op = check_delivery(expected, [good[0], _received("q", "2", 2, "d", 1), *good[3:5]])
    assert wrong_op.wrong == ["2"]


def test_a_heartbeat_says_how_far_the_sink_has_published() -> None:
    beat = heartbeat_event("kinesis", 42, 1_700_000_000_000)
    body = json.loads(beat.body)
    assert body["type"] == "heartbeat" and body["_cdc_seq"] == 42 and body["source"]["sink"] == "kinesis"
    assert beat.routing_key == beat.partition_key == "heartbeat"


def test_a_message_waits_for_the_confirm_of_an_earlier_one_it_must_follow() -> None:
    flight = InFlight()
    a1, b1, a2 = _event(1, "u", "a", 1.0), _event(2, "u", "b", 1.0), _event(3, "u", "a", 1.0)
    other = _event(4, "u", "a", 1.0, table="s.u")
    truncate = _event(5, "t", "", 1.0, kind="truncate")
    keyless = SinkEvent("6", 6, "change", "s.n", "c", None, "s.n", "s.n", b"{}", 1.0)  # no row values: table-wide
    beat = heartbeat_event("rabbitmq", 1, 1)
    assert flight.can_go(a1) and not flight
    flight.add(1, a1)
    assert flight.can_go(b1) and not flight.can_go(a2) and flight.can_go(other)  # another key, another table: go
    flight.add(2, b1)
    assert not flight.can_go(truncate) and flight.can_go(beat)  # a table-wide message follows all of its table
    assert flight.settle(1, multiple=False) == {1: a1} and flight.can_go(a2) and not flight.can_go(truncate)
    assert flight.settle(2, multiple=True) == {2: b1} and flight.can_go(truncate) and not flight
    flight.add(3, truncate)
    assert not flight.can_go(a2) and flight.can_go(keyless)
    flight.add(4, keyless)
    assert not flight.can_go(SinkEvent("7", 7, "change", "s.n", "d", None, "s.n", "s.n", b"{}", 1.0))  # no key: in turn
    assert flight.settle(9, multiple=True) == {3: truncate, 4: keyless} and flight.can_go(a2)


def test_changes_of_a_table_without_key_wait_only_for_changes_of_identical_rows() -> None:
    flight = InFlight()

    def row(seq: int, op: str, *values: str) -> SinkEvent:
        return SinkEvent(str(seq), seq, "change", "s.n", op, None, "s.n", "s.n", b"{}", 1.0, row_values=values)

    flight.add(1, row(1, "c", "[1]"))
    assert flight.can_go(row(2, "c", "[2]"))  # another row's values: goes at once
    assert not flight.can_go(row(3, "c", "[1]"))  # an identical row: after the first is confirmed
    assert not flight.can_go(row(4, "u", "[2]", "[1]"))  # an update to those values, too
    flight.add(2, row(2, "c", "[2]"))
    assert not flight.can_go(_event(5, "t", "", 1.0, table="s.n", kind="truncate"))
    flight.settle(1, multiple=False)
    assert flight.can_go(row(3, "c", "[1]")) and not flight.can_go(row(4, "u", "[2]", "[1]"))
