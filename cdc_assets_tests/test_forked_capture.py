"""`cdc-lakehouse sync` from the command line captures in a child process begun before Dagster is imported
(cdc_assets/runtime/forked_capture.py), and its run records the batches. Whichever of the two processes dies, nothing
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
from cdc_assets.lake.layout import CAPTURE_LOCK, CHANGES_LOCK, RAW
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
    from cdc_assets.commands.runs import instance

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

    from cdc_assets.commands.runs import instance

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
    from cdc_assets.commands.runs import instance

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


# The child goes on, once its capture is durable, with the change logs, current state and the checks' comparisons
# (cdc_assets/runtime/forked_stages.py); the run records its reports. The tests below hold it to a sync that ran them.

TABLES = ("acct", "ledger", "items")


def _create_tables(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)",
        "CREATE TABLE ledger (a INT, note VARCHAR(10))",  # no primary key: copies are counted, a merge is not idempotent
        "CREATE TABLE items (id INT, what VARCHAR(10), qty INT, PRIMARY KEY (id, what))",
    )


def _write_tables(cdc: CdcEnv, transactions: int, start: int = 0) -> None:
    _write_transactions(cdc, transactions=transactions, rows_each=4, start=start)
    with cdc.admin() as conn, conn.cursor() as cur:
        for t in range(start, start + transactions):
            cur.execute("INSERT INTO ledger VALUES (%s, %s)", (t % 7, f"n{t % 3}"))
            cur.execute(
                "INSERT INTO items VALUES (%s, %s, 1) ON DUPLICATE KEY UPDATE qty = qty + 1", (t % 50, f"w{t % 4}")
            )
            if t % 9 == 0:
                cur.execute("DELETE FROM ledger WHERE a = %s LIMIT 1", (t % 7,))
        conn.commit()


def _assert_equal_and_exactly_once(cdc: CdcEnv) -> None:
    from cdc_assets_tests.exactly_once import check_exactly_once

    results = cdc.verify()
    assert {str(r.table).split(".", 1)[1] for r in results} == set(TABLES)
    assert [r.describe() for r in results if not r.ok] == []
    assert all(r.source_rows == r.lakehouse_rows for r in results)
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()
    assert found.changes > 0


def _stage_holder(cdc: CdcEnv, lock: str, process: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = read_holder(cdc.lakehouse, lock)
        if holder is not None:
            return holder
        assert process.poll() is None, "the sync finished before its stage could be seen"
        time.sleep(0.01)
    raise AssertionError(f"no stage took {lock}")


# metadata that differs between any two syncs of the same binlog: times, and the lakehouse's own directory
_VARYING = ("seconds", "duration", "timestamp", "lag", "location")


def _run_records(
    home: Path, monkeypatch: pytest.MonkeyPatch, lakehouse: Path | None = None
) -> tuple[str, list[tuple]]:
    """The one sync run of Dagster home `home` (the home of `lakehouse`, the test's own unless named), and what it
    recorded: every materialization and check evaluation, in order, with their metadata but for what no two syncs
    share."""
    from dagster import DagsterEventType

    from cdc_assets.commands.runs import instance

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    if lakehouse is not None:
        monkeypatch.setenv("CDC_LAKEHOUSE", str(lakehouse))  # a home holds the runs of one lakehouse only
    dagster = instance()
    (run,) = dagster.get_runs()
    kinds = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION}
    records = []
    for entry in dagster.all_logs(run.run_id, of_type=kinds):
        data = entry.dagster_event.event_specific_data
        if entry.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            event = data.materialization
            head: tuple = ("materialization", event.asset_key.to_user_string(), event.partition)
        else:
            event = data
            head = ("check", event.asset_key.to_user_string(), event.check_name, event.passed, str(event.severity))
        metadata = {
            k: getattr(v, "value", v) for k, v in sorted(event.metadata.items()) if not any(w in k for w in _VARYING)
        }
        records.append((*head, _without_varying(metadata)))
    return run.run_id, records


def _without_varying(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_varying(v) for k, v in value.items() if not any(w in str(k) for w in _VARYING)}
    if isinstance(value, list):
        return [_without_varying(v) for v in value]
    return value


def _run_messages() -> list[str]:
    """What the one sync run of the test's Dagster home logged."""
    from cdc_assets.commands.runs import instance

    (run,) = instance().get_runs()
    return [e.user_message or "" for e in instance().all_logs(run.run_id)]


def _differences(left: list[tuple], right: list[tuple]) -> list[tuple]:
    """(event, metadata key, left value, right value) of each metadata value that differs between two runs' records."""
    found = []
    for a, b in zip(left, right, strict=True):
        for key in sorted(set(a[-1]) | set(b[-1])):
            if a[-1].get(key) != b[-1].get(key):
                found.append((a[:-1], key, a[-1].get(key), b[-1].get(key)))
    return found


def test_a_sync_whose_child_did_the_stages_records_what_a_sync_that_did_them_records(
    cdc: CdcEnv, tmp_path: Path, monkeypatch
) -> None:
    _create_tables(cdc)
    _write_tables(cdc, transactions=300)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "500")
    forked_home, own_home = tmp_path / "forked_home", tmp_path / "own_home"
    forked_home.mkdir()
    own_home.mkdir()

    # a slow change-log stage, so its lock can be read while it is held
    process = _sync_process(
        {"DAGSTER_HOME": str(forked_home), failpoints.CHILD_ENV: "changes.table_appended=sleep:0.3"}
    )
    holder = _stage_holder(cdc, CHANGES_LOCK, process)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err
    assert holder.pid != process.pid  # the child appended to the change logs, the command's own process did not
    _assert_equal_and_exactly_once(cdc)
    forked_run, forked = _run_records(forked_home, monkeypatch)
    assert holder.owner == run_owner(forked_run)  # under the lock of the run that recorded it

    # the same binlog into a second lakehouse by a sync that runs every stage in its op
    own_lakehouse = tmp_path / "own_lakehouse"
    done = _sync_process({"DAGSTER_HOME": str(own_home), "CDC_LAKEHOUSE": str(own_lakehouse), "CDC_SYNC_FORK": "0"})
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, out + err
    _, own = _run_records(own_home, monkeypatch, own_lakehouse)

    assert [r[:-1] for r in forked] == [r[:-1] for r in own]  # the same events, in the same order
    assert _differences(forked, own) == []  # with the same metadata
    kinds = {r[1] for r in forked if r[0] == "materialization"}
    assert {f"{layer}/{cdc.database}/{t}" for layer in ("changes", "current") for t in TABLES} <= kinds
    assert all(r[3] for r in forked if r[0] == "check")


