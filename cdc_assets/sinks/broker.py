"""What every broker client of a sink does: connect and check the destination, send a window of messages and
return only once the broker has acknowledged every one of them, close."""

from __future__ import annotations

from typing import Protocol

from cdc_assets.sinks.events import SinkEvent


class SinkConnectionLost(Exception):
    """The broker went away (or did not answer) after the sink had connected: the publish loop reconnects and
    sends the unacknowledged window again. What a user must fix raises CdcUserError instead."""


class BrokerClient(Protocol):
    """A broker's client as the publish loop drives it (rabbitmq.RabbitPublisher, kinesis.KinesisPublisher)."""

    destination: str  # for messages: no secret

    def open(self) -> None:
        """Connect and check the destination exists; raises CdcUserError (unreachable, refused, missing)."""
        ...

    def send(self, events: list[SinkEvent]) -> None:
        """Publish `events` in order; returns when the broker acknowledged all. Raises SinkConnectionLost when
        the connection is lost, CdcUserError for what a user must fix."""
        ...

    def reconnect(self) -> None:
        """Connect again after SinkConnectionLost; raises it again while the broker is still away."""
        ...

    def close(self) -> None: ...
