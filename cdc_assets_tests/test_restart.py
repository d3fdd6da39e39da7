"""A sync stopped in the middle and started again ends with no gap and no duplicate."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import boto3
import pytest

from cdc_assets.core import failpoints
from cdc_assets.lake.layout import CHANGES, RAW, STATE
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv, use_s3
from cdc_assets_tests.test_pipeline import _all_change_seqs, _assert_all_equal, _raw_seqs

pytestmark = pytest.mark.both_sources


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


def _sync_process(env: dict[str, str]) -> int:
    """`cdc-lakehouse sync` in a process of its own, with extra environment (failpoints, TMPDIR)."""
    return subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", "sync"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=600,
    ).returncode


def _huge_transaction(cdc: CdcEnv, rows: int, width: int, binary: bool = False) -> None:
    """One transaction of `rows` random values of `width` bytes: as hex text, or as they are (`binary`, which
    makes few rows a large batch)."""
    column = f"VARBINARY({width})" if binary else f"VARCHAR({2 * width})"
    cdc.execute(f"CREATE TABLE huge (id INT PRIMARY KEY, v {column})")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        values = [(i, os.urandom(width) if binary else os.urandom(width).hex()) for i in range(rows)]
        cur.executemany("INSERT INTO huge VALUES (%s, %s)", values)
        cur.execute("COMMIT")


def test_a_killed_capture_leaves_no_spool_behind_after_the_next_start(cdc: CdcEnv, tmp_path) -> None:
    """SIGKILL (here: a failpoint's immediate exit) while a huge transaction spills to the local spool left its
    directory in the temp directory for good; the next capture removes it, and ends exactly once."""
    _huge_transaction(cdc, rows=60_000, width=20)
    spool_base = tmp_path / "tmp"
    spool_base.mkdir()
    env = {"TMPDIR": str(spool_base)}
    assert _sync_process({**env, "CDC_FAILPOINTS": "capture.transaction_spilled=exit"}) == failpoints.EXIT_CODE
    left = list(spool_base.glob("cdc-spool-*"))
    assert left and any(p.rglob("*.parquet") for p in left)
    assert _sync_process(env) == 0
    assert not list(spool_base.glob("cdc-spool-*"))
    assert batch_chain_breaks(cdc.lakehouse) == [] and duplicate_seqs(cdc.lakehouse) == {}
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 60_000


@pytest.mark.lakehouse_side  # an S3 upload left incomplete: the source plays no part
def test_a_killed_multipart_upload_is_aborted_at_the_next_start(cdc: CdcEnv, monkeypatch, s3_endpoint: str) -> None:
    """A capture killed in the middle of a raw batch's multipart upload leaves an incomplete upload, whose
    parts S3 keeps (and bills) until it is aborted: the next capture aborts it, and ends exactly once."""
    use_s3(monkeypatch, s3_endpoint)
    client = boto3.client("s3")
    client.create_bucket(Bucket="multipart")
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://multipart/{cdc.database}")  # a prefix of its own per flavour
    _huge_transaction(cdc, rows=12_000, width=1_000, binary=True)  # a raw batch over boto3's 8 MB multipart threshold
    # the killed run's capture lease blocks the next run until it expires: CDC_LOCK_TTL_SECONDS after its last renewal
    monkeypatch.setenv("CDC_LOCK_TTL_SECONDS", "5")
    assert _sync_process({"CDC_FAILPOINTS": "capture.upload_part=exit@3"}) == failpoints.EXIT_CODE
    assert client.list_multipart_uploads(Bucket="multipart", Prefix=f"{cdc.database}/raw/").get("Uploads")
    lease = json.loads(client.get_object(Bucket="multipart", Key=f"{cdc.database}/_state/locks/capture.json")["Body"].read())
    assert lease["ttl_seconds"] == 5  # the killed run's lease, read as the next run finds it
    assert _sync_process({}) == 0
    assert not client.list_multipart_uploads(Bucket="multipart", Prefix=f"{cdc.database}/raw/").get("Uploads")
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 12_000
