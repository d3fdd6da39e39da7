"""The capture schedule, and captures kept apart whoever starts them: schedule, CLI, UI or another machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunRequest, build_schedule_context
from dagster._core.definitions.schedule_definition import ScheduleExecutionData
from dagster._core.test_utils import create_run_for_test

from cdc_assets.commands.runs import instance as _instance
from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import CAPTURE_JOB as CAPTURE_JOB_NAME
from cdc_assets.defs.keys import CAPTURE_LANE, UNNAMED
from cdc_assets.defs.resources import LakehouseResource
from cdc_assets.defs.schedules import build_capture_schedule, build_full_check_schedule
from cdc_assets.lake.layout import CAPTURE_LOCK, RAW
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.state import CHECKPOINT_KEY
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.test_restart import _assert_exactly_once, _write_transactions


def test_capture_schedule_runs_every_minute_by_default_and_is_configurable(monkeypatch) -> None:
    monkeypatch.delenv("CDC_CAPTURE_CRON", raising=False)
    assert build_capture_schedule(settings_now().cadence).cron_schedule == "* * * * *"
    monkeypatch.setenv("CDC_CAPTURE_CRON", "*/5 * * * *")
    schedule = build_capture_schedule(settings_now().cadence)
    assert schedule.cron_schedule == "*/5 * * * *" and schedule.job_name == CAPTURE_JOB_NAME
    monkeypatch.setenv("CDC_CAPTURE_CRON", "every minute")
    with pytest.raises(CdcUserError, match="CDC_CAPTURE_CRON='every minute' is not a cron expression"):
        build_capture_schedule(settings_now().cadence)


def test_capture_schedule_skips_while_a_capture_runs_or_waits(cdc: CdcEnv, monkeypatch) -> None:
    monkeypatch.delenv("CDC_CAPTURE_CRON", raising=False)
    instance = _instance()
    schedule = build_capture_schedule(settings_now().cadence)
    resources = {"lakehouse": LakehouseResource(location=str(cdc.lakehouse_dir))}

    def tick() -> ScheduleExecutionData:
        with build_schedule_context(instance, resources=resources) as context:
            return schedule.evaluate_tick(context)

    assert isinstance(tick().run_requests[0], RunRequest)

    # A capture running anywhere (here: holding the lock from this process) makes the tick skip.
    with lakehouse_lock(cdc.lakehouse, CAPTURE_LOCK, "capture", "cdc-lakehouse sync on another machine"):
        skipped = tick()
    assert not skipped.run_requests
    assert "cdc-lakehouse sync on another machine" in skipped.skip_message
    assert "two captures never run at once" in skipped.skip_message
    assert tick().run_requests  # released: the next tick captures

    # A capture run waiting to start: no second one is queued behind it.
    run = create_run_for_test(
        instance, job_name=CAPTURE_JOB_NAME, status=DagsterRunStatus.NOT_STARTED, tags=UNNAMED.tags("capture", CAPTURE_LANE)
    )
    try:
        skipped = tick()
        assert not skipped.run_requests and run.run_id[:8] in skipped.skip_message
    finally:
        instance.report_run_failed(run)
    assert tick().run_requests


def test_sync_waits_for_a_capture_held_elsewhere_then_fails_with_the_holder(cdc: CdcEnv, monkeypatch, capsys) -> None:
    from cdc_assets.cli import main

    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    monkeypatch.setenv("CDC_LOCK_WAIT_SECONDS", "1")
    with lakehouse_lock(cdc.lakehouse, CAPTURE_LOCK, "capture", "another machine's sync"):
        began = time.monotonic()
        code = main(["sync"])
        waited = time.monotonic() - began
    err = capsys.readouterr().err.strip()
    assert code == 2 and waited >= 1
    assert err.startswith("error: Another capture is running (another machine's sync") and "\n" not in err
    assert "CDC_LOCK_WAIT_SECONDS" in err
    assert not (cdc.lakehouse_dir / CHECKPOINT_KEY).exists()
    assert not list((cdc.lakehouse_dir / RAW).glob("*/manifest.json")) if (cdc.lakehouse_dir / RAW).exists() else True
    assert main(["sync"]) == 0  # once released, the next sync captures
    assert all(d.ok for d in cdc.verify())


def test_two_syncs_started_together_never_capture_at_once(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=600, rows_each=5)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "50")
    monkeypatch.setenv("CDC_LOCK_WAIT_SECONDS", "120")
    # Both start while a third party holds the capture lock, so both are waiting when it is released and
    # race for it, and then for the change-log and current-state locks.
    with lakehouse_lock(cdc.lakehouse, CAPTURE_LOCK, "capture", "the test"):
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", "cdc_assets.cli", "sync"],
                env=dict(os.environ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        time.sleep(12)  # both processes start (about 5 s) and block on the lock
    results = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], results
    # Both captured from the same checkpoint only one after the other: batches chain, no change twice.
    _assert_exactly_once(cdc)


def test_the_schedule_is_an_option_and_continuous_capture_replaces_it_when_an_interval_is_set(monkeypatch) -> None:
    from dagster import DefaultScheduleStatus, DefaultSensorStatus

    from cdc_assets.defs.sensors import build_binlog_sensor

    monkeypatch.delenv("CDC_CAPTURE_INTERVAL_SECONDS", raising=False)
    monkeypatch.delenv("CDC_CAPTURE_CRON", raising=False)
    # by default the automation captures (defs/automation.py): the cron schedule is an option, switched off
    assert build_capture_schedule(settings_now().cadence).default_status == DefaultScheduleStatus.STOPPED
    monkeypatch.setenv("CDC_CAPTURE_CRON", "*/2 * * * *")  # the schedule mode: chosen by setting the cron
    assert build_capture_schedule(settings_now().cadence).default_status == DefaultScheduleStatus.RUNNING
    assert build_binlog_sensor(settings_now().cadence).default_status == DefaultSensorStatus.STOPPED
    monkeypatch.setenv("CDC_CAPTURE_INTERVAL_SECONDS", "5")
    assert build_capture_schedule(settings_now().cadence).default_status == DefaultScheduleStatus.STOPPED
    sensor = build_binlog_sensor(settings_now().cadence)
    assert sensor.default_status == DefaultSensorStatus.RUNNING and sensor.minimum_interval_seconds == 5
    monkeypatch.setenv("CDC_CAPTURE_INTERVAL_SECONDS", "0.5")
    with pytest.raises(CdcUserError, match="CDC_CAPTURE_INTERVAL_SECONDS='0.5' is not a number of seconds of at least 1"):
        build_binlog_sensor(settings_now().cadence)


def test_binlog_sensor_captures_when_the_binlog_grew_and_never_beside_another_capture(cdc: CdcEnv, monkeypatch) -> None:
    from dagster import build_sensor_context

    from cdc_assets.cli import main
    from cdc_assets.defs.resources import BinlogResource
    from cdc_assets.defs.sensors import build_binlog_sensor

    monkeypatch.setenv("CDC_CAPTURE_INTERVAL_SECONDS", "5")
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    instance = _instance()
    sensor = build_binlog_sensor(settings_now().cadence)
    binlog = BinlogResource(mysql_url=os.environ["CDC_MYSQL_URL"], tables=os.environ["CDC_TABLES"])
    resources = {"lakehouse": LakehouseResource(location=str(cdc.lakehouse_dir)), "binlog": binlog}

    def tick():  # type: ignore[no-untyped-def]
        with build_sensor_context(instance=instance, resources=resources) as context:
            return sensor.evaluate_tick(context)

    assert tick().run_requests  # nothing captured yet: the binlog is ahead
    assert main(["sync"]) == 0
    quiet = tick()
    assert not quiet.run_requests and "nothing new to capture" in quiet.skip_message
    # an instance that never recorded a capture (a new DAGSTER_HOME on a caught-up lakehouse): one is requested,
    # so the quiet tables get confirmed current instead of going stale
    with build_sensor_context(instance=DagsterInstance.ephemeral(), resources=resources) as context:
        assert sensor.evaluate_tick(context).run_requests
    cdc.execute("INSERT INTO t VALUES (2)")
    with lakehouse_lock(cdc.lakehouse, CAPTURE_LOCK, "capture", "a capture run"):
        busy = tick()
    assert not busy.run_requests and "a capture run" in busy.skip_message
    assert tick().run_requests


def test_a_quiet_binlog_is_still_captured_every_quarter_of_the_freshness_window(monkeypatch) -> None:
    from cdc_assets.defs.sensors import capture_due

    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "8")
    monkeypatch.setenv("CDC_FRESHNESS_FAIL_MINUTES", "16")
    every = settings_now().cadence.confirm_every_seconds
    assert every == 120
    assert capture_due(0, 1000.0, 1000.0 + every - 1, every) is None  # quiet, captured recently: skip
    assert "quiet tables" in (capture_due(0, 1000.0, 1000.0 + every, every) or "")  # quiet for a quarter window
    assert capture_due(0, None, 1000.0, every)  # never captured
    assert "bytes past the checkpoint" in (capture_due(10, 1000.0, 1000.5, every) or "")  # the binlog grew


def test_full_equality_schedule_runs_hourly_by_default_and_is_configurable(monkeypatch) -> None:
    monkeypatch.delenv("CDC_FULL_CHECK_CRON", raising=False)
    schedule = build_full_check_schedule(settings_now().cadence)
    assert schedule.cron_schedule == "0 * * * *" and schedule.job_name == "check_equality"
    monkeypatch.setenv("CDC_FULL_CHECK_CRON", "*/10 * * * *")
    assert build_full_check_schedule(settings_now().cadence).cron_schedule == "*/10 * * * *"
    # the code location serves the configured cadence, and the job it starts
    definitions = build_definitions()
    assert definitions.resolve_schedule_def("full_equality_schedule").cron_schedule == "*/10 * * * *"
    assert definitions.resolve_job_def("check_equality").name == "check_equality"
    monkeypatch.setenv("CDC_FULL_CHECK_CRON", "hourly")
    with pytest.raises(CdcUserError, match="CDC_FULL_CHECK_CRON='hourly' is not a cron expression"):
        build_full_check_schedule(settings_now().cadence)
