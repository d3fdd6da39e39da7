"""The UI as a data engineer sees it (issue 30, "Done when"): `make dev`'s command, then headless Chromium (Debian's
package) over the DevTools protocol. One table's lineage runs from its source through its change log to its current
state; its Materialize button is enabled and a one-table materialization succeeds (the lakehouse then equals the
source for it); its column schema, row count and automation condition are shown. Screenshots go to the test's
directory, or to CDC_UI_SCREENSHOTS (`CDC_UI_SCREENSHOTS=docs` made those in docs/)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cdc_assets.commands.runs import instance
from cdc_assets.defs.keys import table_asset_key
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.local_source.server import free_port
from cdc_assets_tests.browser import Page, chromium
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_local_dev import _ui_answers


def test_a_table_in_the_ui_lineage_materialize_schema_rows_and_automation(cdc: CdcEnv, tmp_path: Path) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE orders (id INT PRIMARY KEY, status VARCHAR(12) NOT NULL, total DECIMAL(10,2))",
        "INSERT INTO orders VALUES (1, 'new', 12.50), (2, 'paid', 7.25), (3, 'paid', 1.00)",
    )
    assert cdc.sync() == 0  # the registry knows the table when `make dev` loads the definitions
    captured = len(list_batches(cdc.lakehouse.store))
    cdc.execute("INSERT INTO orders VALUES (4, 'shipped', 3.00)", "UPDATE orders SET status = 'shipped' WHERE id = 2")
    shots = Path(os.environ.get("CDC_UI_SCREENSHOTS") or tmp_path)
    port = free_port()
    env = {**os.environ, "CDC_SPARK_MASTER": "local[1]"}  # a Spark of the user's: no Spark Connect JVM to start
    for mode in ("CDC_CAPTURE_CRON", "CDC_CAPTURE_INTERVAL_SECONDS", "CDC_CONTINUOUS"):
        env.pop(mode, None)
    dev = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.local_dev", "--port", str(port), "--spark-connect-port", str(free_port())],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    key = table_asset_key(f"{db}.orders")
    asset_url = f"http://127.0.0.1:{port}/assets/{'/'.join(key.path)}"
    try:
        deadline = time.monotonic() + 180
        while not _ui_answers(port):
            assert dev.poll() is None and time.monotonic() < deadline, "make dev's UI did not answer"
            time.sleep(1)
        with chromium(tmp_path / "chromium") as page:
            # the overview: columns with their Delta types, the row count, the automation condition derived from freshness
            page.open(asset_url)
            text = page.wait_for_text("Materialize", "status", "decimal(10,2)", "on_cron", timeout_s=120)
            assert "within 2 min" in text and "Row count" in text
            _settle(page)
            button = page.button("Materialize")
            assert button is not None and not button["disabled"]  # not an external asset any more
            page.screenshot(shots / "ui-table-overview.png")

            # lineage: the source table, its change log, its current state
            page.open(f"{asset_url}?view=lineage&lineageScope=upstream&lineageDepth=3")
            text = page.wait_for_text("sources", "changes", "current", "raw_binlog_batches", timeout_s=60)
            assert text.count("orders") >= 3 and "MySQL" in text  # the table in each of the three groups
            _settle(page)
            page.screenshot(shots / "ui-table-lineage.png")

            # one table materialized from its page: one run, which succeeds and brings the table up to date with
            # what is captured. The table's asset applies the raw batches it finds; capturing them is the raw asset's
            # (make dev's automation, by itself): the click waits for the capture of the two changes written above
            deadline = time.monotonic() + 180
            while len(list_batches(cdc.lakehouse.store)) <= captured:
                assert dev.poll() is None and time.monotonic() < deadline, "make dev's automation never captured"
                time.sleep(1)
            page.open(asset_url)
            page.wait_for_text("Materialize", timeout_s=60)
            before = instance().get_latest_materialization_event(key)
            page.click("Materialize")
            deadline = time.monotonic() + 120
            while True:
                event = instance().get_latest_materialization_event(key)
                if event is not None and (before is None or event.run_id != before.run_id):
                    break
                assert time.monotonic() < deadline, "the materialization launched from the UI never landed"
                time.sleep(1)
            run = instance().get_run_by_id(event.run_id)
            deadline = time.monotonic() + 60
            while not run.is_finished:
                assert time.monotonic() < deadline
                time.sleep(1)
                run = instance().get_run_by_id(event.run_id)
            assert run.is_success and current_keys(run) == {key}
            page.open(asset_url)
            page.wait_for_text("Row count", "4", "Passing", timeout_s=60)
            _settle(page)
            page.screenshot(shots / "ui-table-materialized.png")
    finally:
        os.killpg(dev.pid, signal.SIGINT)  # Ctrl-C: it stops what it started
        try:
            dev.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
    [diff] = cdc.verify()
    assert diff.ok and diff.in_flight_keys == 0 and diff.compared_rows == 4


def _settle(page: Page) -> None:
    """The page loaded, and Dagster's community prompt (it opens over any page a while after the first visit)
    dismissed, before a screenshot."""
    page.settle()
    if page.button("Skip"):
        page.click("Skip")
        page.settle()


def current_keys(run) -> set:  # type: ignore[no-untyped-def]
    """The current-state assets a run selected."""
    return {k for k in run.asset_selection or () if k.path[0] == "current"}
