"""Sinks against real brokers: the project's own RabbitMQ (the Debian package's server, one per session) and
Kinesis through moto_server over HTTP (the session's S3 endpoint serves Kinesis too). Every test reads every
message back as a consumer would and compares it with the change logs: the same changes, in order per key,
nothing missing; re-sent copies only where a crash or a lost broker made them, and never more than one window."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pika
import pytest
from dagster import AssetCheckSeverity, DagsterInstance, build_sensor_context

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance
from cdc_assets.core import failpoints
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import LAG_JOB, sink_asset_key
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.local_brokers import rabbitmq as local_rabbitmq
from cdc_assets.local_source.server import free_port
from cdc_assets.sinks.checkpoint import checkpoint_key, load_checkpoint
from cdc_assets.sinks.consume import Received, read_queue, read_stream
from cdc_assets.sinks.delivery import DeliveryReport, check_delivery, expected_messages, replayed_rows
from cdc_assets.sinks.publish import WINDOW_MESSAGES
from cdc_assets.sinks.settings import sink_settings
from cdc_assets_tests.conftest import CdcEnv, S3Faults

REGION = "us-east-1"
SINK_VARIABLES = (
    "CDC_RABBITMQ_URL", "CDC_RABBITMQ_EXCHANGE", "CDC_RABBITMQ_TABLES", "CDC_RABBITMQ_EXCLUDE_TABLES", "CDC_KINESIS_STREAM",
    "CDC_KINESIS_TABLES", "CDC_KINESIS_EXCLUDE_TABLES", "CDC_SINK_DEDUP_SECONDS", "CDC_SINK_HEARTBEAT_SECONDS",
    "CDC_SINK_LAG_WARN_SECONDS", "CDC_SINK_LAG_FAIL_SECONDS", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_KINESIS",
)  # fmt: skip


@dataclass
class Sinks:
    """A test's own exchange with a durable queue bound to every routing key, and its own 2-shard stream."""

    cdc: CdcEnv
    rabbit: local_rabbitmq.LocalRabbit
    exchange: str
    queue: str
    stream: str
    kinesis_url: str
    monkeypatch: pytest.MonkeyPatch

    def on(self, *names: str) -> None:
        """Turn these sinks on (and the others off) in the environment the CLI and the definitions read."""
        self.monkeypatch.delenv("CDC_RABBITMQ_URL", raising=False)
        self.monkeypatch.delenv("CDC_KINESIS_STREAM", raising=False)
        if "rabbitmq" in names:
            self.monkeypatch.setenv("CDC_RABBITMQ_URL", self.rabbit.url())
        if "kinesis" in names:
            self.monkeypatch.setenv("CDC_KINESIS_STREAM", self.stream)

    def rabbit_messages(self) -> list[Received]:
        return read_queue(self.rabbit.url(), self.queue, idle_seconds=0.5)

    def kinesis_messages(self) -> list[Received]:
        return read_stream(self.stream, REGION, self.kinesis_url)

    def queue_depth(self) -> int:
        with pika.BlockingConnection(pika.URLParameters(self.rabbit.url())) as connection:
            return connection.channel().queue_declare(self.queue, durable=True, passive=True).method.message_count

    def check(self, sink: str, received: list[Received], flags: dict[str, str] | None = None) -> DeliveryReport:
        """`received` against what the sink was to publish, under the settings the publishing command had: the
        environment with its flags' variables over it (`flags`), as the CLI builds them."""
        env = {**os.environ, "CDC_RABBITMQ_URL": self.rabbit.url(), "CDC_KINESIS_STREAM": self.stream, **(flags or {})}
        return check_delivery(expected_messages(self.cdc.lakehouse, sink_settings(sink, env)), received)

    def checkpoint_bytes(self, sink: str) -> bytes | None:
        path = self.cdc.lakehouse_dir / checkpoint_key(sink)
        return path.read_bytes() if path.exists() else None


