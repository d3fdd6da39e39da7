"""Dagster resources, declared once and injected: the source's binlog (which holds the checkpoint), the
lakehouse (a directory, or S3 through the S3 resource's boto3 client) and the transforms' engine (dagster-pyspark's
session). Connection settings and credentials set in the environment are passed as `EnvVar`s, so they never
enter run config; plain numbers and the Spark master are read once, when the definitions load. The resources
hand plain settings to the Dagster-free code below them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import (
    DEFAULT_LAKEHOUSE,
    DEFAULT_LOCK_TTL_SECONDS,
    DEFAULT_LOCK_WAIT_SECONDS,
    DEFAULT_MAX_BATCH_ROWS,
    DEFAULT_S3_MAX_ATTEMPTS,
    DEFAULT_S3_TIMEOUT_SECONDS,
    DEFAULT_SERVER_ID,
    DEFAULT_SNAPSHOT_CHUNK_ROWS,
    LAKEHOUSE_ENV,
    SOURCE_ENV,
    EnvSetting,
    S3Retries,
    SourceSettings,
    check_numeric_settings,
    global_read_lock,
    lock_ttl_seconds,
    lock_wait_seconds,
    s3_retries_from_env,
    snapshot_chunk_rows,
    spark_min_rows,
)
from cdc_assets.lake.store import Lakehouse, S3Access, lakehouse_of, s3_client
from cdc_assets.sinks.settings import SinkSettings, sink_settings
from cdc_assets.source.server import source_settings
from spark_resources.engine import DEFAULT_SPARK_MIN_ROWS
from spark_resources.resources import LazySparkResource, TransformsResource
from spark_resources.session import DEFAULT_SPARK_MASTER, run_spark_config


class BinlogResource(ConfigurableResource):
    """Reads the source's binlog as a replica and keeps the checkpoint under `_state/` in the lakehouse."""

    mysql_url: str | None = Field(
        default=None, description="mysql://user:password@host:port (CDC_MYSQL_URL); default: the local demo server."
    )
    server_id: int = Field(default=DEFAULT_SERVER_ID, description="Replica server id used to read (CDC_SERVER_ID).")
    tables: str | None = Field(default=None, description="Comma-separated schema.table globs to include.")
    exclude_tables: str | None = Field(default=None, description="Comma-separated schema.table globs to exclude.")
    max_batch_rows: int = Field(
        default=DEFAULT_MAX_BATCH_ROWS,
        description="A batch ends at the first transaction boundary after this many row changes.",
    )
    max_batches: int | None = Field(default=None, description="Stop after this many batches (None: to the end).")
    snapshot_chunk_rows: int = Field(
        default=DEFAULT_SNAPSHOT_CHUNK_ROWS,
        description="A snapshot on Spark reads a table in primary-key ranges of about this many rows, one task each.",
    )
    global_read_lock: bool = Field(
        default=False,
        description="Take consistent points on MySQL under FLUSH TABLES WITH READ LOCK (CDC_GLOBAL_READ_LOCK=on; "
        "needs RELOAD). Off: no lock, as RDS and Aurora require.",
    )

    def settings(self) -> SourceSettings:
        """The source as plain settings; a bad URL or table pattern raises CdcUserError with the fix."""
        return source_settings(
            self.mysql_url, self.server_id, self.tables, self.exclude_tables, self.max_batch_rows,
            self.max_batches, self.snapshot_chunk_rows, self.global_read_lock,
        )  # fmt: skip


class S3Resource(ConfigurableResource):
    """The S3 of an s3:// lakehouse: the standard AWS_* settings, and a boto3 client made from them.

    dagster-aws's S3Resource does the same, but importing dagster_aws loads its every integration (Athena,
    Secrets Manager, Dagster's test utilities): about 0.7 s added to every CLI command, a local lakehouse's too."""

    endpoint_url: str | None = Field(default=None, description="A custom endpoint (AWS_ENDPOINT_URL).")
    region_name: str | None = Field(default=None, description="The region (AWS_REGION or AWS_DEFAULT_REGION).")
    aws_access_key_id: str | None = Field(default=None, description="Access key (AWS_ACCESS_KEY_ID).")
    aws_secret_access_key: str | None = Field(default=None, description="Secret key (AWS_SECRET_ACCESS_KEY).")
    aws_session_token: str | None = Field(default=None, description="Session token (AWS_SESSION_TOKEN).")
    max_attempts: int = Field(default=5, description="Attempts per request, the first included (boto3's retries).")

    def get_client(self) -> Any:
        import boto3  # only a lakehouse on S3 pays for it
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            region_name=self.region_name,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
            config=Config(retries={"max_attempts": self.max_attempts}),
        )


