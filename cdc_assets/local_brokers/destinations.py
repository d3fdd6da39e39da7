"""The demo's destinations on the local brokers: a durable topic exchange `cdc` with a durable queue `cdc-demo`
bound to every routing key, and a 2-shard Kinesis stream `cdc-demo`; and the environment that turns the sinks
on for them (what `cdc-lakehouse demo --sinks` and `make dev SINKS=1` use)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
import pika

from cdc_assets.local_brokers import kinesis, rabbitmq

LOCAL_DIR = Path(".local")
EXCHANGE = "cdc"
QUEUE = "cdc-demo"
STREAM = "cdc-demo"
SHARDS = 2
REGION = "us-east-1"
LOCAL_KEY = "local"  # the local Kinesis endpoint takes any credentials


@dataclass(frozen=True)
class DemoDestinations:
    rabbit: rabbitmq.LocalRabbit
    kinesis: kinesis.LocalKinesis

    def environment(self) -> dict[str, str]:
        """The variables that point both sinks at these destinations (AWS credentials and region only where the
        environment has none)."""
        env = {
            "CDC_RABBITMQ_URL": self.rabbit.url(),
            "CDC_RABBITMQ_EXCHANGE": EXCHANGE,
            "CDC_KINESIS_STREAM": STREAM,
            "AWS_ENDPOINT_URL_KINESIS": self.kinesis.endpoint_url,
        }
        for name, value in (("AWS_REGION", REGION), ("AWS_ACCESS_KEY_ID", LOCAL_KEY), ("AWS_SECRET_ACCESS_KEY", LOCAL_KEY)):
            if not os.environ.get(name):
                env[name] = value
        return env

    def kinesis_client(self):  # noqa: ANN201 - a boto3 client
        return boto3.client(
            "kinesis",
            endpoint_url=self.kinesis.endpoint_url,
            region_name=REGION,
            aws_access_key_id=LOCAL_KEY,
            aws_secret_access_key=LOCAL_KEY,
        )


def start(base: Path = LOCAL_DIR, empty: bool = False) -> DemoDestinations:
    """Both local brokers and the demo's exchange, queue and stream; `empty` starts the queue and stream empty."""
    found = DemoDestinations(rabbitmq.start(base / "rabbitmq"), kinesis.start(base / "kinesis"))
    with pika.BlockingConnection(pika.URLParameters(found.rabbit.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(EXCHANGE, "topic", durable=True)
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_bind(QUEUE, EXCHANGE, "#")
        if empty:
            channel.queue_purge(QUEUE)
    client = found.kinesis_client()
    names = client.list_streams().get("StreamNames", [])
    if empty and STREAM in names:
        client.delete_stream(StreamName=STREAM)
        names.remove(STREAM)
    if STREAM not in names:
        client.create_stream(StreamName=STREAM, ShardCount=SHARDS)
    deadline = time.monotonic() + 30
    while client.describe_stream_summary(StreamName=STREAM)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise RuntimeError(f"The local Kinesis stream {STREAM} did not become ACTIVE.")
        time.sleep(0.2)
    return found


def stop(base: Path = LOCAL_DIR) -> list[str]:
    """Stop both local brokers; returns those that were running."""
    stopped = []
    if rabbitmq.stop(base / "rabbitmq"):
        stopped.append("RabbitMQ")
    if kinesis.stop(base / "kinesis"):
        stopped.append("Kinesis")
    return stopped
