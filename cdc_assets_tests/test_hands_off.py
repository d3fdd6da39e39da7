"""Hands-off, bounded end to end: `dagster dev` with its daemon, nobody clicking. While the source is written
to, the automation (freshness governing) captures and applies, and the current-state tables catch up; once the
automation stops, the daemon turns the tables' freshness to failing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dagster import AssetKey, DagsterInstance
from dagster._core.definitions.freshness import FreshnessState

from cdc_assets.defs.automation import AUTOMATION_SENSOR
from cdc_assets.defs.keys import table_asset_key
from cdc_assets.runtime.instance import ensure_dagster_home
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.dagster_dev import dagster_dev, graphql, wait_for

SENSOR_STATE = """
query SensorState($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { __typename ... on Sensor { sensorState { id } } }
}
"""
STOP_SENSOR = """
mutation StopSensor($id: String) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}
"""


def _write(cdc: CdcEnv, stop: threading.Event) -> int:
    written = 0
    with cdc.admin() as conn, conn.cursor() as cur:
        while not stop.is_set():
            cur.execute("INSERT INTO orders (item, qty) VALUES (%s, %s)", (f"item {written} 🛒", written % 7))
            cur.execute("UPDATE stock SET qty = qty - 1 WHERE id = %s", (written % 5,))
            written += 1
            stop.wait(0.2)
    return written


def _freshness(instance: DagsterInstance, key: AssetKey) -> FreshnessState | None:
    record = instance.get_freshness_state_records([key]).get(key)
    return None if record is None else record.freshness_state


def _stop_sensor(port: int, name: str) -> None:
    """What the sensor's switch in the UI does: the webserver's GraphQL API stops it (no CLI process loading the
    code location again)."""
    selector = {"repositoryLocationName": "cdc_assets", "repositoryName": "__repository__", "sensorName": name}
    sensor = graphql(port, SENSOR_STATE, {"selector": selector})["sensorOrError"]
    assert sensor["__typename"] == "Sensor", sensor
    stopped = graphql(port, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})["stopSensor"]
    assert stopped["__typename"] == "StopSensorMutationResult", stopped
    assert stopped["instigationState"]["status"] == "STOPPED", stopped


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
    monkeypatch.setenv("CDC_FRESHNESS_FAIL_MINUTES", "1.05")  # Dagster's shortest windows: warn 1, fail above it
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[1]")
    for mode in ("CDC_CAPTURE_CRON", "CDC_CAPTURE_INTERVAL_SECONDS", "CDC_CONTINUOUS"):
        monkeypatch.delenv(mode, raising=False)  # the default: freshness governs, through the automation
    ensure_dagster_home()
    assert cdc.sync() == 0  # the tables are in the registry when the definitions load: each has its assets
    orders = table_asset_key(f"{cdc.database}.orders")
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(cdc, stop))
    with dagster_dev(tmp_path / "dagster-dev.log") as port:
        writer.start()
        try:
            time.sleep(10)  # the workload keeps writing while the automation sensor ticks
        finally:
            stop.set()
            writer.join()

        instance = DagsterInstance.get()
        compared_after: list[object] = []  # the run change the last comparison came after

        def caught_up() -> bool:
            """The tables equal the source. The writes have stopped and only runs change the lakehouse, so they are
            compared again only once a run has changed state since the last comparison (which reads both tables and
            the source: some 50 times the CPU of asking the run storage)."""
            records = instance.get_run_records(limit=1, order_by="update_timestamp")
            latest = [(r.dagster_run.run_id, r.update_timestamp) for r in records]
            if latest == compared_after:
                return False
            compared_after[:] = latest
            results = cdc.verify()
            return len(results) == 2 and all(r.ok and r.in_flight_keys == 0 and r.compared_rows for r in results)

        wait_for("the current-state tables to equal the source", caught_up, timeout_s=240, every_s=1)
        wait_for("freshness to pass", lambda: _freshness(instance, orders) == FreshnessState.PASS, timeout_s=90, every_s=1)

        # The automation stops (its sensor is switched off): freshness must turn to failing by itself.
        _stop_sensor(port, AUTOMATION_SENSOR)
        # ...while the source changes: an idle source's tables are confirmed current without a run (the binlog
        # position sensor), so only a change nothing captures leaves them behind
        cdc.execute("INSERT INTO orders (item, qty) VALUES ('after the automation stopped', 1)")
        wait_for("freshness to fail", lambda: _freshness(instance, orders) == FreshnessState.FAIL, timeout_s=270, every_s=1)
