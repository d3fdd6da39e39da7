"""Reading a destination back, as a consumer would: every message of a RabbitMQ queue, every record of each shard
of a Kinesis stream, in the order the broker delivers them. The demo, the benchmark and the tests compare what
they read with the change logs (sinks/delivery.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import boto3
import pika

from cdc_assets.sinks.settings import AmqpUrl


@dataclass(frozen=True)
class Received:
    """One message as a consumer got it: the stream it came on (queue or shard), its id and body."""

    stream: str
    id: str
    body: dict[str, Any]
    partition_key: str | None = None  # Kinesis
    routing_key: str | None = None  # RabbitMQ


def read_queue(url: str, queue: str, idle_seconds: float = 2.0) -> list[Received]:
    """Every message in `queue`, in delivery order, acknowledged (taken off the queue) once read."""
    connection = pika.BlockingConnection(pika.URLParameters(AmqpUrl.parse(url).with_password()))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        received: list[Received] = []
        for method, properties, body in channel.consume(queue, inactivity_timeout=idle_seconds):
            if method is None:
                break
            received.append(Received(queue, str(properties.message_id), json.loads(body), routing_key=method.routing_key))
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
        return received
    finally:
        connection.close()


def read_stream(stream: str, region: str | None = None, endpoint_url: str | None = None) -> list[Received]:
    """Every record of every shard of `stream` from its oldest, shard after shard, each in shard order."""
    client = boto3.client("kinesis", region_name=region, endpoint_url=endpoint_url)
    received: list[Received] = []
    shards = client.list_shards(StreamName=stream)["Shards"]
    for shard in shards:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = client.get_records(ShardIterator=iterator, Limit=10_000)
            for record in page["Records"]:
                body = json.loads(record["Data"])
                received.append(Received(shard["ShardId"], str(body["id"]), body, partition_key=record["PartitionKey"]))
            if not page["Records"] and not page.get("MillisBehindLatest"):
                break
            iterator = page.get("NextShardIterator")
    return received
