"""The Dagster code location: every asset, check, job and resource of the pipeline, in one place."""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, apply_freshness_policy, in_process_executor

from cdc_assets.assets import current_tables, raw_binlog_batches, table_changes
from cdc_assets.checks import ALL_CHECKS
from cdc_assets.freshness import current_freshness_policy
from cdc_assets.instance import enable_event_batches
from cdc_assets.jobs import (
    APPLY_JOB_NAME,
    CAPTURE_JOB_NAME,
    SNAPSHOT_JOB_NAME,
    apply_job,
    capture_job,
    lag_check_job,
    snapshot_job,
)
from cdc_assets.resources import BinlogResource, LakehouseResource
from cdc_assets.schedules import build_capture_schedule, lag_check_schedule
from cdc_assets.sensors import build_binlog_sensor, raw_batch_sensor
from cdc_assets.settings import (
    DEFAULT_LAKEHOUSE,
    DEFAULT_LOCK_WAIT_SECONDS,
    DEFAULT_MAX_BATCH_ROWS,
    DEFAULT_SERVER_ID,
    env_number,
)
from spark_resources import SparkSessionResource
from spark_resources.session import DEFAULT_SPARK_MASTER

__all__ = [
    "APPLY_JOB_NAME",
    "CAPTURE_JOB_NAME",
    "SNAPSHOT_JOB_NAME",
    "build_definitions",
    "defs",
    "initialized_resources",
]


def _env(name: str, default: object, kind: str = "str") -> object:
    """`EnvVar(name)` when the variable is set (so the value stays out of run config), else the default."""
    if not os.environ.get(name):
        return default
    return EnvVar.int(name) if kind == "int" else EnvVar(name)


def lock_wait_seconds() -> float:
    return env_number("CDC_LOCK_WAIT_SECONDS", DEFAULT_LOCK_WAIT_SECONDS, lambda v: v >= 0, "a number of seconds")


def build_resources() -> dict[str, object]:
    return {
        "binlog": BinlogResource(
            mysql_url=_env("CDC_MYSQL_URL", None),
            server_id=_env("CDC_SERVER_ID", DEFAULT_SERVER_ID, "int"),
            tables=_env("CDC_TABLES", None),
            exclude_tables=_env("CDC_EXCLUDE_TABLES", None),
            max_batch_rows=_env("CDC_MAX_BATCH_ROWS", DEFAULT_MAX_BATCH_ROWS, "int"),
        ),
        "lakehouse": LakehouseResource(
            location=_env("CDC_LAKEHOUSE", DEFAULT_LAKEHOUSE), lock_wait_seconds=lock_wait_seconds()
        ),
        "spark": SparkSessionResource(master=_env("CDC_SPARK_MASTER", DEFAULT_SPARK_MASTER)),
    }


def initialized_resources() -> dict[str, object]:
    """The same resources with EnvVar values resolved, for use outside a run (CLI verify, status)."""
    return {name: r.process_config_and_initialize() for name, r in build_resources().items()}  # type: ignore[attr-defined]


def build_definitions() -> Definitions:
    # One process per run: the Spark session (a JVM) is started once and shared by the steps.
    # Freshness windows come from the environment when the definitions load (CDC_FRESHNESS_*).
    policy = current_freshness_policy()
    fresh = [a.map_asset_specs(lambda spec: apply_freshness_policy(spec, policy)) for a in (raw_binlog_batches, current_tables)]
    return Definitions(
        assets=[fresh[0], table_changes, fresh[1]],
        asset_checks=ALL_CHECKS,
        jobs=[capture_job, apply_job, lag_check_job, snapshot_job],
        schedules=[build_capture_schedule(), lag_check_schedule],
        sensors=[raw_batch_sensor, build_binlog_sensor()],
        resources=build_resources(),
        executor=in_process_executor,
    )


# Runs launched from the UI or the daemon load this module: their partition-range events go in batches too.
enable_event_batches()
defs = build_definitions()
