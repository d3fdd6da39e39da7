"""Hands-off, bounded end to end: `dagster dev` with its daemon, nobody clicking. While the source is written
to, the automation (freshness governing) captures and applies, and the current-state tables catch up; once the
automation stops, the daemon turns the tables' freshness to failing."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dagster import AssetKey, DagsterInstance
from dagster._core.definitions.freshness import FreshnessState

from cdc_assets.defs.keys import table_asset_key
from cdc_assets.runtime.instance import ensure_dagster_home
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.dagster_dev import DAGSTER, REPO, dagster_dev


def _write(cdc: CdcEnv, stop: threading.Event) -> int:
    written = 0
    with cdc.admin() as conn, conn.cursor() as cur:
        while not stop.is_set():
            cur.execute("INSERT INTO orders (item, qty) VALUES (%s, %s)", (f"item {written} 🛒", written % 7))
            cur.execute("UPDATE stock SET qty = qty - 1 WHERE id = %s", (written % 5,))
            written += 1
            stop.wait(0.2)
    return written


def _wait_for(what: str, condition: Callable[[], bool], timeout_s: float, every_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(every_s)


def _freshness(instance: DagsterInstance, key: AssetKey) -> FreshnessState | None:
    record = instance.get_freshness_state_records([key]).get(key)
    return None if record is None else record.freshness_state


def test_make_dev_catches_up_by_itself_and_fails_freshness_when_capture_stops(
    cdc: CdcEnv, tmp_path: Path, monkeypatch
) -> None:
    cdc.execute(
        "CREATE TABLE orders (id INT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(40), qty INT)",
        "CREATE TABLE stock (id INT PRIMARY KEY, qty INT)",
        "INSERT INTO stock VALUES (0, 100), (1, 100), (2, 100), (3, 100), (4, 100)",
    )
    home = tmp_path / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "1")
    monkeypatch.setenv("CDC_FRESHNESS_FAIL_MINUTES", "1.25")
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[1]")
    for mode in ("CDC_CAPTURE_CRON", "CDC_CAPTURE_INTERVAL_SECONDS", "CDC_CONTINUOUS"):
        monkeypatch.delenv(mode, raising=False)  # the default: freshness governs, through the automation
    ensure_dagster_home()
    assert cdc.sync() == 0  # the tables are in the registry when the definitions load: each has its assets
    orders = table_asset_key(f"{cdc.database}.orders")
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(cdc, stop))
    with dagster_dev(tmp_path / "dagster-dev.log"):
        writer.start()
        try:
            time.sleep(10)  # the workload keeps writing while the automation sensor ticks
        finally:
            stop.set()
            writer.join()

        def caught_up() -> bool:
            results = cdc.verify()
            return len(results) == 2 and all(r.ok and r.in_flight_keys == 0 and r.compared_rows for r in results)

        _wait_for("the current-state tables to equal the source", caught_up, timeout_s=240)
        instance = DagsterInstance.get()
        _wait_for("freshness to pass", lambda: _freshness(instance, orders) == FreshnessState.PASS, timeout_s=90)

        # The automation stops (its sensor is switched off): freshness must turn to failing by itself.
        subprocess.run(
            [DAGSTER, "sensor", "stop", "automation_sensor", "-w", "workspace.yaml"],
            cwd=REPO,
            env=dict(os.environ),
            check=True,
            capture_output=True,
        )
        _wait_for("freshness to fail", lambda: _freshness(instance, orders) == FreshnessState.FAIL, timeout_s=270)