@pytest.fixture
def sinks(cdc: CdcEnv, rabbitmq: local_rabbitmq.LocalRabbit, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sinks]:
    name = cdc.database
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(name, "topic", durable=True)
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, name, "#")
    client = boto3.client("kinesis", region_name=REGION, endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_stream(StreamName=name, ShardCount=2)
    for variable in SINK_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in {"CDC_RABBITMQ_EXCHANGE": name, "AWS_ENDPOINT_URL_KINESIS": s3_endpoint, "AWS_REGION": REGION,
                            "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():  # fmt: skip
        monkeypatch.setenv(variable, value)
    found = Sinks(cdc, rabbitmq, name, name, name, s3_endpoint, monkeypatch)
    found.on("rabbitmq", "kinesis")
    yield found
    client.delete_stream(StreamName=name)
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.url())) as connection:
        connection.channel().queue_delete(name)
        connection.channel().exchange_delete(name)


def test_the_local_rabbitmq_keeps_its_password_and_cookie_private(rabbitmq: local_rabbitmq.LocalRabbit) -> None:
    for name, mode in (("password", 0o600), ("rabbitmq.conf", 0o600), (".erlang.cookie", 0o400)):
        path = rabbitmq.base_dir / name
        assert path.stat().st_mode & 0o777 == mode, (name, oct(path.stat().st_mode))
    assert rabbitmq.password in (rabbitmq.base_dir / "rabbitmq.conf").read_text()  # why it must be private


def _source_items(cdc: CdcEnv) -> dict[str, str | None]:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, name FROM items")
        return {json.dumps({"id": i}): n for i, n in cur.fetchall()}


def _sink_metadata(sink: str) -> dict:
    event = instance().get_latest_materialization_event(sink_asset_key(sink))
    assert event is not None
    return {k: getattr(v, "value", v) for k, v in event.asset_materialization.metadata.items()}


def _sensor_requests() -> list[str] | str:
    """The sink sensor's tick on the CLI's instance: the jobs it requests, or why it skips."""
    sensor = next(s for s in build_definitions().sensors if s.name == "sink_sensor")
    resources = initialized_resources()
    with build_sensor_context(instance=instance(), resources={"lakehouse": resources.lakehouse, "sinks": resources.sinks}) as context:
        result = sensor.evaluate_tick(context)
    if result.skip_message:
        return result.skip_message
    return sorted(r.job_name for r in result.run_requests)


