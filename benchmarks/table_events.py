"""What the per-table assets' events cost with many tables: a run's materializations and check evaluations written one
by one (`context.log_event`) against one batch (`log_batch`), and capture's confirmations of quiet tables.

`.venv/bin/python -m benchmarks.table_events [TABLES]` (default 200): a throwaway DAGSTER_HOME and lakehouse in a
temporary directory, the project's instance config (its batching event log), no source or Spark needed.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKS = ("current_matches_source", "current_schema_matches_source", "table_lag")


def main(tables: int = 200) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="table-events-"))
    os.environ["DAGSTER_HOME"] = str(base / "home")
    from dagster import AssetCheckEvaluation, DagsterInstance, in_process_executor, job, op

    from cdc_assets.defs.assets.tables import confirmations, table_materializations
    from cdc_assets.defs.keys import table_asset_key
    from cdc_assets.lake.layout import CURRENT_STAGE
    from cdc_assets.lake.state import TableProgress, save_progress, save_registry
    from cdc_assets.lake.store import Lakehouse
    from cdc_assets.runtime.instance import ensure_dagster_home
    from cdc_assets.runtime.step_events import log_batch

    ensure_dagster_home()
    house = Lakehouse(str(base / "lake"))
    names = [f"db.t{i:03d}" for i in range(tables)]
    save_registry(house.store, {n: {"first_batch": "b1", "last_batch": "b1"} for n in names})
    for name in names:
        save_progress(house.store, CURRENT_STAGE, name, TableProgress("b1"))
    figures: dict[str, Any] = {"tables": tables}

    def events() -> list[Any]:
        own = list(table_materializations(house, {n: {"changes_in": 1} for n in names}).values())
        return own + [AssetCheckEvaluation(asset_key=table_asset_key(n), check_name=c, passed=True) for n in names for c in CHECKS]

    @op
    def one_by_one(context) -> None:  # type: ignore[no-untyped-def]
        batch = events()
        began = time.monotonic()
        for event in batch:
            context.log_event(event)
        figures["one by one: seconds"] = round(time.monotonic() - began, 2)
        figures["events per run"] = len(batch)

    @op
    def batched(context) -> None:  # type: ignore[no-untyped-def]
        batch = events()
        began = time.monotonic()
        log_batch(context, batch)
        figures["log_batch: seconds"] = round(time.monotonic() - began, 2)

    @op
    def confirm(context) -> None:  # type: ignore[no-untyped-def]
        began = time.monotonic()
        confirmed = confirmations(context.instance, house, "mysql-bin.000001:4", 0.0, time.time())
        found = time.monotonic()
        log_batch(context, confirmed)
        figures["confirmations: events"] = len(confirmed)
        figures["confirmations: find seconds"] = round(found - began, 2)
        figures["confirmations: write seconds"] = round(time.monotonic() - found, 2)

    instance = DagsterInstance.get()
    def run_of(step: Any) -> Any:
        def body() -> None:
            step()

        return job(name=f"bench_{step.name}", executor_def=in_process_executor)(body)

    for step in (one_by_one, batched, confirm):
        run_of(step).execute_in_process(instance=instance)
    return figures


if __name__ == "__main__":
    for label, value in main(int(sys.argv[1]) if len(sys.argv) > 1 else 200).items():
        print(f"{label:32} {value}")
