"""Every asset, check, job, schedule, sensor and resource of the pipeline in one `Definitions`: what the code
location (`cdc_assets/definitions.py`) serves and what the CLI's runs resolve their jobs from."""

from __future__ import annotations

from dagster import Definitions, apply_freshness_policy, colored_console_logger, in_process_executor

from cdc_assets.defs.assets import current_tables, raw_binlog_batches, table_changes
from cdc_assets.defs.checks import ALL_CHECKS
from cdc_assets.defs.freshness import current_freshness_policy
from cdc_assets.defs.jobs import apply_job, capture_job, lag_check_job, snapshot_job
from cdc_assets.defs.progress import progress_logger
from cdc_assets.defs.resources import resources_from_env
from cdc_assets.defs.schedules import build_capture_schedule, lag_check_schedule
from cdc_assets.defs.sensors import build_binlog_sensor, raw_batch_sensor


def build_definitions() -> Definitions:
    # One process per run: a Spark session (a JVM), when a run needs one, is started once and shared by the steps.
    # Freshness windows come from the environment when the definitions load (CDC_FRESHNESS_*).
    policy = current_freshness_policy()
    fresh = [a.map_asset_specs(lambda spec: apply_freshness_policy(spec, policy)) for a in (raw_binlog_batches, current_tables)]
    return Definitions(
        assets=[fresh[0], table_changes, fresh[1]],
        asset_checks=ALL_CHECKS,
        jobs=[capture_job, apply_job, lag_check_job, snapshot_job],
        schedules=[build_capture_schedule(), lag_check_schedule],
        sensors=[raw_batch_sensor, build_binlog_sensor()],
        resources=resources_from_env().by_key(),
        executor=in_process_executor,
        # the console (Dagster's default) for runs of the UI and the daemon; progress for the CLI's long runs
        loggers={"console": colored_console_logger, "progress": progress_logger},
    )
