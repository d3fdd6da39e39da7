"""The RabbitMQ sink's client: persistent, mandatory messages to an existing exchange, routing key
`<schema>.<table>`, each confirmed by the broker (publisher confirms); one returned as unroutable is an error.

pika's BlockingConnection waits for each confirm before the next publish (about 700 messages/s here), so this
client runs pika's asynchronous SelectConnection: a window is published on one channel, in order, and its ioloop
runs until the broker has confirmed every delivery tag of it (or gone away). A message waits for the confirm of
an earlier one it must follow (its key's, or its table's for a table-wide one: `in_flight`), so when the broker
refuses one (a nack: a queue full with `x-overflow: reject-publish`, a queue down) nothing later of its key has
reached a queue: the refused ones are sent again, after every message in flight is settled and with backoff,
before anything new goes out.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.select_connection import SelectConnection

from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.sinks.broker import SinkConnectionLost
from cdc_assets.sinks.events import HEARTBEAT, SinkEvent
from cdc_assets.sinks.in_flight import InFlight
from cdc_assets.sinks.settings import SinkSettings

# pika logs every failed connection attempt at ERROR (to stderr when nothing else handles it); the publish loop
# says what matters once, in the run's log, so pika's own lines are kept for what it cannot recover from
logging.getLogger("pika").setLevel(logging.CRITICAL)

CONNECT_TIMEOUT_SECONDS = 10.0
CONFIRM_TIMEOUT_SECONDS = 60.0  # a window not confirmed in this long counts as a lost connection
REFUSED_RETRY_SECONDS = 60.0  # how long refused (nacked) messages are sent again with nothing accepted meanwhile
PUMP_EVERY = 100  # messages published between two turns of the ioloop: the broker works while we encode
PERSISTENT = 2  # AMQP delivery mode: the broker writes the message to disk (in a durable queue)


class RabbitPublisher:
    def __init__(self, sink: SinkSettings) -> None:
        assert sink.rabbitmq_url is not None
        self.sink = sink
        self.url = sink.rabbitmq_url
        self.exchange = sink.exchange
        self.destination = sink.destination
        self.connection: SelectConnection | None = None
        self.channel: Any = None
        self._error: BaseException | None = None
        self._ready = False
        self._next_tag = 1
        self._in_flight = InFlight()
        self._refused: dict[int, SinkEvent] = {}  # nacked, by delivery tag: sent again, in publish order, first
        self._accepted = 0  # messages acked since the connection opened
        self.refused_records = 0  # messages the broker nacked and that were sent again
        self._waiting_for: Callable[[], bool] | None = None

    # --- the ioloop ---------------------------------------------------------------------------------------

    def _run_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Run the ioloop until `done()` or an error; a timeout is an error of its own."""
        assert self.connection is not None
        ioloop = self.connection.ioloop
        timed_out = []
        self._waiting_for = done
        timer = ioloop.call_later(timeout, lambda: (timed_out.append(True), ioloop.stop()))
        try:
            if not done() and self._error is None:
                ioloop.start()
        finally:
            ioloop.remove_timeout(timer)
            self._waiting_for = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if timed_out and not done():
            raise SinkConnectionLost(f"{what} took longer than {timeout:.0f} s")

    def _pump(self) -> None:
        """One turn of the ioloop without waiting: frames go out, confirms come in."""
        assert self.connection is not None
        ioloop = self.connection.ioloop
        ioloop.call_later(0, ioloop.stop)
        ioloop.start()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _check(self) -> None:
        if self._waiting_for is not None and self.connection is not None and (self._error is not None or self._waiting_for()):
            self.connection.ioloop.stop()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self.connection is not None:
            self.connection.ioloop.stop()

    # --- callbacks ----------------------------------------------------------------------------------------

    def _on_open(self, connection: SelectConnection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, _connection: SelectConnection, error: BaseException) -> None:
        self._fail(self._open_error(error))

    def _on_close(self, _connection: SelectConnection, reason: BaseException) -> None:
        self._ready = False
        self._fail(SinkConnectionLost(f"the connection was closed ({reason})"))

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_mode)

    def _on_confirm_mode(self, _frame: Any) -> None:
        self.channel.exchange_declare(self.exchange, passive=True, callback=self._on_exchange)

    def _on_exchange(self, _frame: Any) -> None:
        self._ready = True
        self._check()

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        self._ready = False
        code = getattr(reason, "reply_code", None)
        if code == 404 and not self._in_flight:
            self._fail(
                CdcUserError(
                    f"The RabbitMQ exchange '{self.exchange}' does not exist on {self.url}: create it (a durable topic "
                    "exchange suits the routing keys <schema>.<table>) or set CDC_RABBITMQ_EXCHANGE to one that does."
                )
            )
        elif code in (403, 530):
            self._fail(
                CdcUserError(
                    f"RabbitMQ refused to let user '{self.url.user}' publish to exchange '{self.exchange}' {reason}: "
                    "grant the user write permission on it, or set CDC_RABBITMQ_URL to a user that has it."
                )
            )
        else:
            self._fail(SinkConnectionLost(f"the broker closed the channel ({reason})"))

    def _on_return(self, _channel: Any, method: Any, _properties: Any, _body: bytes) -> None:
        """A mandatory message no queue is bound for: RabbitMQ returns it (then confirms it), so it was not
        delivered and the checkpoint must not move past it."""
        self._fail(
            CdcUserError(
                f"RabbitMQ returned a message of routing key '{method.routing_key}' as unroutable: no queue is bound to "
                f"exchange '{self.exchange}' for it; bind a queue for it, or leave the table out of the sink "
                "(CDC_RABBITMQ_EXCLUDE_TABLES)."
            )
        )

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        settled = self._in_flight.settle(method.delivery_tag, method.multiple)
        if isinstance(method, pika.spec.Basic.Nack):  # confirms may come out of order: keep the tags
            self._refused.update(settled)
            self.refused_records += len(settled)
        else:
            self._accepted += len(settled)
        self._check()

    # --- errors a user can fix ------------------------------------------------------------------------------

    def _open_error(self, error: BaseException) -> BaseException:
        if isinstance(error, pika.exceptions.ProbableAuthenticationError | pika.exceptions.AuthenticationError):
            return CdcUserError(
                f"RabbitMQ at {self.url} refused the login of user '{self.url.user}' (wrong user or password): fix "
                "the credentials in CDC_RABBITMQ_URL."
            )
        if isinstance(error, pika.exceptions.ProbableAccessDeniedError):
            return CdcUserError(
                f"RabbitMQ at {self.url} denied user '{self.url.user}' access to vhost '{self.url.vhost}' (missing, "
                "or no permission): create the vhost or grant the user access, or fix the vhost in CDC_RABBITMQ_URL."
            )
        return SinkConnectionLost(f"cannot connect ({error})")

    # --- the BrokerClient protocol (sinks/broker) -----------------------------------------------------------------

    def open(self) -> None:
        """Connect, switch the channel to confirm mode and check the exchange exists."""
        try:
            self._connect()
        except SinkConnectionLost as exc:
            raise CdcUserError(
                f"Cannot reach RabbitMQ at {self.url} ({exc}): start the broker or fix host and port in "
                "CDC_RABBITMQ_URL."
            ) from None

    def _connect(self) -> None:
        self.close()
        self._error, self._ready, self._next_tag, self._in_flight, self._refused = None, False, 1, InFlight(), {}
        parameters = pika.URLParameters(self.url.with_password())
        parameters.connection_attempts = 1
        parameters.socket_timeout = CONNECT_TIMEOUT_SECONDS
        parameters.stack_timeout = CONNECT_TIMEOUT_SECONDS
        parameters.blocked_connection_timeout = CONFIRM_TIMEOUT_SECONDS
        parameters.client_properties = {"connection_name": f"cdc-lakehouse sink {self.sink.name}"}
        self.connection = SelectConnection(
            parameters,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        self._run_until(lambda: self._ready, CONNECT_TIMEOUT_SECONDS * 2, "connecting")

    def reconnect(self) -> None:
        self._connect()

    def send(self, events: list[SinkEvent]) -> None:
        if not events:
            return
        if not self._ready or self.channel is None:
            raise SinkConnectionLost("not connected")
        todo = deque(events)
        published, announced = 0, False
        delay, refused_since, accepted_then = 0.05, time.monotonic(), self._accepted
        while todo or self._in_flight or self._refused:  # a window ends only once none is refused
            if self._refused:
                # nothing new goes out until every message in flight is settled; then the refused ones, first
                self._wait(lambda: not self._in_flight)
                if self._accepted != accepted_then:  # the broker took something since: not stuck
                    delay, refused_since, accepted_then = 0.05, time.monotonic(), self._accepted
                if time.monotonic() - refused_since > REFUSED_RETRY_SECONDS:
                    raise CdcUserError(
                        f"RabbitMQ kept refusing (nack) messages to exchange '{self.exchange}' at {self.url} for "
                        f"{REFUSED_RETRY_SECONDS:.0f} s (routing key '{self._refused[min(self._refused)].routing_key}'): make room in its "
                        "queues (a queue full under x-overflow reject-publish needs a consumer or a higher x-max-length) "
                        "or bring the queue back, then publish again; the checkpoint stays before them."
                    )
                time.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, 2.0)
                todo.extendleft(reversed([self._refused[tag] for tag in sorted(self._refused)]))
                self._refused = {}
                continue
            if not todo:
                if not announced:  # the whole window is out, its last confirms awaited
                    announced = True
                    failpoints.hit("sinks.published_unconfirmed")
                self._wait(lambda: not self._in_flight or bool(self._refused))
                continue
            head = todo[0]
            if not self._in_flight.can_go(head):
                self._wait(lambda: self._in_flight.can_go(head) or bool(self._refused))  # noqa: B023
                continue
            self._publish(todo.popleft())
            published += 1
            if published % PUMP_EVERY == 0:
                self._pump()

    def _wait(self, done: Callable[[], bool]) -> None:
        self._run_until(done, CONFIRM_TIMEOUT_SECONDS, "waiting for the broker's confirms")

    def _publish(self, event: SinkEvent) -> None:
        properties = pika.BasicProperties(
            content_type="application/json",
            delivery_mode=PERSISTENT,
            message_id=event.id,
            timestamp=int(event.commit_ts),
            type=event.kind,
        )
        try:
            # mandatory: a change no queue is bound for comes back (`_on_return`) instead of vanishing confirmed
            mandatory = event.kind != HEARTBEAT
            self.channel.basic_publish(self.exchange, event.routing_key, event.body, properties, mandatory)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise SinkConnectionLost(f"publishing failed ({exc})") from exc
        self._in_flight.add(self._next_tag, event)
        self._next_tag += 1

    def close(self) -> None:
        connection, self.connection, self.channel, self._ready = self.connection, None, None, False
        if connection is not None and not connection.is_closed:
            try:
                if not connection.is_closing:
                    connection.close()
                deadline = time.monotonic() + 5
                while not connection.is_closed and time.monotonic() < deadline:
                    connection.ioloop.call_later(0.05, connection.ioloop.stop)
                    connection.ioloop.start()
            except Exception:  # noqa: BLE001 - a connection that is going away anyway
                pass
        self._error = None
