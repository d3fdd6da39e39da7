"""A local Spark Connect server (it ships in the pyspark wheel), for `CDC_SPARK_MASTER=sc://…`.

A long-lived server saves every run the JVM start-up; the tests use one to prove the Connect path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

from cdc_assets.local_source.processes import listening


@dataclass(frozen=True)
class ConnectServer:
    port: int
    state_dir: Path

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"


def _environment(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(Path(pyspark.__file__).parent),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_PID_DIR=str(state_dir / "pid"),
        SPARK_LOG_DIR=str(state_dir / "log"),
        SPARK_IDENT_STRING=f"cdc-{state_dir.name}",
    )
    env.setdefault("PYSPARK_PYTHON", sys.executable)  # the tasks' Python: one with the project installed
    return env



def start(state_dir: Path, port: int, master: str = "local[2]", timeout_s: float = 60.0) -> ConnectServer:
    """Start a Spark Connect server bound to 127.0.0.1:`port` and wait until it listens."""
    state_dir.mkdir(parents=True, exist_ok=True)
    env = _environment(state_dir)
    script = Path(env["SPARK_HOME"]) / "sbin" / "start-connect-server.sh"
    subprocess.run(
        [
            "bash",
            str(script),
            "--master",
            master,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.sql.session.timeZone=UTC",
            "--conf",
            "spark.ui.enabled=false",
        ],  # fmt: skip
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while not listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"Spark Connect did not listen on 127.0.0.1:{port}: see {state_dir / 'log'}")
        time.sleep(0.2)
    return ConnectServer(port, state_dir)


def stop(server: ConnectServer, timeout_s: float = 60.0) -> None:
    """Stop the server and wait until its port is closed (the script only signals the JVM, which then shuts down)."""
    env = _environment(server.state_dir)
    script = Path(env["SPARK_HOME"]) / "sbin" / "stop-connect-server.sh"
    subprocess.run(["bash", str(script)], env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while listening(server.port) and time.monotonic() < deadline:
        time.sleep(0.2)


DEFAULT_PORT = 15002
DEFAULT_STATE_DIR = Path(".local") / "spark_connect"


def main(argv: list[str] | None = None) -> int:
    """`python -m cdc_assets.local_spark connect start|stop [--port P]`: the long-lived server `make dev` uses."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_spark connect")
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    server = ConnectServer(args.port, DEFAULT_STATE_DIR.resolve())
    if args.command == "start":
        if not listening(args.port):
            server = start(server.state_dir, args.port, args.master)
        print(server.remote)
    else:
        stop(server)
    return 0

