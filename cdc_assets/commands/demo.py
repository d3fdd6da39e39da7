"""What `make demo` sets up around the pipeline: the local source with its sample schema, a live workload
writing to it, and a guard against a lakehouse left by an earlier demo server.

The demo's settings are the command's (its flags included) with the local servers' in place: their URLs hold the
local servers' passwords, so they are also written to this process's environment (`passed_on`), the one place the
commands write it: the runs' resources then take them as EnvVars, and no password enters run config."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cdc_assets.commands.runs import RunOutcome, run_sync, run_verify
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.lake.store import Lakehouse, MissingObject
from cdc_assets.local_brokers import destinations
from cdc_assets.local_source import DEMO_HISTORY_TABLES, Workload, load_sample_schema, server
from cdc_assets.sinks.checkpoint import checkpoint_key
from cdc_assets.sinks.consume import Received, read_queue, read_stream
from cdc_assets.sinks.delivery import DeliveryReport, check_delivery, expected_messages
from cdc_assets.sinks.settings import SINK_NAMES, sink_settings
from cdc_assets.verification.consistency import ConsistentComparison

DEMO_TRANSACTIONS_PER_SECOND = 40
FLAVOUR_NAMES = {server.MARIADB: "MariaDB", server.MYSQL: "MySQL"}


@dataclass
class DemoOutcome:
    syncs: int
    last: RunOutcome  # the catch-up sync, or the first that failed
    comparisons: list[ConsistentComparison]  # empty when a sync failed
    deliveries: dict[str, DeliveryReport] = field(default_factory=dict)  # per sink, with --sinks
    sample: Received | None = None  # one message read back, to show the event format
    settings: Settings | None = None  # the demo's: the command's with the local servers' (None: it never got there)


def run_demo(
    settings: Settings,
    seconds: float,
    seed: int,
    verbose: bool,
    say: Callable[[str], None],
    synced: Callable[[RunOutcome], None],
    sinks: bool = False,
) -> DemoOutcome:
    """The local source under a live workload for `seconds`, synced again and again, then once more after the
    workload stops, then verified. `say` hears what happens, `synced` every sync while the workload runs. With
    `sinks`, every sync also publishes to a local RabbitMQ and a local Kinesis, which are read back at the end."""
    texts = {"CDC_HISTORY_TABLES": DEMO_HISTORY_TABLES, **settings.environment}  # docs/history.md's reading examples read it
    local = start_demo_source(seed, settings.source.demo_flavour)
    texts |= passed_on({"CDC_MYSQL_URL": local.reader_url()})
    lakehouse = initialized_resources(Settings.from_env(texts)).lakehouse.get()
    _guard_demo_lakehouse(local, lakehouse)
    say(f"source: local {FLAVOUR_NAMES[local.flavour]} with ROW binlog on 127.0.0.1:{local.port}")
    found = start_demo_sinks(say) if sinks else None
    if found is not None:  # the sinks pointed at them, publishing every change log from its first change
        texts |= passed_on(found.environment())
        for name in SINK_NAMES:
            lakehouse.store.delete(checkpoint_key(name))
    settings = Settings.from_env(texts)
    syncs = 0
    with live_workload(local, seed):
        say(f"live workload running for {seconds:.0f}s while the pipeline syncs")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            outcome = run_sync(settings, verbose)
            syncs += 1
            synced(outcome)
            if not outcome.success:
                return DemoOutcome(syncs, outcome, [], settings=settings)
    say("workload stopped; catching up")
    outcome = run_sync(settings, verbose)
    syncs += 1
    if not outcome.success:
        return DemoOutcome(syncs, outcome, [], settings=settings)
    result = DemoOutcome(syncs, outcome, run_verify(settings), settings=settings)
    if found is not None:
        result.deliveries, result.sample = read_back(settings, found)
    return result


def passed_on(texts: dict[str, str]) -> dict[str, str]:
    """The local servers' settings, written to this process's environment too: they hold the servers' passwords,
    which the runs' resources take as EnvVars only from there (defs/resources._env_value), never as run config."""
    os.environ.update(texts)
    return texts


