"""`dagster dev` on this repository's workspace, as `make dev` runs it, for the tests that drive the UI's daemon
and webserver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cdc_assets.local_source.server import free_port

REPO = Path(__file__).resolve().parent.parent
DAGSTER = str(Path(sys.executable).parent / "dagster")


@contextmanager
def dagster_dev(log: Path) -> Iterator[int]:
    """Start `dagster dev` with the current environment (DAGSTER_HOME and the CDC_* settings), yield its
    webserver's port, and kill its whole process group at the end."""
    port = free_port()
    dev = subprocess.Popen(
        [DAGSTER, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
        # dagster dev started from a script ignores SIGINT/SIGTERM unless they are reset to the default
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
    )
    try:
        yield port
    finally:
        os.killpg(dev.pid, signal.SIGKILL)
        dev.wait(timeout=30)
