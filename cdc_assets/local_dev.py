"""`make dev` and `make stop`: the Dagster UI with its daemon over the demo source, and what it needs around it.

`python -m cdc_assets.local_dev [--port 3000] [--spark-connect-port 15002] [--sinks] [--mysql]` starts the demo
source's server (with `--mysql` the demo MySQL server of the `demo_mysql` source too), a long-lived Spark Connect server (unless CDC_SPARK_MASTER names a Spark of the user's) and, with `--sinks`, the local
RabbitMQ and Kinesis, each only when it is not running yet, then `dg dev` (the project's code location) on 127.0.0.1:PORT
in the foreground. When that ends (Ctrl-C), it stops what it started itself and keeps everything else: a source or a
Spark server that was up before stays up, and no data is deleted (`make clean` does that).

`python -m cdc_assets.local_dev stop` (`make stop`) stops every local server of the project: the demo sources of
both flavours, the Spark Connect server, the local brokers and a local Spark cluster, keeping their data.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cdc_assets.core.errors import CdcUserError
from cdc_assets.local_brokers import destinations, kinesis, rabbitmq
from cdc_assets.local_source import DEMO_HISTORY_TABLES, server
from cdc_assets.local_source.processes import listening
from cdc_assets.local_spark import cluster, connect_server
from cdc_assets.runtime.instance import DEFAULT_LAKEHOUSE, ensure_dagster_home

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PORT = 3000
DEV_SPARK_MIN_ROWS = "1000000"  # runs from the UI take the shared Spark only from this many changes on
STOP_WAIT_SECONDS = 60.0  # how long a Ctrl-C'd `dagster dev` may take to stop its webserver, daemon and code server


def dev_command(port: int) -> list[str]:
    """`dg dev -w workspace.yaml` in the project's folder: the code location `cdc_assets` (cdc_assets/definitions.py,
    the component instances under cdc_assets/sources/), its webserver and daemon, in this virtualenv."""
    dg = str(Path(sys.executable).with_name("dg"))
    return [dg, "dev", "--use-active-venv", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]


def run_dev(port: int, spark_connect_port: int, sinks: bool, flavours: list[str]) -> int:
    """Start what is missing, run `dg dev` until it ends, then stop what this started. The demo servers of
    `flavours`: the `demo` source's (CDC_DEMO_SOURCE's flavour, MariaDB by default) and, with `--mysql`, the demo
    MySQL server the project's `demo_mysql` source reads (without it that source waits for its server: defs/sensors)."""
    started: list[tuple[str, Callable[[], object]]] = []
    env = dict(os.environ)
    try:
        for flavour in flavours:
            base = server.demo_source_dir(flavour)
            if server.running(base) is None:
                started.append((f"the demo {flavour} source", lambda base=base: server.stop(base)))
            local = server.start(base, flavour=flavour)
            print(f"source: local {flavour} on 127.0.0.1:{local.port} (data in {base})", flush=True)
        if not env.get("CDC_SPARK_MASTER"):
            connect = connect_server.ConnectServer(spark_connect_port, connect_server.DEFAULT_STATE_DIR.resolve())
            if not listening(spark_connect_port):
                started.append(("the Spark Connect server", lambda: connect_server.stop(connect)))
                connect = connect_server.start(connect.state_dir, spark_connect_port)
            print(f"spark: Spark Connect server at {connect.remote}", flush=True)
            env["CDC_SPARK_MASTER"] = connect.remote
            env.setdefault("CDC_SPARK_MIN_ROWS", DEV_SPARK_MIN_ROWS)
        if sinks:
            if rabbitmq.running() is None or kinesis.running() is None:
                started.append(("the local RabbitMQ and Kinesis", destinations.stop))
            env.update(destinations.start().environment())
        env.setdefault("CDC_HISTORY_TABLES", DEMO_HISTORY_TABLES)  # as the demo keeps it
        env.setdefault("CDC_DAGSTER_WEBSERVER", f"http://127.0.0.1:{port}")  # new tables' assets appear by themselves
        env["DAGSTER_HOME"] = str(ensure_dagster_home(env.get("CDC_LAKEHOUSE") or DEFAULT_LAKEHOUSE))
        env.setdefault("DAGSTER_EVENT_BATCH_SIZE", "1000")
        env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)  # the venv `dg dev` runs Dagster from
        return _foreground(dev_command(port), env)
    finally:
        for name, stop in reversed(started):
            stop()
            print(f"stopped {name} (its data is kept; `make clean` deletes it)", flush=True)


def _foreground(command: list[str], env: dict[str, str]) -> int:
    """Run `command` until it ends. Ctrl-C reaches it from the terminal as it reaches this process, and SIGTERM
    here is passed on as a Ctrl-C; either way it is waited for, so what it runs shuts down before anything is
    stopped under it."""
    child = subprocess.Popen(
        command,
        env=env,
        cwd=PROJECT_ROOT,
        # a process started from a script in the background ignores SIGINT, and so would `dagster dev`
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
    )

    def interrupt(*_: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, interrupt)
    interrupted = False
    while True:
        try:
            return child.wait(timeout=STOP_WAIT_SECONDS if interrupted else None)
        except KeyboardInterrupt:
            interrupted = True  # dagster dev had its own Ctrl-C: wait for it to stop
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()


def stop_all(spark_connect_port: int) -> list[str]:
    """Every local server of the project stopped, their data kept; what was running."""
    stopped = []
    for flavour in server.FLAVOURS:
        if server.stop(server.demo_source_dir().parent / flavour):
            stopped.append(f"the demo {flavour} source")
    if listening(spark_connect_port):
        connect_server.stop(connect_server.ConnectServer(spark_connect_port, connect_server.DEFAULT_STATE_DIR.resolve()))
        stopped.append("the Spark Connect server")
    stopped += [f"the local {name}" for name in destinations.stop()]
    spark_cluster = cluster.DEFAULT_STATE_DIR.resolve()
    if (spark_cluster / "pids").exists():
        cluster.stop(spark_cluster)
        stopped.append("the local Spark cluster")
    return stopped


def port_number(text: str) -> int:
    """A TCP port, 1 to 65535 (argparse's type: anything else is refused with the flag named)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give one from 1 to 65535, e.g. {DEFAULT_PORT}")
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_dev", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["dev", "stop"], default="dev")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help="the UI's port (make dev DEV_PORT=…)")
    parser.add_argument("--spark-connect-port", type=port_number, default=connect_server.DEFAULT_PORT)
    parser.add_argument("--sinks", action="store_true", help="also the local RabbitMQ and Kinesis, both sinks on")
    parser.add_argument(
        "--mysql", action="store_true", help="also the demo MySQL server of the demo_mysql source (make dev SOURCE=mysql)"
    )
    args = parser.parse_args(argv)
    if args.command == "stop":
        stopped = stop_all(args.spark_connect_port)
        print("stopped " + ", ".join(stopped) + " (data kept)" if stopped else "nothing was running")
        return 0
    try:
        flavour = server.demo_flavour()
    except CdcUserError as exc:
        parser.error(str(exc))  # exit 2
    flavours = list(dict.fromkeys([flavour, *([server.MYSQL] if args.mysql else [])]))
    return run_dev(args.port, args.spark_connect_port, args.sinks, flavours)


if __name__ == "__main__":
    sys.exit(main())
