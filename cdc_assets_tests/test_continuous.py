"""The continuous mode, as a user runs it: `cdc-lakehouse run` in a process of its own catches up, keeps up, refuses
a `sync` beside it, stops on `cdc-lakehouse stop` or SIGTERM after a whole cycle, and after a SIGKILL goes on from
the checkpoint with nothing lost or doubled; each cycle is recorded in the Dagster instance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    SkipReason,
    build_sensor_context,
)
from deltalake import DeltaTable

from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.continuous import build_continuous_sensor
from cdc_assets.defs.keys import CAPTURE_LANE, CONTINUOUS_JOB, RAW_ASSET, UNNAMED, changes_asset_key, table_asset_key
from cdc_assets.defs.resources import LakehouseResource
from cdc_assets.defs.sensors import build_raw_batch_sensor
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.runtime.queue import capture_in_progress
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv, run_cli
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.test_pipeline import _all_change_seqs, _raw_seqs
from cdc_assets_tests.test_restart import _write_transactions

STOPPED = "continuous mode stopped"


def _start(env: dict[str, str] | None = None, stderr_to: Path | None = None) -> subprocess.Popen[str]:
    """`cdc-lakehouse run`; its stderr to `stderr_to` (a file to read after a failure) instead of a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "run", "--poll-seconds", "0.2"],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr_to is None else stderr_to.open("w"),
        text=True,
    )


def _wait_for(what: str, condition: Callable[[], bool], process: subprocess.Popen[str], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"`cdc-lakehouse run` ended ({process.returncode}) while waiting for {what}: {out} {err}")
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(0.5)


def _stopped(process: subprocess.Popen[str]) -> tuple[str, str]:
    """`cdc-lakehouse stop`, which must say the continuous mode stopped; then the run's own output."""
    stopped = run_cli("stop", timeout=120)
    assert stopped.returncode == 0 and STOPPED in stopped.stdout, stopped.stdout + stopped.stderr
    return process.communicate(timeout=60)


def _equal(cdc: CdcEnv, tables: int) -> bool:
    diffs = cdc.verify()
    return len(diffs) == tables and all(d.ok and d.in_flight_keys == 0 for d in diffs)


def _continuous_runs(but: set[str] | None = None) -> list:
    """The continuous runs in the session's instance, oldest first, but those of `but` (earlier tests')."""
    runs = [r for r in instance().get_runs() if r.job_name == CONTINUOUS_JOB and r.run_id not in (but or set())]
    return runs[::-1]


def _events(run_id: str, kind: DagsterEventType) -> list:
    return [e.dagster_event for e in instance().all_logs(run_id, of_type=kind)]


def _evaluate_sensor(cdc: CdcEnv) -> RunRequest | SkipReason:
    with build_sensor_context(
        instance=instance(), resources={"lakehouse": LakehouseResource(location=str(cdc.lakehouse_dir))}
    ) as context:
        return build_continuous_sensor(settings_now().cadence)(context)


