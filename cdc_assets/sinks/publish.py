"""One publish run of a sink: every change its tables' change logs hold above its checkpoint, a window at a time,
each window acknowledged by the broker before the checkpoint moves past it (docs/sinks.md, "Delivery guarantee").

A broker that goes away mid-run is reconnected to for up to RECONNECT_SECONDS, and the unacknowledged window is
sent again; then the run ends with one sentence and the checkpoint where the last acknowledged window left it.
The run holds the sink's own lock (`_state/locks/sinks/<sink>`), so two runs of one sink never interleave; it
takes no lock of capture or the stages, which go on whatever a sink does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.store import Lakehouse
from cdc_assets.sinks.broker import BrokerClient, SinkConnectionLost
from cdc_assets.sinks.checkpoint import SinkCheckpoint, load_checkpoint, save_checkpoint
from cdc_assets.sinks.events import collapse_updates, heartbeat_event
from cdc_assets.sinks.feed import ChangeFeed
from cdc_assets.sinks.lag import SinkLag, sink_lag
from cdc_assets.sinks.settings import RABBITMQ, SinkSettings

WINDOW_MESSAGES = 1_000  # messages acknowledged before the checkpoint moves: the most a crash sends again
RECONNECT_SECONDS = 60.0  # how long a run waits for a broker that went away mid-run (a restart takes seconds)


def publisher_for(sink: SinkSettings) -> BrokerClient:
    """The broker client of a sink (imported here only: pika and boto3 load when a sink publishes)."""
    if sink.name == RABBITMQ:
        from cdc_assets.sinks.rabbitmq import RabbitPublisher

        return RabbitPublisher(sink)
    from cdc_assets.sinks.kinesis import KinesisPublisher

    return KinesisPublisher(sink)


def check_sink(sink: SinkSettings) -> None:
    """Connect to the sink's broker and check its destination, then let go: raises CdcUserError with the fix."""
    publisher = publisher_for(sink)
    try:
        publisher.open()
    finally:
        publisher.close()


def sink_lock_name(sink: str) -> str:
    return f"sinks/{sink}"


@dataclass
class PublishReport:
    sink: str
    destination: str
    messages: int = 0  # acknowledged in this run (changes, statements and heartbeats)
    bytes: int = 0
    windows: int = 0
    collapsed: int = 0  # updates left out by the de-duplication window
    heartbeats: int = 0
    reconnects: int = 0
    refused_records: int = 0  # messages the broker refused and that were sent again (Kinesis throttling, RabbitMQ nacks)
    tables: dict[str, int] = field(default_factory=dict)  # messages per table in this run
    last_seq: int | None = None  # the checkpoint's highest acknowledged `_cdc_seq` after the run
    total_messages: int = 0  # the checkpoint's count since the sink began
    lag: SinkLag | None = None
    seconds: float = 0.0


class _Log:
    def info(self, _message: str) -> None: ...
    def warning(self, _message: str) -> None: ...


