"""Every asset, check, job, schedule, sensor and resource of the pipeline in one `Definitions`: what the code
location (`cdc_assets/definitions.py`) serves and what the CLI's runs resolve their jobs from. All of it is built
from one settings value (core.settings.Settings): the CLI's, or the environment's, read once as the code location
loads; the functions that build the schedules, sensors, freshness policies, sinks and resources are given it."""

from __future__ import annotations

import os

from dagster import Definitions, apply_freshness_policy, colored_console_logger, in_process_executor

from cdc_assets.core.settings import Settings
from cdc_assets.defs.assets import raw_binlog_batches
from cdc_assets.defs.assets.lakehouse_tables import TableOptions, build_table_assets, readable_tables
from cdc_assets.defs.automation import build_automation_sensor, capture_automation, table_automation
from cdc_assets.defs.checks import ALL_CHECKS
from cdc_assets.defs.cli_logger import progress_logger
from cdc_assets.defs.continuous import build_continuous_sensor, continuous_job
from cdc_assets.defs.examples import example_assets, example_sensors
from cdc_assets.defs.freshness import current_freshness_policy, freshness_policy
from cdc_assets.defs.jobs import (
    apply_job,
    build_lag_check_job,
    capture_job,
    equality_job,
    forget_job,
    new_tables_job,
    snapshot_job,
)
from cdc_assets.defs.resources import resources_of
from cdc_assets.defs.schedules import build_capture_schedule, build_full_check_schedule, lag_check_schedule
from cdc_assets.defs.sensors import build_binlog_sensor, build_new_tables_sensor, build_raw_batch_sensor
from cdc_assets.defs.sinks import (
    build_publish_job,
    build_sink_asset,
    build_sink_lag_check,
    build_sink_sensor,
    configured_sinks,
    sink_lag_check_key,
)
from cdc_assets.defs.sync import repair_job, sync_job
from cdc_assets.defs.table_checks import build_table_checks


def engine_kinds(min_rows: int) -> tuple[str, ...]:
    """The engines that may write the lakehouse's tables: Spark alone when every run takes it (a cluster, a Spark
    Connect server), else Arrow and Spark (Spark from CDC_SPARK_MIN_ROWS changes on)."""
    return ("spark",) if min_rows == 0 else ("arrow", "spark")


def build_definitions(settings: Settings | None = None, table_assets: bool = True) -> Definitions:
    """The definitions of `settings` (None: the code location's, read from this process's environment once, as it
    loads: the one place the definitions read it). `table_assets=False` leaves out the per-table assets and the
    examples (the registry is not read): what the CLI's runs resolve their jobs from, since their jobs are ops that
    record the per-table materializations by key."""
    settings = Settings.from_env(os.environ) if settings is None else settings
    cadence = settings.cadence
    # One process per run: a Spark session (a JVM), when a run needs one, is started once and shared by the steps.
    policy = current_freshness_policy(cadence)
    owners = cadence.asset_owners
    resources = resources_of(settings)
    # one set of assets per captured table, from the lakehouse's table registry as it is now: a table captured later
    # appears at the next definitions reload (docs/operating.md, "From the UI")
    tables = readable_tables(resources_of(settings, resolved=True).lakehouse.get()) if table_assets else []
    windows = {t.name: cadence.table_freshness_windows(t.name) for t in tables}
    tightest = min([cadence.freshness_windows, *windows.values()])
    kinds = engine_kinds(settings.engine.spark_min_rows)

    def options_for(name: str) -> TableOptions:
        warn, fail = windows[name]
        return TableOptions(freshness_policy(warn, fail), table_automation(warn), owners, kinds)

    raw = raw_binlog_batches.map_asset_specs(
        lambda spec: apply_freshness_policy(
            spec.replace_attributes(automation_condition=capture_automation(tightest[0]), owners=list(owners)),
            freshness_policy(*tightest),
        )
    )
    names = [t.name for t in tables]
    # a sink is configured when its destination is set (CDC_RABBITMQ_URL, CDC_KINESIS_STREAM)
    sinks = configured_sinks(settings)
    sink_assets = [
        build_sink_asset(s, names).map_asset_specs(
            lambda spec: apply_freshness_policy(spec.replace_attributes(owners=list(owners)), policy)
        )
        for s in sinks
    ]
    publish_jobs = [build_publish_job(s) for s in sinks]
    examples = example_assets(set(names))
    return Definitions(
        assets=[raw, *build_table_assets(tables, options_for), *examples, *sink_assets],
        asset_checks=[*ALL_CHECKS, *build_table_checks(names), *(build_sink_lag_check(s) for s in sinks)],
        jobs=[
            capture_job,
            apply_job,
            new_tables_job,
            build_lag_check_job(names, [sink_lag_check_key(s) for s in sinks]),
            snapshot_job,
            equality_job,
            forget_job,
            continuous_job,
            sync_job,
            repair_job,
            *publish_jobs,
        ],
        schedules=[build_capture_schedule(cadence), lag_check_schedule, build_full_check_schedule(cadence)],
        sensors=[
            build_automation_sensor(cadence),
            build_raw_batch_sensor(cadence),
            build_new_tables_sensor(cadence),
            build_binlog_sensor(cadence),
            build_continuous_sensor(cadence),
            *([build_sink_sensor(sinks, publish_jobs, settings)] if sinks else []),
            *example_sensors(examples),
        ],
        resources=resources.by_key(),
        executor=in_process_executor,
        # the console (Dagster's default) for runs of the UI and the daemon; progress for the CLI's long runs
        loggers={"console": colored_console_logger, "progress": progress_logger},
    )
