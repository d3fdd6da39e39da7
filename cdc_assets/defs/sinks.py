"""The sinks in Dagster: for each configured sink an asset downstream of the change logs (a publish run, see
cdc_assets/sinks/publish.py), its lag check, its job, and one sensor that starts publish runs.

A sink is configured when its destination is set in the settings the definitions are built from (CDC_RABBITMQ_URL,
CDC_KINESIS_STREAM); each sink runs in runs of its own, so a broker that is down fails only its sink's runs,
never capture, the stages or another sink."""


import time
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    AssetsDefinition,
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    MaterializeResult,
    Nothing,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    asset_check,
    define_asset_job,
    sensor,
)

from cdc_assets.core.settings import Settings
from cdc_assets.defs.assets.metadata import figures_table
from cdc_assets.defs.keys import SINK_KEY_PREFIX, SINK_TAG, UNNAMED, SourceKeys
from cdc_assets.defs.resources import LakehouseResource, SinksResource, SourceResources
from cdc_assets.lake.locks import read_holder, run_owner
from cdc_assets.lake.state import known_tables
from cdc_assets.runtime.instance import QUEUE_TAG
from cdc_assets.runtime.queue import WAITING_STATUSES
from cdc_assets.sinks.checkpoint import load_checkpoint
from cdc_assets.sinks.lag import sink_lag
from cdc_assets.sinks.publish import WINDOW_MESSAGES, publish, publisher_for, sink_lock_name
from cdc_assets.sinks.settings import configured_sink_names, sink_settings

RETRY_AFTER_SECONDS = 60  # a sink whose last publish run failed (broker down) is tried again at most this often
SENSOR_INTERVAL_SECONDS = 15


def configured_sinks(settings: Settings) -> list[str]:
    """The sinks whose destination `settings` set."""
    return configured_sink_names(settings.environment)


def build_sink_asset(sink: str, tables: Sequence[str] = (), keys: SourceKeys = UNNAMED) -> AssetsDefinition:
    """The sink's asset, downstream of the change logs of `tables` (the registry's; the raw batches before any)."""

    @asset(
        key=keys.sink_asset_key(sink),
        group_name=keys.group_of(SINK_KEY_PREFIX),
        kinds={sink},
        required_resource_keys=keys.resource_keys("lakehouse", "sinks"),
        # inputs named by position: names from the keys would hold a segment such as `a~20b`, no valid Dagster name
        ins={f"changes_{i}": AssetIn(keys.changes_asset_key(t), dagster_type=Nothing) for i, t in enumerate(tables)}
        or {"raw_batches": AssetIn(keys.raw_asset, dagster_type=Nothing)},
        description=(
            f"Every change of the change logs its tables' globs include, published to the {sink} sink as a "
            "Debezium-style JSON message (TRUNCATE and schema changes as messages of their own), in _cdc_seq order "
            f"per key. Its checkpoint (_state/sinks/{sink}.json) moves only after the broker acknowledged a whole "
            f"window of at most {WINDOW_MESSAGES} messages: at-least-once, with stable ids to de-duplicate."
        ),
        op_tags={SINK_TAG: sink},
    )
    def publish_to_sink(context: AssetExecutionContext) -> MaterializeResult:
        used = SourceResources(context, keys)
        settings = used.sinks.settings(sink)
        owner = run_owner(context.run.run_id)
        report = publish(settings, used.lakehouse.get(), publisher_for(settings), owner=owner, log=context.log)
        lag = report.lag
        context.log.info(
            f"{sink}: {report.messages} messages ({report.bytes:,} bytes) acknowledged by {report.destination} in "
            f"{report.seconds:.1f}s, up to seq {report.last_seq}"
        )
        per_table = {table: {"messages": count} for table, count in report.tables.items()}
        return MaterializeResult(
            metadata={
                "destination": report.destination,
                "messages": report.messages,
                "bytes": report.bytes,
                "last_seq": report.last_seq if report.last_seq is not None else 0,
                "lag_seconds": round(lag.seconds, 1) if lag else 0.0,
                "pending_changes": lag.pending if lag else 0,
                "windows": report.windows,
                "collapsed_updates": report.collapsed,
                "heartbeats": report.heartbeats,
                "reconnects": report.reconnects,
                "refused_records": report.refused_records,
                "messages_since_start": report.total_messages,
                "per_table": figures_table(per_table),
                "duration_seconds": round(report.seconds, 3),
            }
        )

    return publish_to_sink


