"""`MySQLSource`: one MySQL or MariaDB source as a Dagster Component (`defs.yaml`), any number of them in one project.

The pattern is Dagster's own ingestion components (Sling's replication component, dlt's): YAML attributes in, the
definitions of one source out, built by a plain Python factory (`settings_of` -> `build_definitions`). Each attribute
is one of the settings of docs/configuration.md, given as YAML instead of an environment variable; the source's own
`name` puts every asset key, job, sensor, schedule and resource of it under that name (defs/keys.SourceKeys), so two
sources never collide in one code location or one instance.

    type: cdc_assets.components.MySQLSource
    attributes:
      name: orders_db
      mysql_url: "{{ env.ORDERS_DB_URL }}"      # from the environment, never written in YAML
      lakehouse: s3://lake/orders_db
      tables: [shop.*]

A component reads no CDC_* variable of the process: a source is its attributes (the AWS_* variables excepted: they are
the standard S3 credentials every source shares). `from_environment: true` is the one exception, the project's own
demo: that source is the process's CDC_* variables, read as the CLI reads them.

The component is state-backed, as Dagster's Airbyte and Fivetran components are: its state is the source's table list
(the lakehouse's registry and the source's tables under its filter, `write_state_to_path`), and the per-table assets
are built from it (`build_defs_from_state`), not from the lakehouse as it is when a run loads the definitions: the
runs a code server launches load the state it loaded, so a run selects tables its definitions have. By default
(LOCAL_FILESYSTEM, Dagster 1.13's default for its own components) the state is a file of the project's defs folder
(`.local_defs_state/`), written at each load under `dg dev` / `dagster dev` and by `dg utils refresh-defs-state`;
before it is first written the source has no per-table assets, and the new-tables sensor applies every table.
"""


import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import dagster as dg
from dagster.components import DefsStateConfig, DefsStateConfigArgs, ResolvedDefsStateConfig

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings, lakehouse_identity


class SparkArgs(dg.Model):
    """Where a source's stage runs go to Spark (CDC_SPARK_MASTER, CDC_SPARK_MIN_ROWS, CDC_SPARK_CONF)."""

    master: str | None = None
    min_rows: int | None = None
    conf: dict[str, str] | None = None


class RabbitMQArgs(dg.Model):
    url: str  # CDC_RABBITMQ_URL: from the environment ("{{ env.X }}"), it holds a password
    exchange: str | None = None
    tables: list[str] | None = None
    exclude_tables: list[str] | None = None


class KinesisArgs(dg.Model):
    stream: str
    tables: list[str] | None = None
    exclude_tables: list[str] | None = None


class SinkArgs(dg.Model):
    rabbitmq: RabbitMQArgs | None = None
    kinesis: KinesisArgs | None = None


class FreshnessArgs(dg.Model):
    """The freshness windows of every table (minutes), and each glob's own (`{"shop.orders": "1/3"}`)."""

    warn_minutes: float | None = None
    fail_minutes: float | None = None
    tables: dict[str, str] | None = None