def publish(
    sink: SinkSettings,
    lakehouse: Lakehouse,
    publisher: BrokerClient,
    owner: str,
    log: Any | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> PublishReport:
    """Publish what the sink owes; returns what was sent. Raises CdcUserError, with the checkpoint unmoved past
    anything unacknowledged, for a broker that is unreachable, refuses or lacks the destination."""
    log = log or _Log()
    began = time.monotonic()
    report = PublishReport(sink.name, sink.destination)
    wait = lakehouse.lock_wait_seconds
    with lakehouse_lock(lakehouse, sink_lock_name(sink.name), f"publishing to the {sink.name} sink", owner, wait, log=log) as lease:
        checkpoint = load_checkpoint(lakehouse.store, sink.name)
        if checkpoint.destination not in (None, sink.destination):
            log.warning(
                f"the {sink.name} sink published to {checkpoint.destination} before and now to {sink.destination}: it "
                f"goes on after seq {checkpoint.last_seq} (delete _state/sinks/{sink.name}.json to send everything again)"
            )
        publisher.open()
        feed: ChangeFeed | None = None
        try:
            feed = ChangeFeed(lakehouse, sink, checkpoint, lambda: int(clock() * 1000))
            while True:
                hold_after = clock() - sink.dedup_seconds if sink.dedup_seconds > 0 else None
                window = feed.next_window(WINDOW_MESSAGES, hold_after)
                if not window.table_seqs:
                    break
                events, dropped = collapse_updates(window.events, sink.dedup_seconds)
                _send(publisher, events, report, log, sleep)
                failpoints.hit("sinks.window_acknowledged")
                lease.check()
                size = sum(len(e.body) for e in events)
                checkpoint = checkpoint.advanced(window.table_seqs, len(events), size, clock(), sink.destination)
                save_checkpoint(lakehouse.store, checkpoint)
                report.windows += 1
                report.messages += len(events)
                report.bytes += size
                report.collapsed += dropped
                for event in events:
                    if event.table is not None:
                        report.tables[event.table] = report.tables.get(event.table, 0) + 1
                log.info(
                    f"{sink.name}: window {report.windows} acknowledged, {len(events)} messages up to seq "
                    f"{checkpoint.last_seq}" + (f" ({dropped} repeated updates collapsed)" if dropped else "")
                )
                checkpoint = _heartbeat_if_due(sink, lakehouse, publisher, checkpoint, report, log, clock, sleep)
                if window.held_back:
                    break
            checkpoint = _heartbeat_if_due(sink, lakehouse, publisher, checkpoint, report, log, clock, sleep)
        finally:
            report.refused_records = getattr(publisher, "refused_records", 0)
            publisher.close()
    report.last_seq = checkpoint.last_seq
    report.total_messages = checkpoint.messages
    report.lag = sink_lag(sink, lakehouse, checkpoint, clock(), feed.opened() if feed is not None else None)
    report.seconds = time.monotonic() - began
    return report


def _send(publisher: BrokerClient, events: list, report: PublishReport, log: Any, sleep: Callable[[float], None]) -> None:
    """Send a window until the broker acknowledged all of it, reconnecting to a broker that went away."""
    deadline: float | None = None
    delay = 0.5
    while True:
        try:
            publisher.send(events)
            return
        except SinkConnectionLost as lost:
            deadline = deadline or time.monotonic() + RECONNECT_SECONDS
            log.warning(f"lost {publisher.destination} ({lost}): sending the unacknowledged window again once it is back")
            while True:
                if time.monotonic() > deadline:
                    raise CdcUserError(
                        f"Lost the connection to {publisher.destination} and could not get it back within "
                        f"{RECONNECT_SECONDS:.0f} s ({lost}): the sink's checkpoint holds every acknowledged message; run "
                        "`cdc-lakehouse publish` again once the broker is back."
                    ) from None
                sleep(delay)
                delay = min(delay * 2, 5.0)
                try:
                    publisher.reconnect()
                    report.reconnects += 1
                    break
                except SinkConnectionLost as again:
                    lost = again


def _heartbeat_if_due(
    sink: SinkSettings,
    lakehouse: Lakehouse,
    publisher: BrokerClient,
    checkpoint: SinkCheckpoint,
    report: PublishReport,
    log: Any,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> SinkCheckpoint:
    """A heartbeat when `heartbeat_seconds` have passed since the last one (recorded in the checkpoint)."""
    now = clock()
    if sink.heartbeat_seconds <= 0 or (checkpoint.last_heartbeat_at and now - checkpoint.last_heartbeat_at < sink.heartbeat_seconds):
        return checkpoint
    beat = heartbeat_event(sink.name, checkpoint.last_seq, int(now * 1000))
    _send(publisher, [beat], report, log, sleep)
    checkpoint = replace(
        checkpoint,
        last_heartbeat_at=now,
        messages=checkpoint.messages + 1,
        bytes=checkpoint.bytes + len(beat.body),
    )
    save_checkpoint(lakehouse.store, checkpoint)
    report.heartbeats += 1
    report.messages += 1
    report.bytes += len(beat.body)
    return checkpoint