@pytest.mark.parametrize(
    "point",
    [
        "changes.table_appended=kill@2",  # the child dies between two tables' appends
        "changes.appended_before_progress=kill",  # every append made, no progress saved
        "current.table_merged=kill@2",  # the child dies between two tables' merges
        "current.merged_before_progress=kill",  # every merge made, no progress saved
        "verify.in_snapshot=kill",  # current state done and reported, the checks' comparisons not
    ],
)
def test_a_child_killed_in_a_stage_leaves_the_rest_to_its_run(cdc: CdcEnv, own_home, monkeypatch, point: str) -> None:
    _create_tables(cdc)
    _write_tables(cdc, transactions=200)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "300")
    process = _sync_process({failpoints.CHILD_ENV: point})
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err  # the run did what the child left
    assert "sync succeeded" in out
    said = _run_messages()
    assert any("ended with exit code -9" in m for m in said), said  # the child was killed there
    _assert_equal_and_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)
    _, records = _run_records(own_home, monkeypatch)
    for layer in ("changes", "current"):  # every table's change log and current state, once
        keys = [r[1] for r in records if r[0] == "materialization" and r[1].startswith(f"{layer}/")]
        assert sorted(keys) == sorted(f"{layer}/{cdc.database}/{t}" for t in TABLES), layer

    _write_tables(cdc, transactions=20, start=200)
    assert cdc.sync() == 0
    _assert_equal_and_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)