def test_run_catches_up_keeps_up_refuses_a_sync_and_stops(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=200, rows_each=5)
    earlier = {r.run_id for r in _continuous_runs()}
    # CDC_CHECK_INTERVAL_SECONDS / CDC_FULL_CHECK_INTERVAL_SECONDS: the checks' cadence (the other test keeps the
    # defaults and sees none); CDC_MAX_BATCH_ROWS: the catch-up is several batches
    process = _start({"CDC_CHECK_INTERVAL_SECONDS": "1", "CDC_FULL_CHECK_INTERVAL_SECONDS": "4", "CDC_MAX_BATCH_ROWS": "300"})
    try:
        _wait_for("the catch-up", lambda: _equal(cdc, 1), process)
        assert len(list_batches(cdc.lakehouse.store)) > 1
        _write_transactions(cdc, transactions=50, rows_each=5, start=200)
        _wait_for("the new writes", lambda: _equal(cdc, 1), process, timeout_s=30)

        refused = run_cli("sync", timeout=120)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "continuous mode is running" in refused.stderr and "`cdc-lakehouse stop`" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
        assert isinstance(_evaluate_sensor(cdc), SkipReason)  # CDC_CONTINUOUS's sensor starts no second one
        # the batch mode stands aside: the capture schedule skips, the raw-batch sensor moves past applied batches
        assert (capture_in_progress(instance(), cdc.lakehouse, UNNAMED.lane(CAPTURE_LANE)) or "").startswith("The continuous mode is running")
        lake = LakehouseResource(location=str(cdc.lakehouse_dir))
        with build_sensor_context(instance=instance(), resources={"lakehouse": lake}) as context:
            skipped = build_raw_batch_sensor(settings_now().cadence)(context)
        assert not skipped.run_requests and skipped.cursor == list_batches(cdc.lakehouse.store)[-1]

        time.sleep(4)  # long enough for a full check at CDC_FULL_CHECK_INTERVAL_SECONDS=4
        out, err = _stopped(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and STOPPED in out, out + err
    assert "Traceback" not in err
    assert _equal(cdc, 1)

    [run] = _continuous_runs(but=earlier)
    assert run.status.value == "CANCELED"
    evaluations = [e.event_specific_data for e in _events(run.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)]
    # each comparison recorded the table's check on its own asset; the schema and lag checks go with it
    own = [c for c in evaluations if c.asset_key == table_asset_key(f"{cdc.database}.acct")]
    checks = [c for c in own if c.check_name == "current_matches_source"]
    by_name = {name: [c for c in own if c.check_name == name] for name in ("current_schema_matches_source", "table_lag")}
    assert all(len(found) == len(checks) and all(c.passed for c in found) for found in by_name.values()), by_name
    cadences = [c.metadata["cadence"].value for c in checks]
    assert cadences.count("changed") >= 1 and cadences.count("full") >= 1 and all(c.passed for c in checks), cadences
    # a full check compares every row; a "changed" one, after a table was found equal, only the keys changed since
    assert {c.metadata["scope"].value for c in checks if c.metadata["cadence"].value == "full"} == {"every row"}
    changed_scopes = [c.metadata["scope"].value for c in checks if c.metadata["cadence"].value == "changed"]
    assert all(s == "changed keys" or s.startswith("every row") for s in changed_scopes), changed_scopes
    materialized = _events(run.run_id, DagsterEventType.ASSET_MATERIALIZATION)
    table_key = table_asset_key(f"{cdc.database}.acct")  # the table's own asset, with its table metadata
    assert {e.asset_key for e in materialized} == {RAW_ASSET, changes_asset_key(f"{cdc.database}.acct"), table_key}
    own = [e.step_materialization_data.materialization.metadata for e in materialized if e.asset_key == table_key]
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM acct")
        assert own[-1]["dagster/row_count"].value == cur.fetchone()[0]
    assert [c.name for c in own[-1]["dagster/column_schema"].value.columns][:3] == ["id", "owner", "balance"]

    # CDC_CONTINUOUS: its sensor is on by default only when set, and starts a run once none is alive
    assert isinstance(_evaluate_sensor(cdc), RunRequest)
    assert build_continuous_sensor(settings_now().cadence).default_status == DefaultSensorStatus.STOPPED
    monkeypatch.setenv("CDC_CONTINUOUS", "1")
    assert build_continuous_sensor(settings_now().cadence).default_status == DefaultSensorStatus.RUNNING


def test_on_spark_each_cycle_takes_the_session_begun_at_the_start(cdc: CdcEnv) -> None:
    """CDC_SPARK_MIN_ROWS=0 (a cluster's default): every cycle with a change runs its stages on Spark. The run starts
    its session when it starts, beside its first polls, so no cycle waits for a JVM's start; the tables follow."""
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=40, rows_each=5)
    earlier = {r.run_id for r in _continuous_runs()}
    process = _start({"CDC_SPARK_MIN_ROWS": "0", "CDC_SPARK_MASTER": "local[1]"})
    try:
        _wait_for("the catch-up on Spark", lambda: _equal(cdc, 1), process, timeout_s=180)
        out, err = _stopped(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and STOPPED in out, out + err
    [run] = _continuous_runs(but=earlier)
    said = [e.user_message or "" for e in instance().all_logs(run.run_id)]
    on_spark = [m for m in said if m.startswith(("change logs on spark:", "current state on spark:")) and " s of them" in m]
    assert len(on_spark) >= 2, said  # both stages of the catch-up's cycle(s) on Spark
    # the first stage on Spark took the session whose start the run began before any cycle
    assert "its start begun" in on_spark[0], said


def test_killed_then_restarted_under_a_writer_ends_exactly_once(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    earlier = {r.run_id for r in _continuous_runs()}
    done = threading.Event()

    def write() -> None:
        start = 0
        while not done.is_set():
            _write_transactions(cdc, transactions=10, rows_each=4, start=start)
            start += 10
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    writer.start()
    first = _start({"CDC_MAX_BATCH_ROWS": "50"})
    try:
        _wait_for("a few cycles", lambda: len(list_batches(cdc.lakehouse.store)) >= 5 and _equal_rows_exist(cdc), first)
        first.send_signal(signal.SIGKILL)  # mid-flight: the writer keeps writing, cycles follow each other
        first.communicate()
        second = _start({"CDC_MAX_BATCH_ROWS": "50"})
        time.sleep(3)
    finally:
        done.set()
        writer.join()
    try:
        _wait_for("the catch-up after the restart", lambda: _equal(cdc, 1), second)
        # the killed run's record still says STARTED: `stop` ends it too, rather than wait for it for ever
        out, err = _stopped(second)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == 0 and STOPPED in out, out + err
    killed_run, second_run = _continuous_runs(but=earlier)
    assert killed_run.status == DagsterRunStatus.CANCELED and second_run.is_finished
    assert batch_chain_breaks(cdc.lakehouse) == []
    assert duplicate_seqs(cdc.lakehouse) == {}
    assert _all_change_seqs(cdc) == _raw_seqs(cdc)
    assert _equal(cdc, 1)

    runs = _continuous_runs(but=earlier)
    assert len(runs) == 2
    keys = {e.asset_key for run in runs for e in _events(run.run_id, DagsterEventType.ASSET_MATERIALIZATION)}
    table = f"{cdc.database}.acct"
    assert {changes_asset_key(table), table_asset_key(table), RAW_ASSET} <= keys
    # with the default cadence (60 s / 3600 s) these short runs owed no check yet
    assert not [e for run in runs for e in _events(run.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)]


def _equal_rows_exist(cdc: CdcEnv) -> bool:
    return bool(list((cdc.lakehouse_dir / "current").rglob("*.parquet")))


def test_a_current_state_written_behind_its_back_is_followed_and_named_by_the_check(cdc: CdcEnv, tmp_path: Path) -> None:
    """The follower keeps its Delta tables open between cycles: a commit of another writer is read, not written
    over, and a table made again is opened afresh. The check, in its own process, names the key that differs."""
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=20, rows_each=5)
    earlier = {r.run_id for r in _continuous_runs()}
    process = _start({"CDC_CHECK_INTERVAL_SECONDS": "1"}, stderr_to=tmp_path / "run.log")
    table = f"{cdc.database}.acct"
    uri = cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "acct"))
    try:
        _wait_for("the catch-up", lambda: _equal(cdc, 1), process)
        # another writer's commit between two cycles: the row of key 7 changed behind the pipeline's back
        DeltaTable(uri).update(predicate="id = 7", updates={"owner": "'tampered'"})
        _write_transactions(cdc, transactions=10, rows_each=5, start=20)  # the follower applies onto that commit
        _wait_for("the new writes", lambda: _current_row_count(cdc) == _source_row_count(cdc), process, timeout_s=30)

        def named() -> bool:
            failed = [c for c in _check_evaluations(earlier, table_asset_key(table)) if not c.passed]
            return any("1 different: 7" in (c.description or "") for c in failed)

        _wait_for("the check to name key 7", named, process, timeout_s=60)
        tampered = [r for r in DeltaTable(uri).to_pyarrow_table(columns=["id", "owner"]).to_pylist() if r["id"] == 7]
        assert tampered == [{"id": 7, "owner": "tampered"}]  # kept, not written over by a stale table
        process.send_signal(signal.SIGTERM)  # as a service manager stops it
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0 and STOPPED in out, out + (tmp_path / "run.log").read_text()[-3000:]
    diffs = cdc.verify()
    assert [d.diff.different for d in diffs] == [[(7,)]]  # the rows the follower applied after that commit are there
    own = [c for c in _check_evaluations(earlier, table_asset_key(table)) if not c.passed]
    assert own and "1 different: 7" in own[-1].description


def _check_evaluations(earlier: set[str], asset_key: AssetKey) -> list:
    return [
        e.event_specific_data
        for run in _continuous_runs(but=earlier)
        for e in _events(run.run_id, DagsterEventType.ASSET_CHECK_EVALUATION)
        if e.event_specific_data.asset_key == asset_key and e.event_specific_data.check_name == "current_matches_source"
    ]


def _current_row_count(cdc: CdcEnv) -> int:
    return DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "acct"))).to_pyarrow_table(columns=["id"]).num_rows


def _source_row_count(cdc: CdcEnv) -> int:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM acct")
        return int(cur.fetchone()[0])
