"""Every asset, check, job, schedule, sensor and resource of the pipeline in one `Definitions`: what the code
location (`cdc_assets/definitions.py`) serves and what the CLI's runs resolve their jobs from. All of it is built
from one settings value (core.settings.Settings): the CLI's, or the environment's, read once as the code location
loads; the functions that build the schedules, sensors, freshness policies, sinks and resources are given it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import Definitions, apply_freshness_policy, colored_console_logger, in_process_executor

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings, lakehouse_identity
from cdc_assets.defs.assets import build_raw_asset
from cdc_assets.defs.assets.lakehouse_tables import (
    CapturedTable,
    TableOptions,
    build_table_assets,
    readable_tables,
    source_table_names,
    table_list_state,
    tables_of_state,
)
from cdc_assets.defs.automation import (
    binlog_position_spec,
    build_automation_sensor,
    capture_automation,
    table_automation,
)
from cdc_assets.defs.checks import build_raw_checks
from cdc_assets.defs.cli_logger import progress_logger
from cdc_assets.defs.continuous import build_continuous_job, build_continuous_sensor
from cdc_assets.defs.examples import example_assets, example_sensors
from cdc_assets.defs.freshness import current_freshness_policy, freshness_policy
from cdc_assets.defs.jobs import (
    build_apply_job,
    build_capture_job,
    build_equality_job,
    build_forget_job,
    build_lag_check_job,
    build_new_tables_job,
    build_snapshot_job,
)
from cdc_assets.defs.keys import SourceKeys
from cdc_assets.defs.resources import resources_of
from cdc_assets.defs.schedules import build_capture_schedule, build_full_check_schedule, build_lag_check_schedule
from cdc_assets.defs.sensors import (
    PositionTiming,
    build_binlog_position_sensor,
    build_binlog_sensor,
    build_new_tables_sensor,
    build_raw_batch_sensor,
)
from cdc_assets.defs.sinks import (
    build_publish_job,
    build_sink_asset,
    build_sink_lag_check,
    build_sink_sensor,
    configured_sinks,
    sink_lag_check_key,
)
from cdc_assets.defs.sync import build_sync_jobs
from cdc_assets.defs.table_checks import build_table_checks


def engine_kinds(min_rows: int) -> tuple[str, ...]:
    """The engines that may write the lakehouse's tables: Spark alone when every run takes it (a cluster, a Spark
    Connect server), else Arrow and Spark (Spark from CDC_SPARK_MIN_ROWS changes on)."""
    return ("spark",) if min_rows == 0 else ("arrow", "spark")


def build_definitions(
    settings: Settings | None = None, table_assets: bool = True, tables: list[CapturedTable] | None = None
) -> Definitions:
    """The definitions of one source, `settings` (None: the code location's, read from this process's environment
    once, as it loads: the one place the definitions read it). Every asset key, job, sensor, schedule, check and
    resource key is the source's (`SourceKeys(settings.name)`: under its name, or the plain names of the unnamed
    source), so the definitions of many sources merge (`build_definitions_of`). `table_assets=False` leaves out the
    per-table assets and the examples (the registry is not read): what the CLI's runs resolve their jobs from, since
    their jobs are ops that record the per-table materializations by key. `tables`: the source's tables as the
    MySQLSource component's state holds them (None: the lakehouse's registry, read now)."""
    settings = Settings.from_env(os.environ) if settings is None else settings
    keys = SourceKeys(settings.name)
    cadence = settings.cadence
    # One process per run: a Spark session (a JVM), when a run needs one, is started once and shared by the steps.
    policy = current_freshness_policy(cadence)
    owners = cadence.asset_owners
    resources = resources_of(settings)
    # one set of assets per table: the component's state, else the lakehouse's registry as it is now; a table created
    # later appears at the next definitions load (docs/operating.md, "From the UI")
    if not table_assets:
        tables = []
    elif tables is None:
        tables = readable_tables(resources_of(settings, resolved=True).lakehouse.get())
    windows = {t.name: cadence.table_freshness_windows(t.name) for t in tables}
    tightest = min([cadence.freshness_windows, *windows.values()])
    kinds = engine_kinds(settings.engine.spark_min_rows)

    def options_for(name: str) -> TableOptions:
        warn, fail = windows[name]
        return TableOptions(freshness_policy(warn, fail), table_automation(warn, keys), owners, kinds)

    raw = build_raw_asset(keys, captured={t.name for t in tables if t.captured}).map_asset_specs(
        lambda spec: apply_freshness_policy(
            spec.replace_attributes(automation_condition=capture_automation(tightest[0]), owners=list(owners)),
            freshness_policy(*tightest),
        )
    )
    names = [t.name for t in tables]
    # a sink is configured when its destination is set (CDC_RABBITMQ_URL, CDC_KINESIS_STREAM)
    sinks = configured_sinks(settings)
    sink_assets = [
        build_sink_asset(s, names, keys).map_asset_specs(
            lambda spec: apply_freshness_policy(spec.replace_attributes(owners=list(owners)), policy)
        )
        for s in sinks
    ]
    publish_jobs = [build_publish_job(s, keys) for s in sinks]
    examples = example_assets(set(names), keys)
    # the idle source's look (no run): retried within the capture's cron, quiet tables confirmed within the tightest window
    position_timing = PositionTiming.of(tightest[0], cadence.lag_thresholds)
    return Definitions(
        assets=[binlog_position_spec(keys, owners), raw, *build_table_assets(tables, options_for, keys), *examples, *sink_assets],
        asset_checks=[
            *build_raw_checks(keys),
            *build_table_checks(names, keys),
            *(build_sink_lag_check(s, keys) for s in sinks),
        ],
        jobs=[
            build_capture_job(keys),
            build_apply_job(keys),
            build_new_tables_job(keys),
            build_lag_check_job(names, [sink_lag_check_key(s, keys) for s in sinks], keys),
            build_snapshot_job(keys),
            build_equality_job(keys),
            build_forget_job(keys),
            build_continuous_job(keys),
            *build_sync_jobs(keys),
            *publish_jobs,
        ],
        schedules=[
            build_capture_schedule(cadence, keys),
            build_lag_check_schedule(keys, reported_without_run=cadence.automation_on),
            build_full_check_schedule(cadence, keys),
        ],
        sensors=[
            build_automation_sensor(cadence, keys),
            build_binlog_position_sensor(cadence, position_timing, keys, tuple(sinks)),
            build_raw_batch_sensor(cadence, keys),
            build_new_tables_sensor(cadence, keys),
            build_binlog_sensor(cadence, keys),
            build_continuous_sensor(cadence, keys),
            *([build_sink_sensor(sinks, publish_jobs, settings, keys)] if sinks else []),
            *example_sensors(examples, keys),
        ],
        resources=resources.by_key(keys),
        executor=in_process_executor,
        # the console (Dagster's default) for runs of the UI and the daemon; progress for the CLI's long runs
        loggers={"console": colored_console_logger, "progress": progress_logger},
    )


def table_list_of(settings: Settings) -> dict[str, Any]:
    """The MySQLSource component's state: the source's tables, from the lakehouse's registry and the source's own
    information_schema under its table filter (lakehouse_tables.table_list_state)."""
    house = resources_of(settings, resolved=True).lakehouse.get()
    return table_list_state(house, lambda: source_table_names(settings.source))


def tables_of(settings: Settings, state: Mapping[str, Any]) -> list[CapturedTable]:
    """The tables of the component's state, as `build_definitions` takes them (their locations in the source's
    lakehouse as now set)."""
    return tables_of_state(state, resources_of(settings, resolved=True).lakehouse.get())


def build_definitions_of(sources: Sequence[Settings], table_assets: bool = True) -> Definitions:
    """The definitions of several sources in one code location: each source's (`build_definitions`), merged. Two
    sources with one name (their names would collide), or writing one lakehouse (its checkpoint and locks are one
    source's), are refused with one sentence."""
    names: dict[str | None, int] = {}
    lakehouses: dict[str, str] = {}
    for i, settings in enumerate(sources):
        label = settings.name or "the unnamed source"
        if settings.name in names:
            raise CdcUserError(
                f"Two sources are named {label!r}: give each source a name of its own (CDC_SOURCE_NAME, or the "
                "component's `name`), as every asset key, job and resource of a source lives under its name."
            )
        names[settings.name] = i
        where = lakehouse_identity(settings.lakehouse.location)
        if where in lakehouses:
            raise CdcUserError(
                f"The sources {lakehouses[where]!r} and {label!r} both write the lakehouse {settings.lakehouse.location}: "
                "give each source a lakehouse of its own (CDC_LAKEHOUSE), as a lakehouse holds one source's checkpoint "
                "and locks."
            )
        lakehouses[where] = label
    return Definitions.merge(*(build_definitions(settings, table_assets) for settings in sources))
