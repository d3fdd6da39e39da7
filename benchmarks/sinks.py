"""Sinks: workload (a) published to RabbitMQ and to Kinesis, messages per second beside the capture rate of the
same run, with memory.

    .venv/bin/python -m benchmarks.sinks [--runs 3] [--tables 200] [--rows-per-table 1000] [--oltp 50000]

Workload (a) is generated once on a fresh binlog (benchmarks/workloads.py). Each run, in fresh directories: the
capture alone in a child process (row changes/s and peak RSS, as `benchmarks.run` measures it), then `cdc-lakehouse
sync` with no sink (the change logs), then `cdc-lakehouse publish rabbitmq` and `cdc-lakehouse publish kinesis`,
each a process of its own timed from outside (wall seconds, peak RSS) to destinations started empty: a dedicated
RabbitMQ (the Debian package's server, a durable topic exchange and a durable queue bound to every routing key)
and a local Kinesis (moto_server, a 32-shard stream: see SHARDS), both on this machine. Messages/s is the messages the broker
acknowledged over the publish command's wall time (process start, Dagster's run and the publish), and over the
publish run alone. After the last run both destinations are read back and compared with the change logs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile

import boto3
import pika

from benchmarks.run import CAPTURE, child, timed
from benchmarks.workloads import BENCH_DIR, CLI, SCHEMA, fresh_server, generated, source_env, workload_options
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_brokers import kinesis as local_kinesis
from cdc_assets.local_brokers import rabbitmq as local_rabbitmq
from cdc_assets.sinks.consume import read_queue, read_stream
from cdc_assets.sinks.delivery import check_delivery, expected_messages
from cdc_assets.sinks.settings import sink_settings

READER_SERVER_ID = 4245
EXCHANGE = QUEUE = STREAM = "bench"
REGION = "us-east-1"
PUBLISHED = re.compile(r"sink (\w+): (\d+) messages \(([\d,]+) bytes\)")
RUN_SECONDS = re.compile(r"publish succeeded in [\d.]+s \(runs ([\d.]+)s\)")  # the publish runs' own seconds
# moto's Kinesis finds the next sequence number of a shard by listing all the shard's records, for every record put:
# O(records per shard). Over 32 shards workload (a) puts ~8k records per shard, which keeps that cost out of the
# figures (over 2 shards the first run had not finished after 8 minutes). Schema changes go to every shard.
SHARDS = 32


def _empty_destinations(rabbit: local_rabbitmq.LocalRabbit, kinesis_url: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(rabbit.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(EXCHANGE, "topic", durable=True)
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_bind(QUEUE, EXCHANGE, "#")
        channel.queue_purge(QUEUE)
    client = boto3.client("kinesis", endpoint_url=kinesis_url, region_name=REGION, aws_access_key_id="bench", aws_secret_access_key="bench")
    if STREAM in client.list_streams().get("StreamNames", []):
        client.delete_stream(StreamName=STREAM)
    client.create_stream(StreamName=STREAM, ShardCount=SHARDS)


def _publish(env: dict[str, str], sink: str) -> dict:
    result = timed(env, CLI, "publish", sink)
    found = PUBLISHED.search(result["out"])
    run = RUN_SECONDS.search(result["out"])
    if result["code"] != 0 or found is None or run is None:
        raise SystemExit(f"publish {sink} failed:\n{result['out']}{result['err']}")
    messages = int(found.group(2))
    return {
        "messages": messages,
        "bytes": int(found.group(3).replace(",", "")),
        "seconds": result["seconds"],
        "run_seconds": float(run.group(1)),
        "peak_mb": result["peak_mb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_options(parser)
    args = parser.parse_args()

    server = fresh_server()
    workload = generated(server, args)
    brokers = BENCH_DIR / "brokers"
    local_rabbitmq.remove(brokers / "rabbitmq")
    rabbit = local_rabbitmq.start(brokers / "rabbitmq")
    kinesis = local_kinesis.start(brokers / "kinesis")
    base_env = {
        **source_env(server, READER_SERVER_ID),
        "AWS_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_ENDPOINT_URL_KINESIS": kinesis.endpoint_url,
        "CDC_RABBITMQ_EXCHANGE": EXCHANGE,
    }
    for name in ("CDC_RABBITMQ_URL", "CDC_KINESIS_STREAM", "CDC_SINK_DEDUP_SECONDS", "CDC_SINK_HEARTBEAT_SECONDS"):
        base_env.pop(name, None)
    runs: dict[str, list[dict]] = {"capture": [], "rabbitmq": [], "kinesis": []}
    lakehouse = ""
    try:
        for i in range(args.runs):
            out = tempfile.mkdtemp(prefix="cdc-bench-sinks-capture-")
            capture = child(CAPTURE.format(server_id=READER_SERVER_ID, schema=SCHEMA), {**base_env, "OUT_DIR": out})
            shutil.rmtree(out, ignore_errors=True)
            runs["capture"].append(capture)
            if lakehouse:
                shutil.rmtree(lakehouse, ignore_errors=True)
            lakehouse = tempfile.mkdtemp(prefix="cdc-bench-sinks-lake-")
            env = {**base_env, "CDC_LAKEHOUSE": lakehouse, "DAGSTER_HOME": tempfile.mkdtemp(prefix="cdc-bench-sinks-dh-")}
            sync = timed(env, CLI, "sync")
            if sync["code"] != 0:
                raise SystemExit(f"sync failed:\n{sync['out']}{sync['err']}")
            _empty_destinations(rabbit, kinesis.endpoint_url)
            sink_env = {**env, "CDC_RABBITMQ_URL": rabbit.url(), "CDC_KINESIS_STREAM": STREAM}
            print(
                f"  run {i + 1}: capture {capture['rows'] / capture['seconds']:,.0f} row changes/s ({capture['seconds']:.1f} s, "
                f"peak {capture['peak_mb']:.0f} MB); sync {sync['seconds']:.1f} s",
                flush=True,
            )
            for sink in ("rabbitmq", "kinesis"):
                published = _publish(sink_env, sink)
                runs[sink].append(published)
                print(
                    f"  run {i + 1}: {sink} {published['messages']:,} messages in {published['seconds']:.1f} s "
                    f"(run {published['run_seconds']:.1f} s, peak {published['peak_mb']:.0f} MB)",
                    flush=True,
                )
        settings_env = {**base_env, "CDC_RABBITMQ_URL": rabbit.url(), "CDC_KINESIS_STREAM": STREAM}
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"})  # the local Kinesis takes any
        house = Lakehouse(lakehouse)
        for sink, received in (
            ("rabbitmq", read_queue(rabbit.url(), QUEUE)),
            ("kinesis", read_stream(STREAM, REGION, kinesis.endpoint_url)),
        ):
            report = check_delivery(expected_messages(house, sink_settings(sink, settings_env)), received)
            print(f"  {sink} read back after the last run: {report.describe() if report.ok else 'FAILED: ' + report.describe()}", flush=True)
    finally:
        local_kinesis.stop(brokers / "kinesis")
        local_rabbitmq.stop(brokers / "rabbitmq")
        if lakehouse:
            shutil.rmtree(lakehouse, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    capture_rate = median("capture", "rows") / median("capture", "seconds")
    rows = [("capture (same runs): row changes/s", f"{capture_rate:,.0f}", ""), ("capture: peak RSS (MB)", f"{median('capture', 'peak_mb'):.0f}", "")]
    for sink in ("rabbitmq", "kinesis"):
        messages = median(sink, "messages")
        wall = messages / median(sink, "seconds")
        run = messages / median(sink, "run_seconds")
        rows += [
            (f"{sink}: messages published", f"{messages:,.0f}", f"{median(sink, 'bytes') / 1e6:,.1f} MB of JSON"),
            (f"{sink}: messages/s, `publish` command wall time", f"{wall:,.0f}", f"{wall / capture_rate:.2f}x the capture rate"),
            (f"{sink}: messages/s, the publish run alone", f"{run:,.0f}", f"{run / capture_rate:.2f}x the capture rate"),
            (f"{sink}: `publish` peak RSS (MB)", f"{median(sink, 'peak_mb'):.0f}", ""),
        ]
    print(f"\nmedians of {args.runs} runs, workload (a), {workload.row_changes} row changes")
    print("| figure | value | note |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
