"""`cdc-lakehouse sync` from the command line captures in a child process begun before Dagster is imported
(cdc_assets/defs/forked_capture.py), and its run records the batches. Whichever of the two processes dies, nothing
is lost or doubled, in the lakehouse or in what Dagster recorded, and the next sync goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_assets.capture.journal import UNRECORDED
from cdc_assets.core import failpoints
from cdc_assets.defs.keys import RAW_ASSET, SYNC_JOB
from cdc_assets.lake.layout import CAPTURE_LOCK, RAW
from cdc_assets.lake.locks import read_holder, run_owner
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_restart import _assert_exactly_once, _write_transactions


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Dagster home of this test's own, so what it recorded can be counted."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def _sync_process(env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "sync"],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _recorded_batches() -> list[str]:
    """Every raw batch the sync runs recorded as the raw asset's materializations, each as often as recorded."""
    from cdc_assets.defs.runs import instance

    names = []
    for record in instance().fetch_materializations(RAW_ASSET, limit=10_000).records:
        metadata = record.asset_materialization.metadata
        count = metadata["batches"].value
        if count:
            first, last = metadata["first_batch"].value, metadata["last_batch"].value
            names.append((first, last, count))
    return names


def _assert_each_batch_recorded_once(cdc: CdcEnv) -> None:
    batches = list_batches(cdc.lakehouse.store)
    recorded = _recorded_batches()
    assert sum(count for _, _, count in recorded) == len(batches)
    covered = [b for first, last, _ in recorded for b in batches if first <= b <= last]
    assert sorted(covered) == sorted(batches)  # each once: the ranges neither overlap nor leave a gap
    assert not (cdc.lakehouse_dir / UNRECORDED).exists() or not any((cdc.lakehouse_dir / UNRECORDED).iterdir())


def _wait_for_manifests(cdc: CdcEnv, process: subprocess.Popen, count: int) -> None:
    raw = cdc.lakehouse_dir / RAW
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(raw.glob("*/manifest.json"))) < count:
        assert process.poll() is None, "the sync finished before it could be stopped"
        time.sleep(0.02)


def _capture_holder(cdc: CdcEnv, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = read_holder(cdc.lakehouse, CAPTURE_LOCK)
        if holder is not None:
            return holder
        time.sleep(0.01)
    raise AssertionError("no capture took the lock")


def test_the_capture_runs_in_a_child_under_the_lock_of_the_run_that_records_it(cdc: CdcEnv, own_home, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=200, rows_each=4)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "100")
    # a slow capture, so the lock can be read while it is held
    process = _sync_process({failpoints.ENV: "capture.checkpoint_saved=sleep:0.3"})
    holder = _capture_holder(cdc)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err
    assert holder.pid != process.pid  # the child captured, the command's own process did not

    from cdc_assets.defs.runs import instance

    runs = instance().get_runs()
    assert [r.job_name for r in runs] == [SYNC_JOB]
    assert holder.owner == run_owner(runs[0].run_id)  # the lock named the run that then recorded the batches
    _assert_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)
    assert "captured" in out and "sync succeeded" in out


def test_a_sync_killed_while_its_child_captures_leaves_nothing_lost_or_doubled(cdc: CdcEnv, own_home, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=1500, rows_each=6)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "40")
    process = _sync_process()
    child = _capture_holder(cdc).pid
    _wait_for_manifests(cdc, process, 20)
    process.send_signal(signal.SIGKILL)  # the command dies: its child must not go on capturing
    process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.01)
    assert not Path(f"/proc/{child}").exists(), "the forked capture outlived the sync that began it"
    assert read_holder(cdc.lakehouse, CAPTURE_LOCK) is None
    captured_before_kill = len(list_batches(cdc.lakehouse.store))
    assert captured_before_kill >= 20
    assert _recorded_batches() == []  # nothing recorded yet: the run never got that far

    _write_transactions(cdc, transactions=10, rows_each=6, start=1500)
    assert cdc.sync() == 0  # in this process: it takes over the dead run's journal
    assert len(list_batches(cdc.lakehouse.store)) > captured_before_kill
    _assert_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)


def test_a_killed_child_capture_is_taken_up_by_its_run(cdc: CdcEnv, own_home, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=1500, rows_each=6)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "40")
    process = _sync_process()
    child = _capture_holder(cdc).pid
    assert child != process.pid
    _wait_for_manifests(cdc, process, 10)
    os.kill(child, signal.SIGKILL)  # only the capture dies; the run captures the rest itself
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err
    _assert_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)  # the child's batches too, in the same run

    _write_transactions(cdc, transactions=10, rows_each=6, start=1500)
    done = _sync_process()
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, out + err
    _assert_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)


def test_a_run_that_recorded_its_batches_and_died_before_its_journal_went_is_not_recorded_twice(
    cdc: CdcEnv, own_home, monkeypatch
) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=100, rows_each=4)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "100")
    assert cdc.sync() == 0
    from cdc_assets.capture.journal import CaptureJournal, Recorder
    from cdc_assets.defs.runs import instance

    # what a recorder killed right after logging the materialization leaves: its journal, naming a dead process
    run = instance().get_runs()[0]
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    journal = CaptureJournal(run.run_id, Recorder.of(int(gone.stdout)))
    for name in list_batches(cdc.lakehouse.store):
        journal.add(cdc.lakehouse.store, name)
    _write_transactions(cdc, transactions=10, rows_each=4, start=100)
    assert cdc.sync() == 0
    _assert_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)
