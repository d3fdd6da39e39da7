"""The source failing under a running capture: its dump connection killed, the server restarted, the binlog rotated.
Each ends equal with every change exactly once, or with one clear sentence and then equal on the next sync."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from cdc_assets.core import failpoints
from cdc_assets.lake.raw_batches import list_batches, read_manifest
from cdc_assets.lake.state import CHECKPOINT_KEY
from cdc_assets.local_source import server as local_server
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once

pytestmark = pytest.mark.both_sources

LOST = "was lost mid-way (the server restarted or the connection was killed)"
DOWN = "Cannot reach the MySQL server at"  # the capture went on while the restarting server was still down


def _write(cdc: CdcEnv, transactions: int, start: int = 0) -> None:
    with cdc.admin() as conn, conn.cursor() as cur:
        for t in range(start, start + transactions):
            cur.execute("BEGIN")
            cur.execute("INSERT INTO acct (id, v) VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = v + 1", (t % 150, t))
            cur.execute("INSERT INTO ledger VALUES (%s)", (t % 5,))  # keyless: duplicate rows
            if t % 7 == 0:
                cur.execute("DELETE FROM ledger WHERE a = %s LIMIT 1", (t % 5,))
            cur.execute("COMMIT")


def _assert_equal_exactly_once(cdc: CdcEnv) -> None:
    results = cdc.verify()
    assert len(results) == 2 and all(r.ok for r in results), [r.describe() for r in results]
    assert all(r.source_rows == r.lakehouse_rows for r in results)
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()


def _sync_with_fault_mid_capture(cdc: CdcEnv, fault: Callable[[], None]) -> subprocess.CompletedProcess[str]:
    """A `sync` process that pauses after its first raw batch with the binlog stream open; `fault` strikes then."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "sync"],
        env={**os.environ, failpoints.ENV: "capture.checkpoint_saved=sleep:6"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    checkpoint = cdc.lakehouse_dir / CHECKPOINT_KEY
    before = checkpoint.read_bytes()
    deadline = time.monotonic() + 120
    while checkpoint.read_bytes() == before:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    fault()
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _dump_threads(cdc: CdcEnv) -> list[int]:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM information_schema.processlist WHERE command LIKE 'Binlog Dump%%'")
        return [row[0] for row in cur.fetchall()]


def _ended_equal_or_clearly(cdc: CdcEnv, run: subprocess.CompletedProcess[str], *sentences: str) -> None:
    """The faulted run succeeded, or ended with one of `sentences` (exit 2, no traceback); the next sync ends equal."""
    assert run.returncode == (2 if sentences else 0), run.stdout[-3000:] + run.stderr[-3000:]
    if sentences:
        message = run.stderr.strip()
        assert "Traceback" not in message and len(message.splitlines()) == 1, message
        assert any(sentence in message for sentence in sentences), message
    _write(cdc, 30, start=10_000)
    began = time.monotonic()
    assert cdc.sync() == 0
    print(f"recovered by a sync of {time.monotonic() - began:.1f} s")
    _assert_equal_exactly_once(cdc)


def _bulk(cdc: CdcEnv, transactions: int, rows: int) -> None:
    """Wide rows, many megabytes of binlog: more than the socket buffers hold, so the server's dump thread is still
    sending while the capture pauses."""
    with cdc.admin() as conn, conn.cursor() as cur:
        for t in range(transactions):
            cur.execute("BEGIN")
            cur.executemany(
                "INSERT INTO acct VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = v + 1, pad = VALUES(pad)",
                [(1000 + i, t, chr(97 + t % 26) * 3000) for i in range(rows)],
            )
            cur.execute("COMMIT")


@pytest.fixture
def written(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> CdcEnv:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, v INT, pad VARCHAR(3000))", "CREATE TABLE ledger (a INT)")
    _write(cdc, 40)
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "20")
    _bulk(cdc, transactions=40, rows=100)  # about 24 MB of row images
    _write(cdc, 100, start=40)
    return cdc


def test_the_dump_connection_killed_mid_capture(written: CdcEnv) -> None:
    def kill_dump() -> None:
        threads = _dump_threads(written)
        assert threads
        for thread in threads:
            written.execute(f"KILL {thread}")

    run = _sync_with_fault_mid_capture(written, kill_dump)
    _ended_equal_or_clearly(written, run, LOST)


def test_flush_binary_logs_mid_capture_and_inside_a_batch(written: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    def rotate() -> None:
        written.execute("FLUSH BINARY LOGS")
        _write(written, 20, start=5_000)

    run = _sync_with_fault_mid_capture(written, rotate)
    assert run.returncode == 0, run.stderr[-3000:]
    # A rotation between two transactions of one batch: the batch spans two binlog files.
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "100000")
    _write(written, 10, start=6_000)
    written.execute("FLUSH BINARY LOGS")
    _write(written, 10, start=7_000)
    _ended_equal_or_clearly(written, run)
    store = written.lakehouse.store
    spanning = [m for m in (read_manifest(store, n) for n in list_batches(store)) if m.start.log_file != m.end.log_file]
    assert spanning, "no raw batch spans a binlog rotation"


def test_the_server_restarted_mid_capture(written: CdcEnv) -> None:
    server = written.server

    def restart() -> None:
        local_server.stop(server.base_dir)
        local_server.start(server.base_dir, port=server.port)

    run = _sync_with_fault_mid_capture(written, restart)
    _ended_equal_or_clearly(written, run, LOST, DOWN)
