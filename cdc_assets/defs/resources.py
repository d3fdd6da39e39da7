"""Dagster resources, declared once and injected: the source's binlog (which holds the checkpoint), the
lakehouse (a directory, or S3 through the S3 resource's boto3 client), the transforms' engine (dagster-pyspark's
session), the sinks and the cadence (the checks' thresholds, the continuous mode's intervals). They are built from
one settings value (`resources_of`: core.settings.Settings, the code location's or the CLI's, its flags included):
a text the process's environment holds is passed as its `EnvVar`, so connection settings and credentials never
enter run config; plain numbers and the Spark master are given as they are. The resources hand plain settings
(SourceSettings, the Lakehouse and its LakehouseSettings, the sinks') to the Dagster-free code below them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

from cdc_assets.core.column_policy import KEY_VARIABLE, VARIABLES, policy_from_env
from cdc_assets.core.settings import (
    DEFAULT_CHECK_INTERVAL_SECONDS,
    DEFAULT_CURRENT_FILE_KB,
    DEFAULT_FRESHNESS_FAIL_MINUTES,
    DEFAULT_FRESHNESS_WARN_MINUTES,
    DEFAULT_FULL_CHECK_INTERVAL_SECONDS,
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
    CadenceSettings,
    EnvSetting,
    LakehouseSettings,
    S3Retries,
    Settings,
    SourceSettings,
    TableSelection,
    demo_flavour_of,
)
from cdc_assets.defs.keys import UNNAMED, SourceKeys
from cdc_assets.lake.store import Lakehouse, S3Access, lakehouse_from, s3_client
from cdc_assets.sinks.settings import SinkSettings, sink_settings
from cdc_assets.source.server import source_settings
from spark_resources.resources import LazySparkResource, TransformsResource
from spark_resources.session import spark_config


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
    exclude_columns: str | None = Field(default=None, description="schema.table.column globs left out (CDC_EXCLUDE_COLUMNS).")
    hash_columns: str | None = Field(default=None, description="schema.table.column globs kept as a keyed hash (CDC_HASH_COLUMNS).")
    mask_columns: str | None = Field(default=None, description="schema.table.column globs kept masked (CDC_MASK_COLUMNS).")
    hash_key: str | None = Field(default=None, description="The secret key of the hash (CDC_HASH_KEY, an EnvVar only).")
    demo_source: str | None = Field(
        default=None, description="Without mysql_url: the local demo server read, mariadb or mysql (CDC_DEMO_SOURCE)."
    )

    def settings(self) -> SourceSettings:
        """The source as plain settings; a bad URL, table pattern or column policy raises CdcUserError with the fix."""
        texts = {VARIABLES["exclude"]: self.exclude_columns, VARIABLES["hash"]: self.hash_columns,
                 VARIABLES["mask"]: self.mask_columns, KEY_VARIABLE: self.hash_key}  # fmt: skip
        return source_settings(
            self.mysql_url, self.server_id, self.tables, self.exclude_tables, self.max_batch_rows,
            self.max_batches, self.snapshot_chunk_rows, self.global_read_lock,
            policy_from_env({name: text for name, text in texts.items() if text}), demo_flavour_of(self.demo_source),
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
    current_file_kb: float = Field(
        default=DEFAULT_CURRENT_FILE_KB,
        description="The size of a keyed table's current-state files, each a key range, in KB (CDC_CURRENT_FILE_KB).",
    )
    s3: S3Resource = Field(
        default_factory=S3Resource, description="The S3 of an s3:// lakehouse (the standard AWS_* settings)."
    )

    def settings(self) -> LakehouseSettings:
        """The lakehouse's plain settings; a bad table glob raises CdcUserError with the fix."""
        return LakehouseSettings(
            location=self.location,
            history=TableSelection.parse(self.history_tables, "CDC_HISTORY_TABLES"),
            soft_deletes=TableSelection.parse(self.soft_deletes, "CDC_SOFT_DELETES"),
            lock_wait_seconds=self.lock_wait_seconds,
            lock_ttl_seconds=self.lock_ttl_seconds,
            s3_retries=S3Retries(self.s3_max_attempts, self.s3_timeout_seconds),
            current_file_kb=self.current_file_kb,
        )

    def get(self) -> Lakehouse:
        settings = self.settings()
        access = None
        if self.location.startswith("s3://"):
            # One set of settings for all: the boto3 client, delta-rs's storage options, pyarrow's filesystem.
            s3 = self.s3
            retries = settings.s3_retries
            connection = {
                "endpoint_url": s3.endpoint_url,
                "region": s3.region_name,
                "access_key_id": s3.aws_access_key_id,
                "secret_access_key": s3.aws_secret_access_key,
                "session_token": s3.aws_session_token,
            }
            client = s3_client(retries, **connection)
            access = S3Access.of(client, retries=retries, **connection)
        return lakehouse_from(settings, access)


