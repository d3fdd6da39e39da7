"""The names the wiring refers to things by: asset keys, job, sensor, schedule and resource names, and the tags Dagster
and the run queue read, all of one source (`SourceKeys`).

A named source (`Settings.name`: CDC_SOURCE_NAME, or a component's `name`) puts everything of its own under that name,
so any number of sources share one code location and one Dagster instance without a collision: asset keys
`orders_db/current/shop/orders`, jobs `orders_db__capture`, resources `orders_db__binlog`, run-queue lanes
`orders_db/capture`. The unnamed source of the environment (name None) keeps the plain names it always had
(`current/shop/orders`, `capture`, `binlog`); the module-level names below are that source's.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster import AssetKey

from cdc_assets.core.names import TableRef, name_of_segment, path_segment
from cdc_assets.runtime.instance import QUEUE_TAG, SINK_TAG, SOURCE_TAG, STAGE_TAG

RAW_ASSET_NAME = "raw_binlog_batches"
TABLES_ASSETS = "lakehouse_tables"  # the multi-asset over every table's change log and current state (assets/tables.py)

SINK_KEY_PREFIX = "sinks"

CAPTURE_JOB = "capture"
APPLY_JOB = "apply_changes"
NEW_TABLES_JOB = "apply_new_tables"  # the tables captured since the definitions loaded, which have no asset yet
LAG_JOB = "check_lag"
EQUALITY_JOB = "check_equality"  # every row of every table compared with the source (CDC_FULL_CHECK_CRON)
SNAPSHOT_JOB = "snapshot"
CONTINUOUS_JOB = "continuous"
SYNC_JOB = "sync"  # `cdc-lakehouse sync` in one run: capture, apply and checks (defs/sync.py)
FORGET_JOB = "forget"  # `cdc-lakehouse forget TABLE --key …` / `--rewrite-policies` (defs/jobs.py)
FORGET_OP = "forget_rows"
REPAIR_JOB = "repair"  # `cdc-lakehouse repair TABLE…`: the sync job's op with the tables to repair in its config

SOURCE_TABLE_PREFIX = "mysql"  # each source table, external: mysql/<schema>/<table>
CHANGES_TABLE_PREFIX = "changes"  # each table's change log: changes/<schema>/<table>
CURRENT_TABLE_PREFIX = "current"  # each table's current state: current/<schema>/<table>
TABLE_PREFIXES = (SOURCE_TABLE_PREFIX, CHANGES_TABLE_PREFIX, CURRENT_TABLE_PREFIX)
NAME_SEPARATOR = "__"  # between a source's name and a job's, sensor's, schedule's or resource's own name
CAPTURE_LANE, APPLY_LANE, SYNC_LANE = "capture", "apply", "sync"  # the run-queue lanes of a source (one run each)
UNNAMED_LANE = "-"  # the run-queue lane's and source tag's source part for the unnamed source


@dataclass(frozen=True)
class SourceKeys:
    """Every name of one source's definitions. `name` None: the unnamed source, with the plain names."""

    name: str | None = None

    # --- asset keys ---------------------------------------------------------------------------------------------
    def asset_key(self, *path: str) -> AssetKey:
        """A key of this source: `[name, *path]`, or `path` as it is for the unnamed source."""
        return AssetKey([self.name, *path] if self.name else list(path))

    @property
    def raw_asset(self) -> AssetKey:
        return self.asset_key(RAW_ASSET_NAME)

    def table_asset_key(self, table: str) -> AssetKey:
        """A table's current-state asset, `[<source>/]current/<schema>/<table>`."""
        return self._table_key(CURRENT_TABLE_PREFIX, table)

    def changes_asset_key(self, table: str) -> AssetKey:
        """A table's change-log asset, `[<source>/]changes/<schema>/<table>`."""
        return self._table_key(CHANGES_TABLE_PREFIX, table)

    def source_asset_key(self, table: str) -> AssetKey:
        """A source table's asset, `[<source>/]mysql/<schema>/<table>` (external: the source is not ours to write)."""
        return self._table_key(SOURCE_TABLE_PREFIX, table)

    def sink_asset_key(self, sink: str) -> AssetKey:
        """A sink's asset: `[<source>/]sinks/rabbitmq`."""
        return self.asset_key(SINK_KEY_PREFIX, sink)

    def prefix(self, *path: str) -> list[str]:
        """A key prefix of this source (for `AssetSelection.key_prefixes`): `[name, *path]`, or `path` unnamed."""
        return list(self.asset_key(*path).path)

    def is_current(self, key: AssetKey) -> bool:
        """Whether `key` is one of this source's current-state assets, `[<source>/]current/<schema>/<table>`."""
        path = self.own_path(key)
        return path is not None and len(path) == 3 and path[0] == CURRENT_TABLE_PREFIX

    def _table_key(self, prefix: str, table: str) -> AssetKey:
        """Each name as the path segment its Delta table's directory has (cdc_assets.core.names), so the key never
        holds a `/` of a name and plain names read as they are."""
        ref = TableRef.parse(table)
        return self.asset_key(prefix, path_segment(ref.schema), path_segment(ref.table))

    def own_path(self, key: AssetKey) -> list[str] | None:
        """The path of `key` below this source's name; None for a key of another source (or of none)."""
        path = list(key.path)
        if self.name is None:
            return path
        return path[1:] if len(path) > 1 and path[0] == self.name else None

    def table_of_key(self, key: AssetKey) -> str | None:
        """The `schema.table` of one of this source's table assets (`mysql/…`, `changes/…`, `current/…`), None for
        any other key."""
        path = self.own_path(key)
        if path is None or len(path) != 3 or path[0] not in TABLE_PREFIXES:
            return None
        return str(TableRef(name_of_segment(path[1]), name_of_segment(path[2])))

    # --- names of jobs, sensors, schedules and resources ----------------------------------------------------------
    def qualified(self, name: str) -> str:
        """A job's, sensor's, schedule's, check job's or resource's name: `<source>__<name>`, or `name` unnamed."""
        return f"{self.name}{NAME_SEPARATOR}{name}" if self.name else name

    def unqualified(self, name: str) -> str | None:
        """The own name of one of this source's qualified names; None for another source's."""
        if self.name is None:
            return name
        prefix = f"{self.name}{NAME_SEPARATOR}"
        return name[len(prefix) :] if name.startswith(prefix) else None

    def job(self, name: str) -> str:
        return self.qualified(name)

    def resource(self, name: str) -> str:
        return self.qualified(name)

    def resource_keys(self, *names: str) -> set[str]:
        """The resource keys an op, asset, check, sensor or schedule of this source requires (`required_resource_keys`)."""
        return {self.resource(name) for name in names}

    def op(self, name: str) -> str:
        """An op's definition name (unique in a code location of many sources; its node in a job keeps `name`)."""
        return self.qualified(name)

    def publish_job(self, sink: str) -> str:
        return self.qualified(publish_job_name(sink))

    @property
    def group(self) -> str | None:
        """The asset group of this source's assets (None: Dagster's default group)."""
        return self.name

    def group_of(self, layer: str) -> str:
        """The asset group of one layer's assets (`capture`, `sources`, `changes`, `current`, `sinks`, `examples`):
        the layer's own for the unnamed source, the source's name for a named one (one group per source, as Dagster's
        ingestion components give one per connection)."""
        return self.group or layer

    # --- run tags ---------------------------------------------------------------------------------------------------
    def lane(self, lane: str) -> str:
        """A run-queue lane of this source, `<source>/<lane>`: any instance lets one run of each go at a time."""
        return f"{self.name or UNNAMED_LANE}/{lane}"

    def tags(self, stage: str, lane: str | None = None) -> dict[str, str]:
        """A run's tags: its source, its stage and, where it takes one, its run-queue lane (capture, apply, sync,
        sink-<name>)."""
        tags = {SOURCE_TAG: self.name or UNNAMED_LANE, STAGE_TAG: stage}
        if lane is not None:
            tags[QUEUE_TAG] = self.lane(lane)
        return tags

    def sink_lane(self, sink: str) -> str:
        """The run-queue lane of one sink's publish runs."""
        return self.lane(f"sink-{sink}")

    def sink_tags(self, sink: str) -> dict[str, str]:
        return {**self.tags("publish", f"sink-{sink}"), SINK_TAG: sink}


UNNAMED = SourceKeys(None)

# The unnamed source's names (tests, and code that serves only the environment's one source).
RAW_ASSET = UNNAMED.raw_asset


def sink_asset_key(sink: str) -> AssetKey:
    return UNNAMED.sink_asset_key(sink)


def publish_job_name(sink: str) -> str:
    """A sink's publish job's own name, `publish_<sink>` (a source's is `SourceKeys.publish_job`)."""
    return f"publish_{sink}"


def table_asset_key(table: str) -> AssetKey:
    return UNNAMED.table_asset_key(table)


def changes_asset_key(table: str) -> AssetKey:
    return UNNAMED.changes_asset_key(table)


def source_asset_key(table: str) -> AssetKey:
    return UNNAMED.source_asset_key(table)


def table_of_key(key: AssetKey) -> str | None:
    return UNNAMED.table_of_key(key)