@dataclass
class MySQLSource(dg.StateBackedComponent, dg.Resolvable):
    """One MySQL or MariaDB source captured into its own lakehouse: its raw binlog batches, each table's change log
    and current state, their checks, jobs, schedules and sensors, all under the source's name."""

    name: str | None = None
    mysql_url: str | None = None
    demo_source: str | None = None  # without mysql_url: the project's local demo server, mariadb or mysql (make demo)
    lakehouse: str | None = None
    tables: list[str] | None = None
    exclude_tables: list[str] | None = None
    server_id: int | None = None
    spark: SparkArgs | None = None
    exclude_columns: list[str] | None = None
    hash_columns: list[str] | None = None
    mask_columns: list[str] | None = None
    hash_key: str | None = None
    history_tables: list[str] | None = None
    soft_delete_tables: list[str] | None = None
    sinks: SinkArgs | None = None
    freshness: FreshnessArgs | None = None
    owners: list[str] | None = None
    group: str | None = None
    settings: dict[str, str] = field(default_factory=dict)  # any other variable of docs/configuration.md, by name
    from_environment: bool = False
    # where the table list is kept: a file of the defs folder (the default), refreshed at each load under `dg dev` /
    # `dagster dev` and by `dg utils refresh-defs-state`; or VERSIONED_STATE_STORAGE, LEGACY_CODE_SERVER_SNAPSHOTS
    defs_state: ResolvedDefsStateConfig = field(default_factory=DefsStateConfigArgs.local_filesystem)

    def source_settings(self) -> Settings:
        return settings_of(self)

    @property
    def defs_state_config(self) -> DefsStateConfig:
        """Keyed by the source's name: unique in a deployment, as every name of a source is. A source
        `from_environment` is the environment of the process that loads it, and processes with other settings load
        the same defs folder (make dev and the tests beside it, each with a lakehouse of its own): its key also names
        its lakehouse, so a run's process reads the table list its code server wrote, not another lakehouse's."""
        settings = self.source_settings()
        name = settings.name or "-"
        if self.from_environment:
            name += "@" + hashlib.sha256(lakehouse_identity(settings.lakehouse.location).encode()).hexdigest()[:12]
        return DefsStateConfig.from_args(self.defs_state, default_key=f"MySQLSource[{name}]")

    def write_state_to_path(self, state_path: Path) -> None:
        """The source's table list (defs/code_location.table_list_of) as JSON; a lakehouse or a source that cannot
        be read leaves its tables out with a warning, never failing the load."""
        from cdc_assets.defs.code_location import table_list_of

        state_path.parent.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(table_list_of(self.source_settings()), indent=1))

    def build_defs_from_state(self, context: dg.ComponentLoadContext, state_path: Path | None) -> dg.Definitions:
        """The source's definitions with a set of per-table assets for each table of the state; none while no state
        was written (LOCAL_FILESYSTEM before its first refresh): the new-tables sensor still applies every table."""
        from cdc_assets.defs.code_location import build_definitions, tables_of

        settings = self.source_settings()
        state = json.loads(state_path.read_text()) if state_path is not None else {}
        definitions = build_definitions(settings, tables=tables_of(settings, state))
        if self.group is None:
            return definitions
        group = self.group
        return definitions.map_asset_specs(func=lambda spec: spec.replace_attributes(group_name=group))


def _globs(values: Sequence[str] | None) -> str | None:
    return None if values is None else ",".join(values)