def start_demo_sinks(say: Callable[[str], None]) -> destinations.DemoDestinations:
    """The local brokers with the demo's exchange, queue and stream, started empty (the sinks are pointed at them,
    and their checkpoints removed, by `run_demo`)."""
    found = destinations.start(empty=True)
    say(
        f"sinks: RabbitMQ exchange '{destinations.EXCHANGE}' on 127.0.0.1:{found.rabbit.port} (queue "
        f"'{destinations.QUEUE}' bound to '#') and Kinesis stream '{destinations.STREAM}' at {found.kinesis.endpoint_url}"
    )
    return found


def read_back(
    settings: Settings, found: destinations.DemoDestinations
) -> tuple[dict[str, DeliveryReport], Received | None]:
    """Both destinations read as a consumer would, each compared with the change logs."""
    lakehouse = initialized_resources(settings).lakehouse.get()
    received = {
        "rabbitmq": read_queue(found.rabbit.url(), destinations.QUEUE),
        "kinesis": read_stream(destinations.STREAM, destinations.REGION, found.kinesis.endpoint_url),
    }
    reports = {
        name: check_delivery(expected_messages(lakehouse, sink_settings(name, settings.environment)), messages)
        for name, messages in received.items()
    }
    updates = [m for m in received["rabbitmq"] if m.body.get("op") == "u"]
    return reports, (updates or received["rabbitmq"] or [None])[-1]


def start_demo_source(seed: int, flavour: str) -> server.LocalServer:
    """The local MariaDB or MySQL (CDC_DEMO_SOURCE, a component's `demo_source`) with the sample schema and its
    first rows (the demo's CDC_MYSQL_URL points at it)."""
    local = server.start(Path.cwd() / server.demo_source_dir(flavour), flavour=flavour)
    with local.admin_connection(autocommit=False) as conn:
        load_sample_schema(conn)
        Workload(conn, seed=seed + int(time.time())).seed()
    return local


@contextmanager
def live_workload(local: server.LocalServer, seed: int) -> Iterator[None]:
    """Transactions written to the source in a thread for as long as the block runs."""
    stop = threading.Event()

    def write() -> None:
        with local.admin_connection(autocommit=False) as conn:
            Workload(conn, seed=seed + 1).run_until(stop, pause_s=1.0 / DEMO_TRANSACTIONS_PER_SECOND)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()


def _guard_demo_lakehouse(local: server.LocalServer, lakehouse: Lakehouse) -> None:
    """A lakehouse built from an earlier, since deleted, demo server would resume at a wrong position."""
    instance = (local.base_dir / "instance_id").read_text().strip()
    key = f"{STATE}/demo_source_instance"
    try:
        recorded: str | None = lakehouse.store.get(key).decode().strip()
    except MissingObject:
        recorded = None
    if recorded is None:
        if load_checkpoint(lakehouse.store) is not None:
            raise CdcUserError(
                f"The lakehouse at {lakehouse} was built from another source: remove it or set "
                "CDC_LAKEHOUSE to a new directory for the demo."
            )
        lakehouse.store.put(key, instance.encode())
    elif recorded != instance:
        raise CdcUserError(
            f"The lakehouse at {lakehouse} was built from an earlier demo server that no longer exists: remove it "
            "(rm -rf lakehouse) or set CDC_LAKEHOUSE to a new directory."
        )


def changes_captured(settings: Settings) -> int:
    """Row changes captured since the lakehouse began (the checkpoint's next seq, less one)."""
    checkpoint = load_checkpoint(initialized_resources(settings).lakehouse.get().store)
    return checkpoint.next_seq - 1 if checkpoint else 0


def lakehouse_location(settings: Settings) -> str:
    return str(initialized_resources(settings).lakehouse.get())
