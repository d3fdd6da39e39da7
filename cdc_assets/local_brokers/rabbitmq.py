"""A dedicated RabbitMQ broker (the Debian package's `rabbitmq-server`), for the demo, `make dev` and the tests.

It never touches a RabbitMQ the machine may already run (the packaged service listens on 5672): it gets its
own data directory, node name, Erlang cookie, AMQP port and distribution port on 127.0.0.1, and its own
configuration files, so nothing under /etc/rabbitmq applies to it. Starting is idempotent: a running broker
is reused. Its user `cdc` gets a random password, kept in `password` and `rabbitmq.conf` (both mode 600) under
its directory.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from cdc_assets.local_source.processes import free_port, listening, pid_alive, port_is_free, terminate

DEFAULT_BASE_DIR = Path(".local") / "rabbitmq"
USER = "cdc"
# the packaged scripts: the wrapper in /usr/sbin switches to the `rabbitmq` user, this one runs as we are
SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
_started: dict[Path, subprocess.Popen] = {}  # brokers this process started, reaped when they stop


@dataclass(frozen=True)
class LocalRabbit:
    """Where a running dedicated broker can be reached."""

    base_dir: Path
    port: int

    @property
    def password(self) -> str:
        return (self.base_dir / "password").read_text().strip()

    def url(self, vhost: str = "/") -> str:
        """`amqp://cdc:<password>@127.0.0.1:<port>/<vhost>` (password included: keep private)."""
        return f"amqp://{USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    @property
    def node_name(self) -> str:
        return node_name(self.base_dir)


def node_name(base_dir: Path) -> str:
    """One Erlang node name per data directory, so two brokers of the project never share one."""
    digest = hashlib.sha1(str(Path(base_dir).resolve()).encode()).hexdigest()[:10]
    return f"cdc_{digest}@localhost"


def _answers(port: int) -> bool:
    """Whether the broker has finished booting: it answers the AMQP protocol header with its own."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(8)[:1] == b"\x01"  # a Connection.Start method frame
    except OSError:
        return False


def _environment(base_dir: Path, port: int, dist_port: int) -> dict[str, str]:
    """The broker's own files and ports: nothing of /etc/rabbitmq or of a system broker is read or shared."""
    return {
        **os.environ,
        "HOME": str(base_dir),  # the Erlang cookie lives in $HOME/.erlang.cookie
        "RABBITMQ_NODENAME": node_name(base_dir),
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_CONF_ENV_FILE": str(base_dir / "rabbitmq-env.conf"),
        "RABBITMQ_CONFIG_FILE": str(base_dir / "rabbitmq"),  # .conf is added
        "RABBITMQ_CONFIG_FILES": str(base_dir / "conf.d"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(base_dir / "advanced.config"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base_dir / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(base_dir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base_dir / "log"),
        "RABBITMQ_PID_FILE": str(base_dir / "rabbitmq.pid"),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
    }


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """A file only its owner may read (it holds a password or the Erlang cookie), whatever the umask; one left by
    an older version with wider rights is narrowed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), mode)
        f.write(text)


def _write_config(base_dir: Path, port: int) -> None:
    (base_dir / "conf.d").mkdir(parents=True, exist_ok=True)
    (base_dir / "rabbitmq-env.conf").write_text("")
    (base_dir / "enabled_plugins").write_text("[].\n")
    password_file = base_dir / "password"
    if not password_file.exists():
        _write_private(password_file, secrets.token_urlsafe(18) + "\n")
    password = password_file.read_text().strip()
    # default_user is created on the first boot of an empty data directory only; the file holds its password
    _write_private(
        base_dir / "rabbitmq.conf",
        f"listeners.tcp.default = 127.0.0.1:{port}\n"
        f"default_user = {USER}\n"
        f"default_pass = {password}\n"
        "loopback_users = none\n"
        "log.console = false\n"
        "log.file.level = warning\n",
    )
    cookie = base_dir / ".erlang.cookie"
    if not cookie.exists():
        _write_private(cookie, secrets.token_hex(20).upper(), 0o400)


def start(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 60.0) -> LocalRabbit:
    """Start (or reuse) the dedicated broker under `base_dir`; returns once it accepts AMQP connections."""
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if pid_alive(base_dir / "rabbitmq.pid") and port_file.exists():
        port = int(port_file.read_text())
        if _answers(port):
            return LocalRabbit(base_dir, port)
    if not SERVER_SCRIPT.exists():
        raise RuntimeError("rabbitmq-server is not installed: run `make install` (it installs the Debian package).")
    base_dir.mkdir(parents=True, exist_ok=True)
    previous = int(port_file.read_text()) if port_file.exists() else None
    port = previous if previous and port_is_free(previous) else free_port()
    port_file.write_text(str(port))
    dist_file = base_dir / "dist_port"
    dist_previous = int(dist_file.read_text()) if dist_file.exists() else None
    dist_port = dist_previous if dist_previous and port_is_free(dist_previous) else free_port()
    dist_file.write_text(str(dist_port))
    _write_config(base_dir, port)
    log = open(base_dir / "server.log", "ab")  # noqa: SIM115 - handed to the broker process
    process = subprocess.Popen(
        [str(SERVER_SCRIPT)],
        cwd=base_dir,
        env=_environment(base_dir, port, dist_port),
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    _started[base_dir] = process
    deadline = time.monotonic() + timeout_s
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"The local RabbitMQ did not start within {timeout_s:.0f}s: see {base_dir / 'log'}.")
        time.sleep(0.2)
    return LocalRabbit(base_dir, port)


def running(base_dir: Path = DEFAULT_BASE_DIR) -> LocalRabbit | None:
    """The broker under `base_dir` if it is up, else None."""
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if not port_file.exists() or not pid_alive(base_dir / "rabbitmq.pid"):
        return None
    port = int(port_file.read_text())
    return LocalRabbit(base_dir, port) if _answers(port) else None


def stop(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 30.0) -> bool:
    """Stop the broker under `base_dir` (SIGTERM: a clean shutdown that keeps durable queues and persistent
    messages); True if one was running."""
    base_dir = Path(base_dir).resolve()
    pid = pid_alive(base_dir / "rabbitmq.pid")
    if pid is None:
        return False
    terminate(pid, timeout_s, _started.pop(base_dir, None))  # the start script exits with the broker: reaped
    deadline = time.monotonic() + timeout_s
    port_file = base_dir / "port"
    port = int(port_file.read_text()) if port_file.exists() else None
    while port is not None and listening(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def remove(base_dir: Path = DEFAULT_BASE_DIR) -> None:
    """Stop the broker and delete its data directory."""
    stop(base_dir)
    shutil.rmtree(base_dir, ignore_errors=True)