@pytest.mark.parametrize("point", ["changes.table_appended=exit@2", "current.table_merged=exit@2"])
def test_a_child_ended_in_a_stage_ends_its_sync_and_the_next_sync_completes(
    cdc: CdcEnv, own_home, monkeypatch, point: str
) -> None:
    _create_tables(cdc)
    _write_tables(cdc, transactions=200)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "300")
    process = _sync_process({failpoints.CHILD_ENV: point})
    out, err = process.communicate(timeout=300)
    assert process.returncode == failpoints.EXIT_CODE, out + err  # the command ended where its child ended

    _write_tables(cdc, transactions=20, start=200)
    assert cdc.sync() == 0
    _assert_equal_and_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)


def test_a_sync_the_run_would_send_to_spark_leaves_the_stages_to_the_run(cdc: CdcEnv, own_home, monkeypatch) -> None:
    _create_tables(cdc)
    _write_tables(cdc, transactions=50)
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # every stage run takes Spark (a cluster's default)
    # the child would stop at its first append: it must not get there
    process = _sync_process({failpoints.CHILD_ENV: "changes.before_commit=exit"})
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    _assert_equal_and_exactly_once(cdc)
    said = _run_messages()
    assert any("take Spark" in m for m in said), said  # the child left them
    assert any("on spark" in m for m in said), said  # and the run took them on Spark
    # on the session whose start the command began when the child said so (at its first batch: every stage takes
    # Spark), while it was still starting the run; the capture's report came after that word, and was taken
    assert any("change logs on spark" in m and "its start begun" in m for m in said), said
    assert not any("capturing here" in m for m in said), said


def test_a_fork_kept_to_the_capture_leaves_the_stages_to_the_run(cdc: CdcEnv, own_home, monkeypatch) -> None:
    """CDC_SYNC_FORK=capture: the child captures and stops there; the run's own process appends to the change logs.
    A failpoint that would end the command in the child's change-log stage is never reached."""
    _create_tables(cdc)
    _write_tables(cdc, transactions=50)
    process = _sync_process(
        {
            "CDC_SYNC_FORK": "capture",
            failpoints.ENV: "changes.table_appended=sleep:0.3",  # a slow change-log stage, to see who holds its lock
            failpoints.CHILD_ENV: "changes.table_appended=exit",
        }
    )
    holder = _stage_holder(cdc, CHANGES_LOCK, process)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out + err
    assert holder.pid == process.pid  # the command's own process took the change logs
    _assert_equal_and_exactly_once(cdc)
    _assert_each_batch_recorded_once(cdc)


def test_a_duplicate_seq_the_child_finds_blocks_current_state_as_the_run_would(cdc: CdcEnv, own_home, monkeypatch) -> None:
    """A change log holding a seq twice (written by hand here): the child stops after the change logs, and the run
    fails `change_log_seq_unique`, naming it, with current state left where it was, as a sync that ran the
    stages in its op does."""
    from deltalake import DeltaTable, write_deltalake

    from cdc_assets.core.names import TableRef
    from cdc_assets.lake.layout import CHANGES
    from cdc_assets.stages.current.apply import read_current

    _create_tables(cdc)
    _write_tables(cdc, transactions=20)
    assert cdc.sync() == 0
    acct = TableRef(cdc.database, "acct")
    log = DeltaTable(cdc.lakehouse.table_uri(CHANGES, acct))
    write_deltalake(log.table_uri, log.to_pyarrow_table().slice(0, 1), mode="append")  # one change twice
    before = read_current(cdc.lakehouse, acct).num_rows

    cdc.execute("INSERT INTO acct (id, owner, balance) VALUES (999999, 'late', 1)")
    process = _sync_process({failpoints.CHILD_ENV: "changes.table_appended=sleep:0.5"})  # to see who appends
    holder = _stage_holder(cdc, CHANGES_LOCK, process)
    out, err = process.communicate(timeout=300)
    assert holder.pid != process.pid  # the child took the change logs, and found the duplicate
    assert process.returncode == 1, out + err
    assert "change_log_seq_unique" in out + err
    from cdc_assets.commands.runs import instance

    last = instance().get_runs(limit=1)[0]
    said = [e.user_message or "" for e in instance().all_logs(last.run_id)]
    assert not any("ended with exit code" in m for m in said), said  # the child stopped there itself
    assert read_current(cdc.lakehouse, acct).num_rows == before  # the late row was not applied
