"""A local Kinesis-compatible endpoint over HTTP (moto's `moto_server`, installed with the project's dev
dependencies), for the demo and `make dev`. It keeps its streams in memory: a restart starts it empty.
Its own port on 127.0.0.1 and a pid file under its directory; starting is idempotent."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cdc_assets.local_source.processes import free_port, listening, pid_alive, terminate

DEFAULT_BASE_DIR = Path(".local") / "kinesis"
_started: dict[Path, subprocess.Popen] = {}


@dataclass(frozen=True)
class LocalKinesis:
    base_dir: Path
    port: int

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def moto_server_command() -> str:
    """`moto_server` beside the interpreter running the project (the virtualenv's)."""
    found = Path(sys.executable).parent / "moto_server"
    if not found.exists():
        raise RuntimeError("moto_server is not installed: run `make install` (the dev dependencies bring moto[server]).")
    return str(found)


def start(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 30.0) -> LocalKinesis:
    base_dir = Path(base_dir).resolve()
    pid_file, port_file = base_dir / "moto.pid", base_dir / "port"
    if pid_alive(pid_file) and port_file.exists() and listening(int(port_file.read_text())):
        return LocalKinesis(base_dir, int(port_file.read_text()))
    base_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    port_file.write_text(str(port))
    log = open(base_dir / "moto.log", "ab")  # noqa: SIM115 - handed to the server process
    process = subprocess.Popen(
        [moto_server_command(), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _started[base_dir] = process
    pid_file.write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    while not listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"The local Kinesis endpoint did not start within {timeout_s:.0f}s: see {base_dir / 'moto.log'}.")
        time.sleep(0.1)
    return LocalKinesis(base_dir, port)


def running(base_dir: Path = DEFAULT_BASE_DIR) -> LocalKinesis | None:
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if not port_file.exists() or not pid_alive(base_dir / "moto.pid"):
        return None
    port = int(port_file.read_text())
    return LocalKinesis(base_dir, port) if listening(port) else None


def stop(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 10.0) -> bool:
    base_dir = Path(base_dir).resolve()
    pid = pid_alive(base_dir / "moto.pid")
    if pid is None:
        return False
    terminate(pid, timeout_s, _started.pop(base_dir, None))
    return True
