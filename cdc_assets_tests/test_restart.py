"""A sync stopped in the middle and started again ends with no gap and no duplicate."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

from cdc_assets.checks import batch_chain_breaks, duplicate_seqs
from cdc_assets.lakehouse import CHANGES, RAW, STATE
from cdc_assets.raw_batch import list_batches
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_pipeline import _all_change_seqs, _assert_all_equal, _raw_seqs


def _write_transactions(cdc: CdcEnv, transactions: int, rows_each: int, start: int = 0) -> None:
    with cdc.admin() as conn, conn.cursor() as cur:
        for t in range(start, start + transactions):
            cur.execute("BEGIN")
            cur.executemany(
                "INSERT INTO acct (id, owner, balance) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE balance = balance + 1",
                [(t * rows_each + i, f"owner {t} ✅", i) for i in range(rows_each)],
            )
            cur.execute("UPDATE acct SET balance = balance - 1 WHERE id = %s", ((t * rows_each) // 2,))
            if t % 5 == 0:
                cur.execute("DELETE FROM acct WHERE id = %s", ((t * rows_each) // 3,))
            cur.execute("COMMIT")


def _raw_digests(cdc: CdcEnv) -> dict[str, str]:
    root = cdc.lakehouse_dir / RAW
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _assert_exactly_once(cdc: CdcEnv) -> None:
    assert batch_chain_breaks(cdc.lakehouse) == []
    assert duplicate_seqs(cdc.lakehouse) == {}
    assert _all_change_seqs(cdc) == _raw_seqs(cdc)
    _assert_all_equal(cdc, expected_tables=1)


def test_rerun_after_a_crash_at_any_point_of_a_sync(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=40, rows_each=5)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "30")
    assert cdc.sync() == 0
    state = cdc.lakehouse_dir / STATE
    saved = {p: p.read_bytes() for p in state.rglob("*.json") if "locks" not in p.parts}

    _write_transactions(cdc, transactions=40, rows_each=5, start=40)
    assert cdc.sync() == 0
    raw_before = _raw_digests(cdc)

    # The second sync "crashes" after writing everything but before moving any state: its raw batches,
    # change-log appends and current-state merges are all there, its checkpoint and progress are not.
    shutil.rmtree(state)
    for path, value in saved.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)
    # Re-capturing with another batch size cuts differently: existing batches must be kept, not rewritten.
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "45")
    assert cdc.sync() == 0
    assert _raw_digests(cdc) == raw_before
    _assert_exactly_once(cdc)

    # And once more from the very start of the pipeline state: still nothing twice.
    shutil.rmtree(state)
    assert cdc.sync() == 0
    _assert_exactly_once(cdc)


def test_sync_killed_during_capture_then_restarted(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=1500, rows_each=6)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "40")
    process = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "sync"],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    raw = cdc.lakehouse_dir / RAW
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(raw.glob("*/manifest.json"))) < 20:
        assert process.poll() is None, "the sync finished before it could be stopped"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    captured_before_kill = len(list_batches(cdc.lakehouse.store))
    assert 20 <= captured_before_kill
    assert not (cdc.lakehouse_dir / CHANGES).exists() or not any((cdc.lakehouse_dir / CHANGES).rglob("*.parquet"))

    assert cdc.sync() == 0
    assert len(list_batches(cdc.lakehouse.store)) > captured_before_kill
    _assert_exactly_once(cdc)