def build_sink_lag_check(sink: str, keys: SourceKeys = UNNAMED):  # noqa: ANN201 - an AssetChecksDefinition
    @asset_check(
        asset=keys.sink_asset_key(sink),
        name="sink_lag",
        required_resource_keys=keys.resource_keys("lakehouse", "sinks", "cadence"),
        description=(
            f"How far the {sink} sink is behind the change logs: the age of the oldest change its broker has not "
            "acknowledged. Warns past CDC_SINK_LAG_WARN_SECONDS and fails past CDC_SINK_LAG_FAIL_SECONDS (default: "
            "the freshness windows), naming the tables behind. Runs after each publish and every minute (check_lag), "
            "so a sink whose broker is down is reported while its publish runs fail."
        ),
    )
    def sink_lag_check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        return AssetCheckResult(**sink_lag_verdict(sink, SourceResources(context, keys), time.time()))

    return sink_lag_check


def sink_lag_verdict(sink: str, used: SourceResources, now: float) -> dict[str, Any]:
    """The sink_lag check's verdict (passed, severity, description, metadata): what the check job records after a
    publish and what the binlog position sensor records, with no run, while the source is idle."""
    warn, fail = used.cadence.sink_lag_thresholds
    lag = sink_lag(used.sinks.settings(sink), used.lakehouse.get(), None, now)
    behind = ", ".join(f"{t} {s:.0f} s" for t, s in sorted(lag.tables.items(), key=lambda kv: -kv[1])[:10])
    return {
        "passed": lag.seconds < warn,
        "severity": AssetCheckSeverity.ERROR if lag.seconds >= fail else AssetCheckSeverity.WARN,
        "description": (
            f"{lag.pending} changes not yet acknowledged, the oldest {lag.seconds:.0f} s old ({behind})"
            if lag.pending
            else f"up to date with the change logs (warn after {warn:g} s)"
        ),
        "metadata": {
            "lag_seconds": round(lag.seconds, 1),
            "pending_changes": lag.pending,
            "tables_behind": figures_table({t: {"lag_seconds": round(s, 1)} for t, s in lag.tables.items()}),
            "warn_after_seconds": warn,
            "fail_after_seconds": fail,
        },
    }


def sink_lag_check_key(sink: str, keys: SourceKeys = UNNAMED) -> AssetCheckKey:
    return AssetCheckKey(keys.sink_asset_key(sink), "sink_lag")


def build_publish_job(sink: str, keys: SourceKeys = UNNAMED) -> Any:  # define_asset_job's (its class is not public)
    return define_asset_job(
        keys.publish_job(sink),
        selection=AssetSelection.assets(keys.sink_asset_key(sink)),
        tags=keys.sink_tags(sink),
        description=f"Publishes new changes of the change logs to the {sink} sink, then checks its lag.",
    )