class LakehouseResource(ConfigurableResource):
    """Where raw batches, state and Delta tables live (`CDC_LAKEHOUSE`: a directory or s3://bucket/prefix)."""

    location: str = Field(default=DEFAULT_LAKEHOUSE, description="Local directory or s3://bucket/prefix.")
    lock_wait_seconds: float = Field(
        default=DEFAULT_LOCK_WAIT_SECONDS,
        description="How long a stage waits for another run of the same stage to finish (CDC_LOCK_WAIT_SECONDS).",
    )
    lock_ttl_seconds: float = Field(
        default=DEFAULT_LOCK_TTL_SECONDS,
        description="On S3: how long a lock lease lives unless renewed, so a killed run's lease blocks the next "
        "run at most that long (CDC_LOCK_TTL_SECONDS).",
    )
    history_tables: str | None = Field(
        default=None, description="schema.table globs whose SCD2 history is kept under history/ (CDC_HISTORY_TABLES)."
    )
    soft_deletes: str | None = Field(
        default=None,
        description="schema.table globs whose deleted rows stay in current state with _cdc_deleted = true (CDC_SOFT_DELETES).",
    )
    s3_max_attempts: int = Field(
        default=DEFAULT_S3_MAX_ATTEMPTS,
        description="Tries of one S3 request, retries with backoff included, by every S3 client (CDC_S3_MAX_ATTEMPTS).",
    )
    s3_timeout_seconds: float = Field(
        default=DEFAULT_S3_TIMEOUT_SECONDS,
        description="Connect and read timeout of one try of an S3 request (CDC_S3_TIMEOUT_SECONDS).",
    )
    s3: S3Resource = Field(
        default_factory=S3Resource, description="The S3 of an s3:// lakehouse (the standard AWS_* settings)."
    )

    def get(self) -> Lakehouse:
        access = None
        if self.location.startswith("s3://"):
            # One set of settings for all: the boto3 client, delta-rs's storage options, pyarrow's filesystem.
            s3 = self.s3
            retries = S3Retries(self.s3_max_attempts, self.s3_timeout_seconds)
            connection = {
                "endpoint_url": s3.endpoint_url,
                "region": s3.region_name,
                "access_key_id": s3.aws_access_key_id,
                "secret_access_key": s3.aws_secret_access_key,
                "session_token": s3.aws_session_token,
            }
            client = s3_client(retries, **connection)
            access = S3Access.of(client, retries=retries, **connection)
        return lakehouse_of(
            self.location, self.lock_wait_seconds, self.lock_ttl_seconds, self.history_tables, self.soft_deletes,
            access,
        )  # fmt: skip


class SinksResource(ConfigurableResource):
    """The message brokers every change is also published to (README, "Sinks"): a RabbitMQ exchange and a
    Kinesis stream, each on when its destination is set, each with its own table globs. The AMQP URL (it holds
    a password) comes from an EnvVar, so it never enters run config; Kinesis takes the standard AWS settings
    (AWS_REGION, credentials, AWS_ENDPOINT_URL_KINESIS) as boto3 reads them."""

    rabbitmq_url: str | None = Field(default=None, description="amqp://user:password@host:port/vhost (CDC_RABBITMQ_URL).")
    rabbitmq_exchange: str | None = Field(default=None, description="Exchange to publish to (CDC_RABBITMQ_EXCHANGE).")
    rabbitmq_tables: str | None = Field(default=None, description="schema.table globs the RabbitMQ sink publishes.")
    rabbitmq_exclude_tables: str | None = Field(default=None, description="schema.table globs it leaves out.")
    kinesis_stream: str | None = Field(default=None, description="Kinesis stream to put records to (CDC_KINESIS_STREAM).")
    kinesis_tables: str | None = Field(default=None, description="schema.table globs the Kinesis sink publishes.")
    kinesis_exclude_tables: str | None = Field(default=None, description="schema.table globs it leaves out.")
    aws_region: str | None = Field(default=None, description="Region of the Kinesis stream (AWS_REGION).")
    dedup_seconds: str | None = Field(default=None, description="Collapse repeated updates of a key within this many seconds (CDC_SINK_DEDUP_SECONDS; off by default).")
    heartbeat_seconds: str | None = Field(default=None, description="Send a heartbeat message this often (CDC_SINK_HEARTBEAT_SECONDS; off by default).")

    def environment(self) -> dict[str, str]:
        """The settings as the environment's texts they came from, for `sink_settings`."""
        values = {
            "CDC_RABBITMQ_URL": self.rabbitmq_url,
            "CDC_RABBITMQ_EXCHANGE": self.rabbitmq_exchange,
            "CDC_RABBITMQ_TABLES": self.rabbitmq_tables,
            "CDC_RABBITMQ_EXCLUDE_TABLES": self.rabbitmq_exclude_tables,
            "CDC_KINESIS_STREAM": self.kinesis_stream,
            "CDC_KINESIS_TABLES": self.kinesis_tables,
            "CDC_KINESIS_EXCLUDE_TABLES": self.kinesis_exclude_tables,
            "AWS_REGION": self.aws_region,
            "CDC_SINK_DEDUP_SECONDS": self.dedup_seconds,
            "CDC_SINK_HEARTBEAT_SECONDS": self.heartbeat_seconds,
        }
        return {k: v for k, v in values.items() if v}

    def settings(self, sink: str) -> SinkSettings:
        """One sink's plain settings; a bad value raises CdcUserError with the fix."""
        return sink_settings(sink, self.environment())