def test_sync_publishes_every_change_to_both_sinks_in_order_per_key(cdc: CdcEnv, sinks: Sinks, capsys) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), made DATETIME(6), photo BLOB)",
        "CREATE TABLE pairs (a INT, b VARCHAR(10), PRIMARY KEY (a, b))",
        "CREATE TABLE notes (v INT)",
        "CREATE TABLE audit (id INT PRIMARY KEY)",
        "INSERT INTO items VALUES (1, 'a', 1.50, '2024-01-01 00:00:00.5', x'00ff'), (2, 'b', NULL, NULL, NULL), (3, 'c', 3, NOW(6), '')",
        "UPDATE items SET name = 'a2' WHERE id = 1",
        "UPDATE items SET id = 20 WHERE id = 2",
        "DELETE FROM items WHERE id = 3",
        "INSERT INTO pairs VALUES (1, 'x'), (1, 'y')",
        "UPDATE pairs SET b = 'z' WHERE a = 1 AND b = 'x'",
        "INSERT INTO notes VALUES (1), (1)",
        "DELETE FROM notes LIMIT 1",
        "INSERT INTO audit VALUES (1)",
        "ALTER TABLE items ADD COLUMN extra INT DEFAULT 5",
        "INSERT INTO items (id, name) VALUES (4, 'd')",
        "TRUNCATE TABLE pairs",
        "INSERT INTO pairs VALUES (2, 'w')",
        "RENAME TABLE notes TO notes2",
        "INSERT INTO notes2 VALUES (7)",
    )
    assert main(["--kinesis-exclude-tables", f"{db}.audit", "sync"]) == 0
    flag = {"CDC_KINESIS_EXCLUDE_TABLES": f"{db}.audit"}  # that command's own: the CLI writes no environment
    out = capsys.readouterr().out
    assert "sink rabbitmq: " in out and "sink kinesis: " in out, out
    rabbit, kinesis = sinks.rabbit_messages(), sinks.kinesis_messages()
    for sink, received in (("rabbitmq", rabbit), ("kinesis", kinesis)):
        report = sinks.check(sink, received, flag)
        assert report.ok and report.duplicates == 0 and report.heartbeats == 0, (sink, report.describe())
    # per-sink table globs: Kinesis leaves `audit` out, RabbitMQ has it
    assert any(m.body["source"]["table"] == "audit" for m in rabbit)
    assert not any(m.body["source"]["table"] == "audit" for m in kinesis)
    # both shards got the TRUNCATE and each schema change; routing keys are <schema>.<table>
    assert {m.stream for m in kinesis if m.body.get("op") == "t"} == {"shardId-000000000000", "shardId-000000000001"}
    assert {m.routing_key for m in rabbit} >= {f"{db}.items", f"{db}.pairs", f"{db}.notes", f"{db}.notes2"}
    # a consumer applying the messages ends with the source's rows
    assert {k: v["name"] for k, v in replayed_rows(rabbit)[f"{db}.items"].items()} == _source_items(cdc)
    assert {k: v["name"] for k, v in replayed_rows(kinesis)[f"{db}.items"].items()} == _source_items(cdc)
    metadata = _sink_metadata("rabbitmq")
    top = max(m.body["_cdc_seq"] for m in rabbit)
    assert (metadata["messages"], metadata["last_seq"], metadata["lag_seconds"], metadata["pending_changes"]) == (len(rabbit), top, 0.0, 0)
    assert metadata["bytes"] > 0
    assert _sensor_requests() == "rabbitmq: no new changes in the change logs since the last publish; kinesis: no new changes in the change logs since the last publish"

    # the change logs move on without the sinks; the sensor asks each sink to publish; each sends only what is new
    sinks.on()
    cdc.execute("UPDATE items SET name = 'again' WHERE id = 1", "INSERT INTO items (id, name) VALUES (5, 'e')")
    assert cdc.sync() == 0
    sinks.on("rabbitmq", "kinesis")
    assert _sensor_requests() == ["publish_kinesis", "publish_rabbitmq"]
    assert main(["publish"]) == 0
    new_rabbit, new_kinesis = sinks.rabbit_messages(), sinks.kinesis_messages()
    assert [m.body["op"] for m in new_rabbit] == ["u", "c"]
    assert sinks.check("rabbitmq", rabbit + new_rabbit).ok and sinks.check("kinesis", new_kinesis).ok
    assert {k: v["name"] for k, v in replayed_rows(rabbit + new_rabbit)[f"{db}.items"].items()} == _source_items(cdc)
    assert isinstance(_sensor_requests(), str)
    capsys.readouterr()
    assert main(["status"]) == 0
    status = capsys.readouterr().out
    assert f"rabbitmq -> RabbitMQ exchange '{sinks.exchange}'" in status and "0 changes pending" in status, status


def _bulk(cdc: CdcEnv, rows: int) -> None:
    cdc.execute(
        "CREATE TABLE bulk (id INT PRIMARY KEY, v INT, pad VARCHAR(100))",
        f"INSERT INTO bulk SELECT seq, 0, REPEAT('x', 100) FROM seq_1_to_{rows}",
        "UPDATE bulk SET v = v + 1 WHERE id % 7 = 0",
    )