def variables_of(source: MySQLSource) -> dict[str, str]:
    """The component's attributes as the variables of docs/configuration.md they stand for: one meaning per
    setting, whichever way it is given, and the same checks and sentences."""
    spark = source.spark or SparkArgs()
    sinks = source.sinks or SinkArgs()
    freshness = source.freshness or FreshnessArgs()
    rabbitmq, kinesis = sinks.rabbitmq, sinks.kinesis
    given: dict[str, object] = {
        "CDC_SOURCE_NAME": source.name,
        "CDC_MYSQL_URL": source.mysql_url,
        "CDC_DEMO_SOURCE": source.demo_source,
        "CDC_LAKEHOUSE": source.lakehouse,
        "CDC_TABLES": _globs(source.tables),
        "CDC_EXCLUDE_TABLES": _globs(source.exclude_tables),
        "CDC_SERVER_ID": source.server_id,
        "CDC_SPARK_MASTER": spark.master,
        "CDC_SPARK_MIN_ROWS": spark.min_rows,
        "CDC_SPARK_CONF": None if spark.conf is None else json.dumps(spark.conf),
        "CDC_EXCLUDE_COLUMNS": _globs(source.exclude_columns),
        "CDC_HASH_COLUMNS": _globs(source.hash_columns),
        "CDC_MASK_COLUMNS": _globs(source.mask_columns),
        "CDC_HASH_KEY": source.hash_key,
        "CDC_HISTORY_TABLES": _globs(source.history_tables),
        "CDC_SOFT_DELETES": _globs(source.soft_delete_tables),
        "CDC_RABBITMQ_URL": rabbitmq and rabbitmq.url,
        "CDC_RABBITMQ_EXCHANGE": rabbitmq and rabbitmq.exchange,
        "CDC_RABBITMQ_TABLES": rabbitmq and _globs(rabbitmq.tables),
        "CDC_RABBITMQ_EXCLUDE_TABLES": rabbitmq and _globs(rabbitmq.exclude_tables),
        "CDC_KINESIS_STREAM": kinesis and kinesis.stream,
        "CDC_KINESIS_TABLES": kinesis and _globs(kinesis.tables),
        "CDC_KINESIS_EXCLUDE_TABLES": kinesis and _globs(kinesis.exclude_tables),
        "CDC_FRESHNESS_WARN_MINUTES": freshness.warn_minutes,
        "CDC_FRESHNESS_FAIL_MINUTES": freshness.fail_minutes,
        "CDC_FRESHNESS_TABLES": None if not freshness.tables else ",".join(f"{g}={w}" for g, w in freshness.tables.items()),
        "CDC_ASSET_OWNERS": _globs(source.owners),
    }
    variables = {name: str(value) for name, value in given.items() if value is not None and value != ""}
    if "CDC_MYSQL_URL" in variables and "CDC_DEMO_SOURCE" in variables:
        raise CdcUserError(f"The source {source.name!r} sets both mysql_url and demo_source, which reads a local demo server instead: keep one.")
    for name, value in source.settings.items():
        if not name.startswith("CDC_"):
            raise CdcUserError(f"The source {source.name!r} sets {name!r} under `settings`, which takes only the CDC_* variables of docs/configuration.md: use one of them, or the attribute of its own.")
        if name in variables:
            raise CdcUserError(f"The source {source.name!r} sets {name} both under `settings` and as an attribute: keep one.")
        variables[name] = str(value)
    return variables


def settings_of(source: MySQLSource, environment: Mapping[str, str] | None = None) -> Settings:
    """The source's settings value: its attributes (or, with `from_environment`, the process's CDC_* variables), with
    the AWS_* variables of the environment for an S3 lakehouse. A bad value raises the CdcUserError its variable
    would."""
    environment = os.environ if environment is None else environment
    if source.from_environment:
        given = variables_of(source)
        if given:
            raise CdcUserError(f"A source `from_environment` takes its settings from the CDC_* variables only, not from attributes ({', '.join(sorted(given))}): drop them or `from_environment`.")
        return Settings.from_env(environment)
    if not source.name:
        raise CdcUserError("A MySQLSource component needs a `name` (for example orders_db): every asset key, job and sensor of the source lives under it.")
    aws = {k: v for k, v in environment.items() if k.startswith("AWS_")}
    variables = variables_of(source)
    refuse_written_secrets(source.name, variables, environment)
    return Settings.from_env({**aws, **variables})


# The attributes whose text may hold a password or a key, by the variable they stand for.
SECRET_ATTRIBUTES = {"CDC_MYSQL_URL": "mysql_url", "CDC_RABBITMQ_URL": "sinks.rabbitmq.url", "CDC_HASH_KEY": "hash_key"}


def refuse_written_secrets(name: str, variables: Mapping[str, str], environment: Mapping[str, str]) -> None:
    """A password or key must come from the environment (`"{{ env.X }}"`), never be written in defs.yaml: then the
    resources hold it as that variable's EnvVar, out of run config and the UI (defs/resources.py)."""
    held = set(environment.values())
    for variable, attribute in SECRET_ATTRIBUTES.items():
        text = variables.get(variable)
        secret = text and (variable == "CDC_HASH_KEY" or urlparse(text).password)
        if secret and text not in held:
            raise CdcUserError(
                f"The source {name!r} has a password or key written in its defs.yaml ({attribute}): take it from the "
                f'environment instead, as "{{{{ env.{name.upper()}_URL }}}}" for a URL, so it never reaches the YAML, '
                "run config or the UI."
            )