def _env_value(setting: EnvSetting, resolved: bool = False) -> Any:
    """`EnvVar` of the setting's variable when it is set (so the value stays out of run config), else the
    default; with `resolved`, the variable's value itself (for resources used outside runs, never put in run
    config)."""
    if not os.environ.get(setting.variable):
        return setting.default
    value = setting.value()  # a bad value is refused here, with the fix, whoever builds the resources (a CLI, the UI)
    if resolved:
        return value
    return EnvVar.int(setting.variable) if setting.whole_number else EnvVar(setting.variable)


@dataclass(frozen=True)
class Resources:
    """The code location's resources, by key (the names assets and checks ask for)."""

    binlog: BinlogResource
    lakehouse: LakehouseResource
    s3: S3Resource
    pyspark: LazySparkResource
    transforms: TransformsResource
    sinks: SinksResource

    def by_key(self) -> dict[str, Any]:
        return {
            "binlog": self.binlog,
            "lakehouse": self.lakehouse,
            "s3": self.s3,
            "pyspark": self.pyspark,
            "transforms": self.transforms,
            "sinks": self.sinks,
        }


def resources_from_env(resolved: bool = False) -> Resources:
    """Every resource configured from the environment (README: Configuration), each declared once. `resolved`: with the
    variables' values in place of EnvVars, ready for use outside a run (see `initialized_resources`)."""

    def _env(name: str, default: Any) -> Any:
        return _env_value(EnvSetting(name, default), resolved)

    check_numeric_settings()  # every one, also those no resource holds: the code location's load says it, as the CLI
    region = "AWS_REGION" if os.environ.get("AWS_REGION") else "AWS_DEFAULT_REGION"
    retries = s3_retries_from_env()
    s3 = S3Resource(
        endpoint_url=_env("AWS_ENDPOINT_URL", None),
        region_name=_env(region, None),
        aws_access_key_id=_env("AWS_ACCESS_KEY_ID", None),
        aws_secret_access_key=_env("AWS_SECRET_ACCESS_KEY", None),
        aws_session_token=_env("AWS_SESSION_TOKEN", None),
        max_attempts=retries.max_attempts,
    )
    master = os.environ.get("CDC_SPARK_MASTER") or DEFAULT_SPARK_MASTER
    try:
        session_config = run_spark_config()
    except ValueError as exc:  # CDC_SPARK_CONF's sentence
        raise CdcUserError(str(exc)) from None
    pyspark = LazySparkResource(spark_config=session_config)
    return Resources(
        binlog=BinlogResource(
            **{name: _env_value(setting, resolved) for name, setting in SOURCE_ENV.items()},
            snapshot_chunk_rows=snapshot_chunk_rows(),
            global_read_lock=global_read_lock(),
        ),
        lakehouse=LakehouseResource(
            **{name: _env_value(setting, resolved) for name, setting in LAKEHOUSE_ENV.items()},
            lock_wait_seconds=lock_wait_seconds(),
            lock_ttl_seconds=lock_ttl_seconds(),
            s3_max_attempts=retries.max_attempts,
            s3_timeout_seconds=retries.timeout_seconds,
            s3=s3,
        ),
        s3=s3,
        pyspark=pyspark,
        transforms=TransformsResource(pyspark=pyspark, min_rows=spark_min_rows(master, DEFAULT_SPARK_MIN_ROWS)),
        sinks=sinks_from_env(region, resolved),
    )


def sinks_from_env(region_variable: str, resolved: bool = False) -> SinksResource:
    def _env(name: str, default: Any) -> Any:
        return _env_value(EnvSetting(name, default), resolved)

    return SinksResource(
        rabbitmq_url=_env("CDC_RABBITMQ_URL", None),
        rabbitmq_exchange=_env("CDC_RABBITMQ_EXCHANGE", None),
        rabbitmq_tables=_env("CDC_RABBITMQ_TABLES", None),
        rabbitmq_exclude_tables=_env("CDC_RABBITMQ_EXCLUDE_TABLES", None),
        kinesis_stream=_env("CDC_KINESIS_STREAM", None),
        kinesis_tables=_env("CDC_KINESIS_TABLES", None),
        kinesis_exclude_tables=_env("CDC_KINESIS_EXCLUDE_TABLES", None),
        aws_region=_env(region_variable, None),
        dedup_seconds=_env("CDC_SINK_DEDUP_SECONDS", None),
        heartbeat_seconds=_env("CDC_SINK_HEARTBEAT_SECONDS", None),
    )


def initialized_resources() -> Resources:
    """The same resources with the environment's values in place of EnvVars, for use outside a run (CLI verify,
    status, the checks before a run). None has set-up or teardown, so they are used as they are: Dagster's own
    initialization would make a throwaway instance (SQLite storages and their migrations) per resource."""
    return resources_from_env(resolved=True)
