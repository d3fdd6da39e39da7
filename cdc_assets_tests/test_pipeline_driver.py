"""The pipeline's one driver (cdc_assets/pipeline/driver.py) without a source: raw batches written as capture writes
them, then the stages run by the driver, its reports, its blocking rules, what a run stopped part-way leaves to
another (`remaining`), and its sinks step publishing to moto's Kinesis. Capture, the checks and a run for ever read
the source: test_pipeline, test_forked_capture and test_continuous run them through `sync` and the continuous mode."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_assets.capture.batch_builder import BatchBuilder
from cdc_assets.capture.run import CaptureReport
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl, SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake import layout
from cdc_assets.lake.raw_batches import BatchManifest, write_batch
from cdc_assets.lake.state import (
    Checkpoint,
    load_checkpoint,
    load_registry,
    register_batch,
    save_checkpoint,
    save_registry,
)
from cdc_assets.lake.store import Lakehouse
from cdc_assets.pipeline.driver import (
    CAPTURE,
    CHANGES,
    CHECKS,
    CURRENT,
    SINKS,
    SYNC_STEPS,
    Captured,
    ChangesLogged,
    CurrentApplied,
    Forever,
    Pending,
    Published,
    drive,
    remaining,
)
from cdc_assets.sinks.consume import read_stream
from cdc_assets.sinks.settings import SinkSettings
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.current.steps import CurrentReport

ORDERS = TableShape(TableRef("shop", "orders"), (ColumnSpec("id", "int"), ColumnSpec("item", "varchar")), ("id",))
USERS = TableShape(TableRef("shop", "users"), (ColumnSpec("id", "int"), ColumnSpec("name", "varchar")), ("id",))
NOWHERE = SourceSettings(MySQLUrl("127.0.0.1", 9, "nobody", ""))  # never connected to: the tests give the capture
OWNER = "test_pipeline_driver"


def _inserts(builder: BatchBuilder, shape: TableShape, ids: range, end: int) -> None:
    builder.begin(None)
    builder.row_changes(shape, "insert", [None] * len(ids), [[str(i), f"v{i}"] for i in ids])
    builder.commit(BinlogPosition("b.000001", end), 1_700_000_000 + end)


def _after_checkpoint(house: Lakehouse, gap: int = 0) -> BatchBuilder:
    """A builder of the next batch: from the checkpoint on, or `gap` bytes of binlog after it (a batch missing)."""
    checkpoint = load_checkpoint(house.store)
    assert checkpoint is not None
    start = BinlogPosition(checkpoint.position.log_file, checkpoint.position.log_pos + gap)
    return BatchBuilder(start=start, next_seq=checkpoint.next_seq)


def _captured(house: Lakehouse, builder: BatchBuilder) -> BatchManifest:
    """The builder's batch made durable as capture makes it: the batch, the registry, then the checkpoint."""
    manifest = write_batch(house.store, builder.cut())
    registry = load_registry(house.store)
    register_batch(registry, manifest.name, manifest.tables())
    save_registry(house.store, registry)
    save_checkpoint(house.store, Checkpoint(manifest.end, last_batch=manifest.name, next_seq=manifest.next_seq))
    return manifest


@pytest.fixture
def house(tmp_path: Path) -> Lakehouse:
    """A lakehouse with one raw batch: three orders and two users."""
    house = Lakehouse(str(tmp_path / "lakehouse"))
    builder = BatchBuilder(start=BinlogPosition("b.000001", 4))
    _inserts(builder, ORDERS, range(1, 4), 300)
    _inserts(builder, USERS, range(1, 3), 600)
    _captured(house, builder)
    return house


def _stages(house: Lakehouse, **kwargs: object) -> list[object]:
    return list(drive(None, house, owner=OWNER, steps=(CHANGES, CURRENT), **kwargs))  # type: ignore[arg-type]


def test_the_stages_take_the_pending_tables_and_report_each_step(house: Lakehouse) -> None:
    reports = _stages(house)
    assert [type(r) for r in reports] == [Pending, ChangesLogged, CurrentApplied]
    pending, logged, applied = reports
    assert pending.tables == ["shop.orders", "shop.users"]
    assert logged.changes.appended["shop.orders"].appended == 3 and logged.duplicates == {}
    assert sorted(applied.current.tables) == ["shop.orders", "shop.users"]
    assert applied.facts["shop.orders"].rows == 3 and applied.facts["shop.users"].rows == 2
    assert read_current(house, TableRef("shop", "orders")).num_rows == 3
    assert _stages(house) == [Pending([])]  # nothing left: the run is over after saying so


def test_a_subset_of_tables_and_of_current_state(house: Lakehouse) -> None:
    """Both change logs taken in, the current state of one: what an asset run selecting one table's current state and
    the other's change log does."""
    reports = _stages(house, tables=["shop.orders", "shop.users"], current_tables=["shop.users"])
    assert reports[0] == Pending(["shop.orders", "shop.users"])
    assert house.open(layout.CHANGES, TableRef("shop", "orders")) is not None
    assert house.open(layout.CURRENT, TableRef("shop", "orders")) is None
    assert reports[-1].facts["shop.users"].rows == 2  # type: ignore[attr-defined]
    assert [type(r) for r in _stages(house)] == [Pending, ChangesLogged, CurrentApplied]  # the orders left
    assert read_current(house, TableRef("shop", "orders")).num_rows == 3


