"""What a sink publishes and where: plain settings parsed from the environment's texts (docs/sinks.md).

A sink is on when its destination is set: `CDC_RABBITMQ_URL` for RabbitMQ, `CDC_KINESIS_STREAM` for Kinesis.
Passwords live only in memory: `AmqpUrl` never prints one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlparse

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import TableFilter, refuse_unencoded_userinfo, sink_seconds

RABBITMQ = "rabbitmq"
KINESIS = "kinesis"
SINK_NAMES = (RABBITMQ, KINESIS)
DEFAULT_EXCHANGE = "cdc"
KINESIS_STREAM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # Kinesis's rule for a stream name

# the environment variable that turns each sink on, and those of its table globs
ENABLING_VARIABLE = {RABBITMQ: "CDC_RABBITMQ_URL", KINESIS: "CDC_KINESIS_STREAM"}
TABLES_VARIABLES = {
    RABBITMQ: ("CDC_RABBITMQ_TABLES", "CDC_RABBITMQ_EXCLUDE_TABLES"),
    KINESIS: ("CDC_KINESIS_TABLES", "CDC_KINESIS_EXCLUDE_TABLES"),
}


@dataclass(frozen=True)
class AmqpUrl:
    """`amqp://user:password@host:port/vhost` of a RabbitMQ broker (`amqps://` for TLS)."""

    scheme: str
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    vhost: str = "/"

    @staticmethod
    def parse(url: str) -> AmqpUrl:
        refuse_unencoded_userinfo(url, "CDC_RABBITMQ_URL", "amqp://user:pa%23ss@host:5672/%2F")
        parsed = urlparse(url)
        if parsed.scheme not in ("amqp", "amqps") or not parsed.hostname:
            raise CdcUserError(
                "CDC_RABBITMQ_URL is not a valid URL: write it as amqp://user:password@host:port/vhost "
                "(vhost %2F for the default '/')."
            )
        try:
            port = parsed.port or (5671 if parsed.scheme == "amqps" else 5672)
        except ValueError as exc:
            raise CdcUserError(
                "CDC_RABBITMQ_URL has an invalid port: write it as amqp://user:password@host:port/vhost."
            ) from exc
        path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
        vhost = unquote(path) if path else "/"
        return AmqpUrl(
            parsed.scheme, parsed.hostname, port, unquote(parsed.username or "guest"), unquote(parsed.password or "guest"), vhost
        )

    def __str__(self) -> str:
        return f"{self.scheme}://{self.user}@{self.host}:{self.port}/{quote(self.vhost, safe='')}"

    def with_password(self) -> str:
        """The whole URL, password included, for the client library only (never printed)."""
        user, password = quote(self.user, safe=""), quote(self.password, safe="")
        return f"{self.scheme}://{user}:{password}@{self.host}:{self.port}/{quote(self.vhost, safe='')}"


@dataclass(frozen=True)
class SinkSettings:
    """One sink: its name (`rabbitmq` or `kinesis`), destination, tables and options.

    dedup_seconds > 0 collapses repeated updates of a key committed within that many seconds into the newest
    (and holds changes younger than that back until the next run); heartbeat_seconds > 0 sends a heartbeat
    message when that long has passed since the last one.
    """

    name: str
    table_filter: TableFilter = field(default_factory=TableFilter)
    dedup_seconds: float = 0.0
    heartbeat_seconds: float = 0.0
    rabbitmq_url: AmqpUrl | None = None
    exchange: str = DEFAULT_EXCHANGE
    stream: str | None = None
    region: str | None = None  # Kinesis: AWS_REGION (or AWS_DEFAULT_REGION)

    @property
    def destination(self) -> str:
        """Where messages go, for messages to a user (no secret)."""
        if self.name == RABBITMQ:
            return f"RabbitMQ exchange '{self.exchange}' at {self.rabbitmq_url}"
        return f"Kinesis stream '{self.stream}'"

    def includes(self, schema: str, table: str) -> bool:
        return self.table_filter.matches(schema, table)


def configured_sink_names(env: Mapping[str, str]) -> list[str]:
    """The sinks whose destination is set, in a fixed order."""
    return [name for name in SINK_NAMES if env.get(ENABLING_VARIABLE[name])]


def sink_settings(name: str, env: Mapping[str, str]) -> SinkSettings:
    """The settings of sink `name` from the environment's texts; a bad value raises CdcUserError with the fix."""
    if name not in SINK_NAMES:
        raise CdcUserError(f"There is no sink named '{name}': use one of {', '.join(SINK_NAMES)}.")
    if not env.get(ENABLING_VARIABLE[name]):
        raise CdcUserError(
            f"The {name} sink is not configured: set {ENABLING_VARIABLE[name]} (see docs/sinks.md)."
        )
    include, exclude = TABLES_VARIABLES[name]
    common = {
        "name": name,
        "table_filter": TableFilter.parse(env.get(include), env.get(exclude)),
        "dedup_seconds": sink_seconds(env, "CDC_SINK_DEDUP_SECONDS"),
        "heartbeat_seconds": sink_seconds(env, "CDC_SINK_HEARTBEAT_SECONDS"),
    }
    if name == RABBITMQ:
        exchange = env.get("CDC_RABBITMQ_EXCHANGE") or DEFAULT_EXCHANGE
        return SinkSettings(**common, rabbitmq_url=AmqpUrl.parse(env[ENABLING_VARIABLE[name]]), exchange=exchange)
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    stream = env[ENABLING_VARIABLE[name]]
    if not KINESIS_STREAM_NAME.fullmatch(stream):
        raise CdcUserError(
            f"CDC_KINESIS_STREAM={stream!r} is not a Kinesis stream name: use 1 to 128 letters, digits, '_', '.' or '-' "
            "(the stream's name, not its ARN)."
        )
    return SinkSettings(**common, stream=stream, region=region)