class SinksResource(ConfigurableResource):
    """The message brokers every change is also published to (docs/sinks.md): a RabbitMQ exchange and a
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


class CadenceResource(ConfigurableResource):
    """The thresholds and intervals ops and checks read as they run (core.settings.CadenceSettings): the lag checks'
    (CDC_LAG_*, CDC_SINK_LAG_*), how often a capture confirms quiet tables (a quarter of the freshness warn window),
    and how often the continuous mode compares tables (CDC_CHECK_INTERVAL_SECONDS, CDC_FULL_CHECK_INTERVAL_SECONDS).
    What the definitions read when they are built (crons, modes, freshness policies, owners) they take from the
    settings value itself."""

    check_interval_seconds: float = Field(default=DEFAULT_CHECK_INTERVAL_SECONDS, description="CDC_CHECK_INTERVAL_SECONDS.")
    full_check_interval_seconds: float = Field(
        default=DEFAULT_FULL_CHECK_INTERVAL_SECONDS, description="CDC_FULL_CHECK_INTERVAL_SECONDS."
    )
    freshness_warn_minutes: float = Field(default=DEFAULT_FRESHNESS_WARN_MINUTES, description="CDC_FRESHNESS_WARN_MINUTES.")
    lag_warn_seconds: float = Field(default=DEFAULT_FRESHNESS_WARN_MINUTES * 60, description="CDC_LAG_WARN_SECONDS.")
    lag_fail_seconds: float = Field(default=DEFAULT_FRESHNESS_FAIL_MINUTES * 60, description="CDC_LAG_FAIL_SECONDS.")
    sink_lag_warn_seconds: float = Field(
        default=DEFAULT_FRESHNESS_WARN_MINUTES * 60, description="CDC_SINK_LAG_WARN_SECONDS."
    )
    sink_lag_fail_seconds: float = Field(
        default=DEFAULT_FRESHNESS_FAIL_MINUTES * 60, description="CDC_SINK_LAG_FAIL_SECONDS."
    )

    def values(self) -> CadenceSettings:
        """The fields as the settings value, whose properties are the one home of what they mean."""
        return CadenceSettings(**{name: getattr(self, name) for name in type(self).model_fields})

    @property
    def lag_thresholds(self) -> tuple[float, float]:
        return self.values().lag_thresholds

    @property
    def sink_lag_thresholds(self) -> tuple[float, float]:
        return self.values().sink_lag_thresholds

    @property
    def confirm_every_seconds(self) -> float:
        return self.values().confirm_every_seconds


# The settings whose text may hold a secret: given from any variable of the environment (a component's
# `"{{ env.ORDERS_DB_URL }}"`), they stay that variable's EnvVar.
SECRET_VARIABLES = frozenset(
    {"CDC_MYSQL_URL", "CDC_RABBITMQ_URL", "CDC_HASH_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
)


def environment_variable_holding(text: str, variable: str) -> str | None:
    """The variable of the process's environment that holds `text`: the setting's own, or, for a setting that may
    hold a secret, whichever variable a component's `{{ env.X }}` took it from; None when none does."""
    if os.environ.get(variable) == text:
        return variable
    if variable in SECRET_VARIABLES:
        return next((name for name, value in sorted(os.environ.items()) if value == text), None)
    return None


def _env_value(setting: EnvSetting, env: Mapping[str, str], resolved: bool = False) -> Any:
    """The setting's text in `env` (the settings' `environment`) as a resource field: its `EnvVar` when the process's
    environment holds that very text (so the value stays out of run config and the UI), the value itself when it
    does not (a CLI flag's, never a password: the CLI refuses one, and a component takes a password only from the
    environment) or with `resolved` (for resources used outside runs, never put in run config); the default when
    unset."""
    text = env.get(setting.variable)
    if not text:
        return setting.default
    value = setting.value(env)  # checked already by Settings.from_env: the same sentence
    holder = None if resolved else environment_variable_holding(text, setting.variable)
    if holder is None:
        return value
    return EnvVar.int(holder) if setting.whole_number else EnvVar(holder)