def test_a_duplicate_seq_stops_the_run_before_current_state(house: Lakehouse) -> None:
    assert [type(r) for r in _stages(house, current_tables=[])] == [Pending, ChangesLogged, CurrentApplied]
    log = DeltaTable(house.table_uri(layout.CHANGES, TableRef("shop", "orders")))
    write_deltalake(log.table_uri, log.to_pyarrow_table().slice(0, 1), mode="append")  # one change twice
    builder = _after_checkpoint(house)
    _inserts(builder, ORDERS, range(10, 12), 900)
    _captured(house, builder)

    reports = _stages(house)
    assert [type(r) for r in reports] == [Pending, ChangesLogged]
    assert reports[-1].duplicates == {"shop.orders": 1} and reports[-1].blocks  # type: ignore[attr-defined]
    assert house.open(layout.CURRENT, TableRef("shop", "orders")) is None
    without_rules = _stages(house, blocking=False)  # a run without the blocking rules (a rewrite's catch-up) goes on
    assert [type(r) for r in without_rules] == [Pending, ChangesLogged, CurrentApplied]
    assert without_rules[1].duplicates is None  # type: ignore[attr-defined]


def test_a_broken_raw_batch_chain_stops_the_run_before_the_stages(house: Lakehouse) -> None:
    builder = _after_checkpoint(house, gap=4000)  # a batch missing after the first one
    _inserts(builder, ORDERS, range(10, 12), 5300)
    gapped = _captured(house, builder)

    reports = list(drive(NOWHERE, house, owner=OWNER, steps=SYNC_STEPS, captured=CaptureReport(batches=[gapped])))
    assert len(reports) == 1 and isinstance(reports[0], Captured)
    assert reports[0].blocks and "b.000001" in reports[0].breaks[0] and reports[0].chain_from == gapped.name
    assert house.open(layout.CHANGES, TableRef("shop", "orders")) is None
    assert remaining(reports, SYNC_STEPS) is None  # blocked: nothing for another run to resume


def test_a_contiguous_capture_goes_on_with_the_stages(house: Lakehouse) -> None:
    reports = list(drive(NOWHERE, house, owner=OWNER, steps=(CAPTURE, CHANGES), captured=CaptureReport()))
    assert [type(r) for r in reports] == [Captured, Pending, ChangesLogged]
    assert reports[0].breaks == [] and reports[0].chain_from is not None  # no batch added: the last one checked


def test_what_a_stopped_run_leaves_to_another() -> None:
    capture = Captured(CaptureReport(), "b1", [])
    logged = ChangesLogged(["a.t"], ChangesReport(), {})
    assert remaining([], SYNC_STEPS) == (list(SYNC_STEPS), None)
    assert remaining([capture], SYNC_STEPS) == ([CHANGES, CURRENT, CHECKS], None)
    assert remaining([capture, Pending(["a.t"])], SYNC_STEPS) == ([CHANGES, CURRENT, CHECKS], ["a.t"])
    assert remaining([capture, Pending(["a.t"]), logged], SYNC_STEPS) == ([CURRENT, CHECKS], ["a.t"])
    applied = CurrentApplied(CurrentReport(), {})
    assert remaining([capture, Pending(["a.t"]), logged, applied], SYNC_STEPS) == ([CHECKS], ["a.t"])
    assert remaining([capture, Pending([])], SYNC_STEPS) is None  # nothing pending
    assert remaining([capture, Pending(["a.t"]), ChangesLogged(["a.t"], ChangesReport(), {"a.t": 2})], SYNC_STEPS) is None
    assert remaining([Captured(CaptureReport(), "b1", ["a gap"])], SYNC_STEPS) is None


def test_a_run_is_asked_for_what_it_can_do(house: Lakehouse) -> None:
    with pytest.raises(ValueError, match="unknown pipeline steps"):
        list(drive(None, house, owner=OWNER, steps=("capture", "publish")))
    with pytest.raises(ValueError, match="read the source"):
        list(drive(None, house, owner=OWNER, steps=(CAPTURE,)))
    with pytest.raises(ValueError, match="for ever"):
        list(drive(NOWHERE, house, owner=OWNER, until=Forever(lambda: True), tables=["shop.orders"]))


def test_the_sinks_step_publishes_where_the_caller_asks(house: Lakehouse, s3_endpoint: str, monkeypatch) -> None:
    """No caller publishes in its run today (the sinks have runs of their own); a caller that asks gets every change
    the stages took in published, and a report of it."""
    for variable, value in {"AWS_ENDPOINT_URL_KINESIS": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(variable, value)
    boto3.client("kinesis", region_name="us-east-1").create_stream(StreamName="driver", ShardCount=1)
    sink = SinkSettings("kinesis", stream="driver", region="us-east-1")

    assert [type(r) for r in _stages(house, sinks=[sink])] == [Pending, ChangesLogged, CurrentApplied]  # not asked
    assert read_stream("driver", "us-east-1") == []
    builder = _after_checkpoint(house)
    _inserts(builder, USERS, range(3, 5), 900)
    _captured(house, builder)
    reports = list(drive(None, house, owner=OWNER, steps=(CHANGES, CURRENT, SINKS), sinks=[sink]))
    assert [type(r) for r in reports] == [Pending, ChangesLogged, CurrentApplied, Published]
    assert reports[-1].reports[0].messages == 7  # type: ignore[attr-defined]  (the orders' 3, the users' 4)
    assert len(read_stream("driver", "us-east-1")) == 7
