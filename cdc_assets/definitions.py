"""The Dagster code location: every asset, check, job and resource of the pipeline, in one place."""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, in_process_executor

from cdc_assets.assets import current_tables, raw_binlog_batches, table_changes
from cdc_assets.checks import change_log_seq_unique, raw_batches_contiguous
from cdc_assets.jobs import SNAPSHOT_JOB_NAME, SYNC_JOB_NAME, snapshot_job, sync_job
from cdc_assets.resources import BinlogResource, LakehouseResource
from cdc_assets.settings import DEFAULT_LAKEHOUSE, DEFAULT_MAX_BATCH_ROWS, DEFAULT_SERVER_ID
from spark_resources import SparkSessionResource
from spark_resources.session import DEFAULT_SPARK_MASTER

__all__ = ["SNAPSHOT_JOB_NAME", "SYNC_JOB_NAME", "build_definitions", "defs", "initialized_resources"]


def _env(name: str, default: object, kind: str = "str") -> object:
    """`EnvVar(name)` when the variable is set (so the value stays out of run config), else the default."""
    if not os.environ.get(name):
        return default
    return EnvVar.int(name) if kind == "int" else EnvVar(name)


def build_resources() -> dict[str, object]:
    return {
        "binlog": BinlogResource(
            mysql_url=_env("CDC_MYSQL_URL", None),
            server_id=_env("CDC_SERVER_ID", DEFAULT_SERVER_ID, "int"),
            tables=_env("CDC_TABLES", None),
            exclude_tables=_env("CDC_EXCLUDE_TABLES", None),
            max_batch_rows=_env("CDC_MAX_BATCH_ROWS", DEFAULT_MAX_BATCH_ROWS, "int"),
        ),
        "lakehouse": LakehouseResource(location=_env("CDC_LAKEHOUSE", DEFAULT_LAKEHOUSE)),
        "spark": SparkSessionResource(master=_env("CDC_SPARK_MASTER", DEFAULT_SPARK_MASTER)),
    }


def initialized_resources() -> dict[str, object]:
    """The same resources with EnvVar values resolved, for use outside a run (CLI verify, status)."""
    return {name: r.process_config_and_initialize() for name, r in build_resources().items()}  # type: ignore[attr-defined]


def build_definitions() -> Definitions:
    # One process per run: the Spark session (a JVM) is started once and shared by the steps.
    return Definitions(
        assets=[raw_binlog_batches, table_changes, current_tables],
        asset_checks=[raw_batches_contiguous, change_log_seq_unique],
        jobs=[sync_job, snapshot_job],
        resources=build_resources(),
        executor=in_process_executor,
    )


defs = build_definitions()
