"""The names the wiring refers to things by: asset keys, job names and the tags Dagster and the run queue read."""

from dagster import AssetKey

from cdc_assets.core.names import TableRef, path_segment
from cdc_assets.runtime.instance import SINK_TAG as SINK_TAG  # the run queue's tags: dagster.yaml limits them
from cdc_assets.runtime.instance import STAGE_TAG as STAGE_TAG

RAW_ASSET = AssetKey("raw_binlog_batches")
CHANGES_ASSET = AssetKey("table_changes")
CURRENT_ASSET = AssetKey("current_tables")

SINK_KEY_PREFIX = "sinks"


def sink_asset_key(sink: str) -> AssetKey:
    """A sink's asset: `sinks/rabbitmq`, `sinks/kinesis`."""
    return AssetKey([SINK_KEY_PREFIX, sink])


def publish_job_name(sink: str) -> str:
    return f"publish_{sink}"


CAPTURE_JOB = "capture"
APPLY_JOB = "apply_changes"
LAG_JOB = "check_lag"
EQUALITY_JOB = "check_equality"  # every row of every table compared with the source (CDC_FULL_CHECK_CRON)
SNAPSHOT_JOB = "snapshot"
CONTINUOUS_JOB = "continuous"
SYNC_JOB = "sync"  # `cdc-lakehouse sync` in one run: capture, apply and checks (defs/sync.py)
REPAIR_JOB = "repair"  # `cdc-lakehouse repair TABLE…`: the sync job's op with the tables to repair in its config

# Dagster's own tags of a run over one partition or a range of them (documented system tags)
PARTITION_TAG = "dagster/partition"
PARTITION_RANGE_START_TAG = "dagster/asset_partition_range_start"
PARTITION_RANGE_END_TAG = "dagster/asset_partition_range_end"


CURRENT_TABLE_PREFIX = "current"  # per-table current-state assets: current/<schema>/<table>


def table_asset_key(table: str) -> AssetKey:
    """A table's own current-state asset, `current/<schema>/<table>`: each name as the path segment its Delta
    table's directory has (cdc_assets.core.names), so the key never holds a `/` of a name and plain names read as
    they are (`current/shop/orders`)."""
    ref = TableRef.parse(table)
    return AssetKey([CURRENT_TABLE_PREFIX, path_segment(ref.schema), path_segment(ref.table)])
