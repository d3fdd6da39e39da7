"""`make dev` (cdc_assets/local_dev.py) on a port of the user's choice, and what it leaves running when it ends (issue
30: the 1 GB Spark Connect JVM and the demo source kept running after it, and only `make clean`, which deletes the
data, stopped them). Run as `make dev` runs it, in a directory of its own, ended by Ctrl-C as at a terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cdc_assets.local_source import server
from cdc_assets.local_source.processes import listening
from cdc_assets.local_source.server import free_port
from cdc_assets.runtime.instance import HOME_MARK

START_SECONDS = 240


def _environment() -> dict[str, str]:
    """A user's environment: none of the CDC_* settings or the Dagster home the tests' session set."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "DAGSTER_HOME"))}


def _dev(cwd: Path, port: int, connect_port: int, *flags: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.local_dev", "--port", str(port), "--spark-connect-port", str(connect_port), *flags],
        cwd=cwd,
        env={**_environment(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, which Ctrl-C at a terminal reaches as a whole
    )


def _ui_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def _wait_for_ui(dev: subprocess.Popen[str], port: int) -> None:
    deadline = time.monotonic() + START_SECONDS
    while not _ui_answers(port):
        assert dev.poll() is None, dev.stdout.read() if dev.stdout else ""
        assert time.monotonic() < deadline, "the UI did not answer"
        time.sleep(1)


SHUTTING_DOWN = "Shutting down Dagster services"
# What Dagster's daemon logs when Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stopped the code
# server while a sensor's tick was under way: Dagster's own shutdown order, not an error of the project's. Seen under
# load in fresh-clone `make test` (`Unable to reach the user code server for sensor …`).
SHUTDOWN_RACE = {"grpc._channel._InactiveRpcError", "dagster._core.errors.DagsterUserCodeUnreachableError"}


def _tracebacks_of_ours(out: str) -> list[str]:
    """The exceptions `make dev`'s output shows a traceback of: any before the shutdown began, and after it any but
    the daemon's ticks that met the code server gone."""
    before, _, after = out.partition(SHUTTING_DOWN)
    found = ["a traceback before the shutdown"] if "Traceback" in before else []
    if "Traceback" in after:
        raised = set(re.findall(r"^([\w.]+(?:Error|Exception|Interrupt))\b", after, re.MULTILINE))
        found += sorted(raised - SHUTDOWN_RACE) or ([] if raised else ["a traceback without its exception"])
    return found


def _ctrl_c(dev: subprocess.Popen[str]) -> str:
    os.killpg(dev.pid, signal.SIGINT)
    out, _ = dev.communicate(timeout=180)
    return out


def test_make_dev_serves_on_its_port_and_stops_what_it_started(tmp_path: Path) -> None:
    """`make dev SOURCE=mysql` (`--mysql`): the demo MySQL server of the project's demo_mysql source as well."""
    port, connect_port = free_port(), free_port()
    dev = _dev(tmp_path, port, connect_port, "--mysql")
    try:
        _wait_for_ui(dev, port)
        source, mysql = server.running(tmp_path / ".local" / "mariadb"), server.running(tmp_path / ".local" / "mysql")
        assert source is not None and mysql is not None and listening(connect_port)
        # the demo lakehouse's runs are in its own Dagster home, the one `make dev` shows
        assert (tmp_path / ".local" / "dagster_home" / HOME_MARK).read_text().strip() == str(tmp_path / "lakehouse")
        out = _ctrl_c(dev)
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
    assert dev.returncode is not None
    assert not _ui_answers(port) and not listening(connect_port) and not listening(source.port) and not listening(mysql.port)
    assert "stopped the demo mariadb source" in out and "stopped the Spark Connect server" in out, out
    assert "stopped the demo mysql source" in out, out
    assert (tmp_path / ".local" / "mariadb" / "data").is_dir()  # its data kept
    assert not _tracebacks_of_ours(out) and "SupersessionWarning" not in out, out


def test_make_dev_leaves_what_was_running_and_make_stop_stops_it_keeping_the_data(tmp_path: Path) -> None:
    base = tmp_path / ".local" / "mariadb"
    # started as `make local-source-start` starts it, by a command that ends: started here, the server would be this
    # process's child, whose end only this process can reap, and `make stop` would wait out its timeout for it
    started = subprocess.run(
        [sys.executable, "-m", "cdc_assets.local_source", "start"],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    before = server.running(base)
    assert started.returncode == 0 and before is not None, started.stdout + started.stderr
    port = free_port()
    try:
        with_spark = {"CDC_SPARK_MASTER": "local[1]"}  # a Spark of the user's: no Spark Connect server started
        dev = _dev(tmp_path, port, free_port(), **with_spark)
        try:
            _wait_for_ui(dev, port)
            out = _ctrl_c(dev)
        finally:
            if dev.poll() is None:
                os.killpg(dev.pid, signal.SIGKILL)
        assert "stopped" not in out, out
        assert server.running(base) is not None  # it was up before `make dev`: still up
        # a free port: whatever listens on the default 15002 (a user's `make dev`) is not this test's to stop
        stop = subprocess.run(
            [sys.executable, "-m", "cdc_assets.local_dev", "stop", "--spark-connect-port", str(free_port())],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert stop.returncode == 0 and "stopped the demo mariadb source" in stop.stdout, stop.stdout + stop.stderr
        assert server.running(base) is None and not listening(before.port)
        assert (base / "data").is_dir()
        again = server.start(base)  # the same server, its data, comes back
        with again.admin_connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
    finally:
        server.stop(base)


@pytest.mark.parametrize("port", ["0", "70000", "x"])
def test_a_bad_port_is_refused(port: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cdc_assets.local_dev", "--port", port], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--port" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / ".local").exists()