@dataclass(frozen=True)
class Resources:
    """The code location's resources of one source, by key (the names its assets and checks ask for)."""

    binlog: BinlogResource
    lakehouse: LakehouseResource
    s3: S3Resource
    pyspark: LazySparkResource
    transforms: TransformsResource
    sinks: SinksResource
    cadence: CadenceResource

    def by_key(self, keys: SourceKeys = UNNAMED) -> dict[str, Any]:
        """Each resource under the source's own key (`orders_db__binlog`; `binlog` for the unnamed source), so the
        resources of many sources sit side by side in one code location."""
        return {keys.resource(name): getattr(self, name) for name in RESOURCE_NAMES}


RESOURCE_NAMES = ("binlog", "lakehouse", "s3", "pyspark", "transforms", "sinks", "cadence")


@dataclass(frozen=True)
class SourceResources:
    """One source's resources as a run's, sensor's or schedule's context holds them, under the source's keys: what its
    ops, assets, checks, sensors and schedules read, having required them with `keys.resource_keys(...)`. A typed
    parameter would name the resource by the parameter's name, the same for every source. (A sensor's or schedule's
    function also takes `**_given`: called directly, as tests do, Dagster passes it the required resources as
    keywords too.)"""

    context: Any
    keys: SourceKeys

    def _get(self, name: str) -> Any:
        return getattr(self.context.resources, self.keys.resource(name))

    @property
    def binlog(self) -> BinlogResource:
        return self._get("binlog")

    @property
    def lakehouse(self) -> LakehouseResource:
        return self._get("lakehouse")

    @property
    def transforms(self) -> TransformsResource:
        return self._get("transforms")

    @property
    def sinks(self) -> SinksResource:
        return self._get("sinks")

    @property
    def cadence(self) -> CadenceResource:
        return self._get("cadence")


def resources_of(settings: Settings, resolved: bool = False) -> Resources:
    """Every resource of one settings value (docs/configuration.md), each declared once. `resolved`: with the values
    in place of EnvVars, ready for use outside a run (see `initialized_resources`)."""
    env = settings.environment

    def _env(name: str, default: Any) -> Any:
        return _env_value(EnvSetting(name, default), env, resolved)

    region = "AWS_REGION" if env.get("AWS_REGION") else "AWS_DEFAULT_REGION"
    retries = settings.lakehouse.s3_retries
    s3 = S3Resource(
        endpoint_url=_env("AWS_ENDPOINT_URL", None),
        region_name=_env(region, None),
        aws_access_key_id=_env("AWS_ACCESS_KEY_ID", None),
        aws_secret_access_key=_env("AWS_SECRET_ACCESS_KEY", None),
        aws_session_token=_env("AWS_SESSION_TOKEN", None),
        max_attempts=retries.max_attempts,
    )
    engine = settings.engine
    pyspark = LazySparkResource(spark_config=spark_config(engine.spark_master, dict(engine.spark_conf)))
    cadence = settings.cadence
    return Resources(
        binlog=BinlogResource(
            **{name: _env_value(setting, env, resolved) for name, setting in SOURCE_ENV.items()},
            snapshot_chunk_rows=settings.source.snapshot_chunk_rows,
            global_read_lock=settings.source.global_read_lock,
        ),
        lakehouse=LakehouseResource(
            **{name: _env_value(setting, env, resolved) for name, setting in LAKEHOUSE_ENV.items()},
            lock_wait_seconds=settings.lakehouse.lock_wait_seconds,
            lock_ttl_seconds=settings.lakehouse.lock_ttl_seconds,
            s3_max_attempts=retries.max_attempts,
            s3_timeout_seconds=retries.timeout_seconds,
            current_file_kb=settings.lakehouse.current_file_kb,
            s3=s3,
        ),
        s3=s3,
        pyspark=pyspark,
        transforms=TransformsResource(pyspark=pyspark, min_rows=engine.spark_min_rows),
        sinks=sinks_of(env, region, resolved),
        cadence=CadenceResource(**{name: getattr(cadence, name) for name in CadenceResource.model_fields}),
    )


def sinks_of(env: Mapping[str, str], region_variable: str, resolved: bool = False) -> SinksResource:
    def _env(name: str, default: Any) -> Any:
        return _env_value(EnvSetting(name, default), env, resolved)

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


def resources_from_env(resolved: bool = False) -> Resources:
    """`resources_of` the settings of this process's environment (the Dagster layer reads it: tests, scripts)."""
    return resources_of(Settings.from_env(os.environ), resolved)


def initialized_resources(settings: Settings | None = None) -> Resources:
    """The resources of `settings` (default: this process's environment's) with the values in place of EnvVars, for
    use outside a run (CLI verify, status, the checks before a run). None has set-up or teardown, so they are used as
    they are: Dagster's own initialization would make a throwaway instance (SQLite storages and their migrations) per
    resource."""
    return resources_of(Settings.from_env(os.environ) if settings is None else settings, resolved=True)
