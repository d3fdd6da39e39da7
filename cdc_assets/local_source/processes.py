"""What the local servers (MariaDB here, the brokers in `local_brokers`) need of the machine: free ports on
127.0.0.1, whether a pid file's process lives, and a clean stop (SIGTERM, then SIGKILL after a timeout) that reaps a
child this process started."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid_file: Path) -> int | None:
    """The pid in `pid_file` if that process is alive, else None."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None
    return pid


def terminate(pid: int, timeout_s: float, started: subprocess.Popen | None = None) -> None:
    """SIGTERM `pid` and wait for it to end (SIGKILL after `timeout_s`); `started`, the child process this process
    launched for it (the same process, or a start script that exits with it), is reaped."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if started is not None and started.pid == pid:
            if started.poll() is not None:
                break
        elif _reaped(pid):
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    if started is not None:
        started.wait(timeout=10)


def _reaped(pid: int) -> bool:
    """Reap `pid` if it is an ended child of this process (else it lingers as a zombie that still answers kill 0)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False