def _kill_when(process: subprocess.Popen, delivered: Callable[[], int], at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while delivered() < at_least:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the publish did not get that far"
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def test_sigkill_mid_publish_sends_again_at_most_the_unacknowledged_window(cdc: CdcEnv, sinks: Sinks) -> None:
    _bulk(cdc, 2_500)
    sinks.on()
    assert cdc.sync() == 0
    for sink, delivered in (
        ("rabbitmq", sinks.queue_depth),
        ("kinesis", lambda: len(sinks.kinesis_messages())),
    ):
        sinks.on(sink)
        # the second window is acknowledged by the broker, then the process sleeps before moving the checkpoint: killed there
        child = subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.cli", "publish", sink],
            env={**os.environ, failpoints.ENV: "sinks.window_acknowledged=sleep:120@2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _kill_when(child, delivered, 2 * WINDOW_MESSAGES)
        assert child.returncode == -signal.SIGKILL
        assert load_checkpoint(cdc.lakehouse.store, sink).messages == WINDOW_MESSAGES  # the first window only
        assert main(["publish", sink]) == 0
        received = sinks.rabbit_messages() if sink == "rabbitmq" else sinks.kinesis_messages()
        report = sinks.check(sink, received)
        assert report.ok, (sink, report.describe())
        assert report.duplicates == WINDOW_MESSAGES, (sink, report.describe())  # exactly the unacknowledged window
        assert report.expected == 1 + 2_500 + 357


def test_rabbitmq_stopped_and_restarted_during_a_publish(cdc: CdcEnv, sinks: Sinks) -> None:
    _bulk(cdc, 3_000)
    sinks.on()
    assert cdc.sync() == 0
    sinks.on("rabbitmq")
    restarted = threading.Event()

    def broker_goes_away() -> None:
        """Stops the broker while the second window's confirms are outstanding; starts it again meanwhile."""
        local_rabbitmq.stop(sinks.rabbit.base_dir)
        threading.Thread(target=lambda: (local_rabbitmq.start(sinks.rabbit.base_dir), restarted.set()), daemon=True).start()

    with failpoints.arm("sinks.published_unconfirmed", broker_goes_away, on_hit=2):
        assert main(["publish", "rabbitmq"]) == 0
    assert restarted.is_set()
    assert _sink_metadata("rabbitmq")["reconnects"] >= 1
    report = sinks.check("rabbitmq", sinks.rabbit_messages())
    assert report.ok and report.duplicates <= WINDOW_MESSAGES, report.describe()


def test_rabbitmq_refusing_messages_sends_them_again_without_reordering_a_key(cdc: CdcEnv, sinks: Sinks, monkeypatch) -> None:
    """A queue full under `x-overflow: reject-publish` makes RabbitMQ nack messages while a slow consumer frees room:
    the refused ones are sent again and still reach the queue before every later change of their key."""
    db = cdc.database
    cdc.execute(
        "CREATE TABLE hot (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE loose (v INT)",
        "INSERT INTO hot SELECT seq, 0 FROM seq_1_to_20",
        *[f"UPDATE hot SET v = {i} WHERE id = {1 + i % 3}" for i in range(1, 31)],
        "INSERT INTO loose VALUES (1), (1), (2)",
        "UPDATE loose SET v = 3",
        "DELETE FROM loose LIMIT 1",
    )
    sinks.on()
    assert cdc.sync() == 0
    exchange = f"{db}_small"
    with pika.BlockingConnection(pika.URLParameters(sinks.rabbit.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(exchange, durable=True, arguments={"x-max-length": 5, "x-overflow": "reject-publish"})
        channel.queue_bind(exchange, exchange, "#")
    received: list[Received] = []
    published = threading.Event()

    def slow_consumer() -> None:
        time.sleep(1.0)  # the queue fills first: the window's last messages are refused too
        with pika.BlockingConnection(pika.URLParameters(sinks.rabbit.url())) as connection:
            channel = connection.channel()
            while True:
                method, properties, body = channel.basic_get(exchange, auto_ack=True)
                if method is None:
                    if published.is_set():
                        return
                    time.sleep(0.02)
                    continue
                received.append(Received(exchange, str(properties.message_id), json.loads(body), routing_key=method.routing_key))
                time.sleep(0.01)

    consumer = threading.Thread(target=slow_consumer, daemon=True)
    consumer.start()
    monkeypatch.setenv("CDC_RABBITMQ_EXCHANGE", exchange)
    sinks.on("rabbitmq")
    try:
        assert main(["publish", "rabbitmq"]) == 0
    finally:
        published.set()
        consumer.join(timeout=60)
        with pika.BlockingConnection(pika.URLParameters(sinks.rabbit.url())) as connection:
            connection.channel().queue_delete(exchange)
            connection.channel().exchange_delete(exchange)
    assert _sink_metadata("rabbitmq")["refused_records"] > 0  # the broker did refuse some
    report = sinks.check("rabbitmq", received)
    assert report.ok and report.expected == 2 + 20 + 30 + 3 + 3 + 1, report.describe()
    assert {k: v["v"] for k, v in replayed_rows(received)[f"{db}.hot"].items()} == {
        json.dumps({"id": i}): v for i, v in [(1, 30), (2, 28), (3, 29)] + [(i, 0) for i in range(4, 21)]
    }


def test_kinesis_throttled_and_unreachable_during_a_publish(cdc: CdcEnv, sinks: Sinks, s3_faults: S3Faults, monkeypatch) -> None:
    _bulk(cdc, 1_500)
    sinks.on()
    assert cdc.sync() == 0
    sinks.on("kinesis")
    monkeypatch.setenv("AWS_ENDPOINT_URL_KINESIS", s3_faults.url)
    s3_faults.set(
        {"target": "PutRecords", "action": "refuse_odd_records", "times": 3},
        {"target": "PutRecords", "action": "reset", "times": 4},
    )
    assert main(["publish", "kinesis"]) == 0
    actions = [r["action"] for r in s3_faults.injected()]
    assert actions.count("refuse_odd_records") == 3 and actions.count("reset") == 4
    metadata = _sink_metadata("kinesis")
    assert metadata["refused_records"] >= 3 and metadata["reconnects"] >= 1
    report = sinks.check("kinesis", sinks.kinesis_messages())
    assert report.ok, report.describe()


@pytest.fixture
def moto_with_auth(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A moto_server that checks credentials (after the 3 calls that create its user), for wrong credentials."""
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        iam = boto3.client("iam", endpoint_url=url, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
        deadline = time.monotonic() + 30
        while True:
            try:
                iam.create_user(UserName="cdc")
                break
            except Exception:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        key = iam.create_access_key(UserName="cdc")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="cdc", PolicyName="all", PolicyDocument=json.dumps(policy))
        yield url, {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_bad_sink_settings_end_in_one_sentence_and_leave_the_checkpoint(
    cdc: CdcEnv, sinks: Sinks, monkeypatch, capsys, moto_with_auth
) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    assert cdc.sync() == 0
    sinks.on()
    cdc.execute("INSERT INTO t VALUES (3)")
    assert cdc.sync() == 0
    capsys.readouterr()
    before = {sink: sinks.checkpoint_bytes(sink) for sink in ("rabbitmq", "kinesis")}
    assert all(before.values())
    closed = f"127.0.0.1:{free_port()}"
    auth_url, auth_keys = moto_with_auth
    unbound = f"{sinks.exchange}_unbound"  # an exchange no queue is bound to: a mandatory message comes back
    with pika.BlockingConnection(pika.URLParameters(sinks.rabbit.url())) as connection:
        connection.channel().exchange_declare(unbound, "topic", durable=False, auto_delete=False)
    cases = [
        ("rabbitmq", {"CDC_RABBITMQ_URL": f"amqp://cdc:x@{closed}/%2F"}, "Cannot reach RabbitMQ at amqp://cdc@"),
        ("rabbitmq", {"CDC_RABBITMQ_URL": sinks.rabbit.url().replace(sinks.rabbit.password, "wrong")}, "refused the login of user 'cdc'"),
        ("rabbitmq", ["--rabbitmq-exchange", "no_such_exchange"], "The RabbitMQ exchange 'no_such_exchange' does not exist"),
        ("rabbitmq", ["--rabbitmq-exchange", unbound], f"RabbitMQ returned a message of routing key '{cdc.database}.t' as "
         f"unroutable: no queue is bound to exchange '{unbound}' for it; bind a queue"),  # fmt: skip
        ("kinesis", {"AWS_ENDPOINT_URL_KINESIS": f"http://{closed}"}, "Cannot reach Kinesis at"),
        ("kinesis", ["--kinesis-stream", "no_such_stream"], "The Kinesis stream 'no_such_stream' does not exist"),
        ("kinesis", ["--kinesis-stream", "my stream"], "--kinesis-stream 'my stream' is not a Kinesis stream name: use"),
        ("kinesis", {"AWS_ENDPOINT_URL_KINESIS": auth_url, "AWS_ACCESS_KEY_ID": auth_keys["AWS_ACCESS_KEY_ID"],
                     "AWS_SECRET_ACCESS_KEY": "wrong"}, "Kinesis refused the AWS credentials"),  # fmt: skip
    ]
    for sink, env, sentence in cases:
        with monkeypatch.context() as patch:
            sinks.on(sink)
            flags = env if isinstance(env, list) else []  # global flags override the environment (and are restored)
            for name, value in (env.items() if isinstance(env, dict) else []):
                patch.setenv(name, value)
            for name in ("CDC_RABBITMQ_EXCHANGE", "CDC_KINESIS_STREAM"):
                if name in os.environ:
                    patch.setenv(name, os.environ[name])  # so that what a flag sets is undone with the context
            assert main([*flags, "publish", sink]) == 2, sentence
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and sentence in lines[0], err
        assert "Traceback" not in err and sinks.rabbit.password not in err and auth_keys["AWS_SECRET_ACCESS_KEY"] not in err
        assert {s: sinks.checkpoint_bytes(s) for s in before} == before
    with pika.BlockingConnection(pika.URLParameters(sinks.rabbit.url())) as connection:
        connection.channel().exchange_delete(unbound)
    sinks.on("rabbitmq", "kinesis")
    assert main(["publish"]) == 0  # with the settings fixed, nothing was lost
    assert sinks.check("rabbitmq", sinks.rabbit_messages()).ok and sinks.check("kinesis", sinks.kinesis_messages()).ok


def _lag_checks() -> dict[str, tuple[bool, AssetCheckSeverity]]:
    result = build_definitions().resolve_job_def(LAG_JOB).execute_in_process(instance=DagsterInstance.ephemeral())
    return {e.asset_key.to_user_string(): (e.passed, e.severity) for e in result.get_asset_check_evaluations() if e.check_name == "sink_lag"}


def test_a_sink_that_is_down_holds_only_its_own_checkpoint_and_its_lag_warns_then_fails(
    cdc: CdcEnv, sinks: Sinks, monkeypatch, capsys
) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    assert cdc.sync() == 0
    held = sinks.checkpoint_bytes("rabbitmq")
    assert held is not None
    capsys.readouterr()
    # RabbitMQ is unreachable (listed first, so it is tried first), then badly configured: each time capture, the
    # change logs, current state and the Kinesis sink go on, and RabbitMQ's checkpoint stays exactly where it was
    for step, (url, sentence) in enumerate(
        [(f"amqp://cdc:x@127.0.0.1:{free_port()}/%2F", "Cannot reach RabbitMQ"), ("http://broker", "CDC_RABBITMQ_URL is not a valid URL")]
    ):
        monkeypatch.setenv("CDC_RABBITMQ_URL", url)
        cdc.execute(f"UPDATE t SET v = {10 + step} WHERE id = 1", f"INSERT INTO t VALUES ({3 + step}, 0)")
        assert cdc.sync() == 2
        err = capsys.readouterr().err
        assert err.count("error: ") == 1 and sentence in err, err
        assert all(c.ok for c in cdc.verify())
        report = sinks.check("kinesis", sinks.kinesis_messages())
        assert report.ok and report.expected == 3 + 2 * (step + 1), report.describe()  # every change so far, in order
        assert sinks.checkpoint_bytes("rabbitmq") == held
    monkeypatch.setenv("CDC_RABBITMQ_URL", f"amqp://cdc:x@127.0.0.1:{free_port()}/%2F")
    monkeypatch.setenv("CDC_SINK_LAG_WARN_SECONDS", "0.5")
    monkeypatch.setenv("CDC_SINK_LAG_FAIL_SECONDS", "3600")
    checks = _lag_checks()
    assert checks["sinks/rabbitmq"] == (False, AssetCheckSeverity.WARN) and checks["sinks/kinesis"][0] is True
    monkeypatch.setenv("CDC_SINK_LAG_FAIL_SECONDS", "1")  # the changes were committed before the syncs began
    assert _lag_checks()["sinks/rabbitmq"] == (False, AssetCheckSeverity.ERROR)
    # the broker back, the sink catches up from its own checkpoint: every change once, in order per key
    sinks.on("rabbitmq")
    assert main(["publish"]) == 0
    report = sinks.check("rabbitmq", sinks.rabbit_messages())
    assert report.ok and report.expected == 7 and report.duplicates == 0, report.describe()


def test_dedup_window_collapses_repeated_updates_and_holds_back_young_changes_and_heartbeats_when_due(
    cdc: CdcEnv, sinks: Sinks, monkeypatch
) -> None:
    db = cdc.database
    sinks.on("rabbitmq")
    monkeypatch.setenv("CDC_SINK_DEDUP_SECONDS", "2")
    cdc.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40))", "INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    # a table without a primary key: two identical rows are two rows, and each update of them a change of its own
    cdc.execute("CREATE TABLE tally (v INT)", "INSERT INTO tally VALUES (1), (1)", "UPDATE tally SET v = 2", "UPDATE tally SET v = 3")
    for i in range(5):
        cdc.execute(f"UPDATE items SET name = 'a{i}' WHERE id = 1")
    cdc.execute("UPDATE items SET name = 'b1' WHERE id = 2")
    last_commit = time.time()
    time.sleep(max(0.0, last_commit + 2.2 - time.time()))
    assert cdc.sync() == 0
    received = sinks.rabbit_messages()
    updates = [m.body["after"]["name"] for m in received if m.body.get("op") == "u" and m.body["source"]["table"] == "items"]
    assert updates == ["a4", "b1"]  # five updates of id 1 within 2 s: only the newest is sent
    assert _sink_metadata("rabbitmq")["collapsed_updates"] == 4
    # every change of the keyless table came, none collapsed, in order: 2 inserts and 4 updates of identical rows
    tally = [m for m in received if m.body["source"]["table"] == "tally"]
    expected_tally = [e for e in expected_messages(cdc.lakehouse, sink_settings("rabbitmq", os.environ)) if e.table == f"{db}.tally"]
    assert check_delivery(expected_tally, tally).ok and len(expected_tally) == 7, check_delivery(expected_tally, tally).describe()
    assert [(m.body["op"], (m.body["after"] or {}).get("v")) for m in tally[1:]] == [("c", 1), ("c", 1), ("u", 2), ("u", 2), ("u", 3), ("u", 3)]
    assert {k: v["name"] for k, v in replayed_rows(received)[f"{db}.items"].items()} == _source_items(cdc)
    # a change younger than the window waits for the next run (it could still be collapsed); with the window off
    # (the default) it goes at once
    cdc.execute("UPDATE items SET name = 'b2' WHERE id = 2")
    assert main(["--sink-dedup-seconds", "30", "sync"]) == 0
    assert sinks.rabbit_messages() == [] and _sink_metadata("rabbitmq")["pending_changes"] == 1
    monkeypatch.delenv("CDC_SINK_DEDUP_SECONDS")
    assert main(["publish", "rabbitmq"]) == 0
    received += sinks.rabbit_messages()
    assert [m.body["after"]["name"] for m in received if m.body.get("op") == "u" and m.routing_key == f"{db}.items"][-1] == "b2"
    assert {k: v["name"] for k, v in replayed_rows(received)[f"{db}.items"].items()} == _source_items(cdc)
    # heartbeats: off by default (none above); when one is due, a publish with nothing new sends it
    top = max(m.body["_cdc_seq"] for m in received)
    monkeypatch.setenv("CDC_SINK_HEARTBEAT_SECONDS", "0")  # the flag below sets it; this restores it afterwards
    assert main(["--sink-heartbeat-seconds", "3600", "publish", "rabbitmq"]) == 0
    assert [(m.body["type"], m.body["_cdc_seq"], m.routing_key) for m in sinks.rabbit_messages()] == [("heartbeat", top, "heartbeat")]
    assert main(["publish", "rabbitmq"]) == 0
    assert sinks.rabbit_messages() == []  # the last heartbeat is less than an hour old
