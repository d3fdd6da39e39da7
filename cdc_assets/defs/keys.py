"""The names the wiring refers to things by: asset keys, job names and the tags Dagster and the run queue read."""

from dagster import AssetKey

from cdc_assets.core.names import TableRef, name_of_segment, path_segment
from cdc_assets.runtime.instance import SINK_TAG as SINK_TAG  # the run queue's tags: dagster.yaml limits them
from cdc_assets.runtime.instance import STAGE_TAG as STAGE_TAG

RAW_ASSET = AssetKey("raw_binlog_batches")
TABLES_ASSETS = "lakehouse_tables"  # the multi-asset over every table's change log and current state (assets/tables.py)

SINK_KEY_PREFIX = "sinks"


def sink_asset_key(sink: str) -> AssetKey:
    """A sink's asset: `sinks/rabbitmq`, `sinks/kinesis`."""
    return AssetKey([SINK_KEY_PREFIX, sink])


def publish_job_name(sink: str) -> str:
    return f"publish_{sink}"


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


def _table_key(prefix: str, table: str) -> AssetKey:
    """`<prefix>/<schema>/<table>`: each name as the path segment its Delta table's directory has
    (cdc_assets.core.names), so the key never holds a `/` of a name and plain names read as they are."""
    ref = TableRef.parse(table)
    return AssetKey([prefix, path_segment(ref.schema), path_segment(ref.table)])


def table_asset_key(table: str) -> AssetKey:
    """A table's current-state asset, `current/<schema>/<table>` (`current/shop/orders`)."""
    return _table_key(CURRENT_TABLE_PREFIX, table)


def changes_asset_key(table: str) -> AssetKey:
    """A table's change-log asset, `changes/<schema>/<table>`."""
    return _table_key(CHANGES_TABLE_PREFIX, table)


def source_asset_key(table: str) -> AssetKey:
    """A source table's asset, `mysql/<schema>/<table>` (external: the source is not ours to write)."""
    return _table_key(SOURCE_TABLE_PREFIX, table)


def table_of_key(key: AssetKey) -> str | None:
    """The `schema.table` of a table's asset key (`mysql/…`, `changes/…`, `current/…`), None for any other key."""
    prefixes = (SOURCE_TABLE_PREFIX, CHANGES_TABLE_PREFIX, CURRENT_TABLE_PREFIX)
    if len(key.path) != 3 or key.path[0] not in prefixes:
        return None
    return str(TableRef(name_of_segment(key.path[1]), name_of_segment(key.path[2])))