def _why_wait(
    context: SensorEvaluationContext,
    lakehouse: LakehouseResource,
    sinks: SinksResource,
    sink: str,
    warn_minutes: float,
    keys: SourceKeys,
) -> str | None:
    """Why no publish run of `sink` (of the source `keys` names) is due now (None: request one); `warn_minutes`: the
    freshness warn window."""
    house = lakehouse.get()
    holder = read_holder(house, sink_lock_name(sink))
    if holder is not None:
        return f"publishing now ({holder.describe()})"
    instance = context.instance
    waiting = RunsFilter(tags={QUEUE_TAG: keys.sink_lane(sink)}, statuses=WAITING_STATUSES)
    if instance.get_runs(filters=waiting, limit=1):
        return "a publish run is waiting to start"
    now = time.time()
    job = keys.publish_job(sink)
    failed = instance.get_run_records(filters=RunsFilter(job_name=job, statuses=[DagsterRunStatus.FAILURE]), limit=1)
    latest = instance.get_run_records(filters=RunsFilter(job_name=job), limit=1)
    if failed and latest and failed[0].dagster_run.run_id == latest[0].dagster_run.run_id:
        ended = failed[0].end_time or failed[0].update_timestamp.timestamp()
        if now - ended < RETRY_AFTER_SECONDS:
            return f"its last publish run failed {now - ended:.0f} s ago; trying again after {RETRY_AFTER_SECONDS} s"
    changes = latest_change_log(instance, house, keys)
    published = instance.get_latest_materialization_event(keys.sink_asset_key(sink))
    if changes is not None and (published is None or changes > published.timestamp):
        return None  # the change logs took changes in since the last publish
    settings = sinks.settings(sink)
    if settings.heartbeat_seconds > 0:
        last_beat = load_checkpoint(house.store, sink).last_heartbeat_at
        if last_beat is None or now - last_beat >= settings.heartbeat_seconds:
            return None
    if published is None or now - published.timestamp >= warn_minutes * 60 / 2:
        return None  # confirms the sink is current, so freshness fails only when publishing stops
    return "no new changes in the change logs since the last publish"


def latest_change_log(instance: Any, house: Any, keys: SourceKeys) -> float | None:
    """When a change log of the lakehouse was last materialized (one query for all of them), or None."""
    logs = [keys.changes_asset_key(t) for t in known_tables(house.store)]
    records = instance.get_asset_records(logs) if logs else []
    times = [r.asset_entry.last_materialization.timestamp for r in records if r.asset_entry.last_materialization]
    return max(times, default=None)


def sensor_interval(sinks: list[str], settings: Settings) -> int:
    """As often as the raw-batch sensor, or as often as the shortest heartbeat when that is shorter."""
    beats = []
    for sink in sinks:
        try:
            beats.append(sink_settings(sink, settings.environment).heartbeat_seconds)
        except Exception:  # noqa: BLE001 - a bad value is reported by the sink's runs, with its fix
            continue
    shortest = min((b for b in beats if b > 0), default=SENSOR_INTERVAL_SECONDS)
    return max(1, int(min(SENSOR_INTERVAL_SECONDS, shortest)))


def build_sink_sensor(sinks: list[str], jobs: list[Any], settings: Settings, keys: SourceKeys = UNNAMED) -> SensorDefinition:
    @sensor(
        name=keys.qualified("sink_sensor"),
        jobs=jobs,
        required_resource_keys=keys.resource_keys("lakehouse", "sinks"),
        minimum_interval_seconds=sensor_interval(sinks, settings),
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "For each configured sink, requests a publish run when the change logs took changes in since its last "
            "publish, when a heartbeat is due (CDC_SINK_HEARTBEAT_SECONDS), or to confirm it is current (freshness). "
            "Skips a sink while it publishes or a run of it waits, and for a minute after a failed run (broker down)."
        ),
    )
    def sink_sensor(context: SensorEvaluationContext, **_given: Any) -> SensorResult | SkipReason:
        used = SourceResources(context, keys)
        requests, waiting = [], []
        for sink in configured:
            reason = _why_wait(context, used.lakehouse, used.sinks, sink, settings.cadence.freshness_warn_minutes, keys)
            if reason is None:
                requests.append(RunRequest(job_name=keys.publish_job(sink), tags=keys.sink_tags(sink)))
            else:
                waiting.append(f"{sink}: {reason}")
        if not requests:
            return SkipReason("; ".join(waiting))
        if waiting:
            context.log.info("; ".join(waiting))
        return SensorResult(run_requests=requests)

    configured = list(sinks)
    return sink_sensor
