"""Sensors: on new raw batches, which it turns into one run of exactly the tables the batches touched (their change
logs and current state, in the `apply_changes` job); and, when CDC_CAPTURE_INTERVAL_SECONDS is set, on the binlog
itself, capturing continuously instead of on the cron. Both run in the schedule mode (CDC_CAPTURE_CRON or
CDC_CAPTURE_INTERVAL_SECONDS set); by default Dagster's automation updates the tables (defs/automation.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import pymysql
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from cdc_assets.capture.run import capture_lag
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import CadenceSettings, WebserverAddress
from cdc_assets.defs.assets.tables import DATA_VERSION_TAG, confirmations
from cdc_assets.defs.automation import BINLOG_POSITION, update_minutes
from cdc_assets.defs.jobs import NEW_TABLES_OP
from cdc_assets.defs.keys import APPLY_JOB, CAPTURE_JOB, CAPTURE_LANE, NEW_TABLES_JOB, SYNC_LANE, UNNAMED, SourceKeys
from cdc_assets.defs.resources import LakehouseResource, SourceResources
from cdc_assets.defs.sinks import sink_lag_verdict
from cdc_assets.defs.table_checks import LAG_CHECK, lag_verdicts
from cdc_assets.lake.layout import CURRENT_STAGE
from cdc_assets.lake.raw_batches import list_batches, read_manifest
from cdc_assets.lake.state import load_progress, load_registry, needs_work, tables_behind
from cdc_assets.lake.store import ObjectStore
from cdc_assets.runtime.instance import QUEUE_TAG
from cdc_assets.runtime.queue import WAITING_STATUSES, capture_in_progress
from cdc_assets.runtime.reload import reload_code_location
from cdc_assets.source.server import DemoServerNotRunning
from cdc_assets.stages.follow import continuous_holder
from cdc_assets.verification.lag import table_lags

MAX_BATCHES_PER_TICK = 500
RETRY_AFTER_SECONDS = 300  # a table left behind is requested again at most this often


def sensor_interval_seconds(cadence: CadenceSettings) -> int:
    """The raw-batch sensor looks every 15 s, or as often as the binlog sensor when capture runs continuously."""
    return int(min(15, cadence.capture_interval_seconds or 15))


def table_keys(tables: list[str], keys: SourceKeys = UNNAMED) -> list[AssetKey]:
    """The change log and current state of each table."""
    return [key for t in sorted(tables) for key in (keys.changes_asset_key(t), keys.table_asset_key(t))]


def apply_run_request(tables: list[str], run_key: str, keys: SourceKeys = UNNAMED) -> RunRequest:
    """One run of the apply job for exactly `tables`."""
    return RunRequest(run_key=run_key, asset_selection=table_keys(tables, keys))


def current_tables_of(selected: list[AssetKey], keys: SourceKeys = UNNAMED) -> list[str]:
    """The tables of the source `keys` names whose current state is among `selected` (what a run of this sensor
    applies)."""
    return sorted(t for k in selected if keys.is_current(k) and (t := keys.table_of_key(k)) is not None)


def _confirmation(
    context: SensorEvaluationContext, tables: list[str], lag_warn_seconds: float, keys: SourceKeys
) -> RunRequest | None:
    """A run over every table when capture keeps succeeding but no table changed for a while.

    Freshness is judged by each table's last materialization; without changes to apply it would go stale although
    it is current. After each successful capture that found the source quiet, the apply job confirms every table is
    up to date, so freshness fails only when capture itself stops.
    """
    if not tables:
        return None
    raw = context.instance.get_latest_materialization_event(keys.raw_asset)
    records = context.instance.get_asset_records([keys.table_asset_key(t) for t in tables])
    times = [r.asset_entry.last_materialization.timestamp for r in records if r.asset_entry.last_materialization]
    current = min(times) if len(times) == len(tables) else None
    if raw is None or (current is not None and current >= raw.timestamp):
        return None
    if current is not None and time.time() - current < lag_warn_seconds / 2:
        return None
    return apply_run_request(tables, f"confirm-current-{raw.timestamp:.3f}", keys)


def build_raw_batch_sensor(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> SensorDefinition:
    """The raw-batch sensor of the source `keys` names, running in the schedule mode (`cadence`: read when the
    definitions load)."""

    def raw_batch_sensor(context: SensorEvaluationContext, **_given: Any) -> SensorResult | SkipReason:
        return raw_batches_tick(context, SourceResources(context, keys).lakehouse, cadence.lag_warn_seconds, keys)

    return sensor(
        name=keys.qualified("raw_batch_sensor"),
        job_name=keys.job(APPLY_JOB),
        required_resource_keys=keys.resource_keys("lakehouse"),
        minimum_interval_seconds=sensor_interval_seconds(cadence),
        default_status=DefaultSensorStatus.RUNNING if cadence.schedule_mode else DefaultSensorStatus.STOPPED,
        description=(
            "Schedule mode: watches raw/ in the lakehouse (local or S3) for batches after its cursor (the last batch "
            "name it handled) and requests one run of exactly the tables those batches touched (their change logs and "
            "current state). When capture succeeds but nothing changed, it confirms every table as current. Running "
            "when CDC_CAPTURE_CRON or CDC_CAPTURE_INTERVAL_SECONDS is set; by default the automation sensor updates "
            "the tables."
        ),
    )(raw_batch_sensor)


def raw_batches_tick(
    context: SensorEvaluationContext, lakehouse: LakehouseResource, lag_warn_seconds: float, keys: SourceKeys
) -> SensorResult | SkipReason:
    """One look at raw/: a run of the tables new batches touched, or the quiet tables' confirmation once their last
    update is half `lag_warn_seconds` old."""
    house = lakehouse.get()
    store = house.store
    holder = continuous_holder(house)
    if holder is not None:  # it applies its batches itself: move past them, so none is applied again later
        names = list_batches(store, after=context.cursor or None)
        reason = f"The continuous mode is running ({holder.describe()}) and applies every batch itself."
        return SensorResult(skip_reason=reason, cursor=names[-1] if names else context.cursor)
    names = list_batches(store, after=context.cursor or None)[:MAX_BATCHES_PER_TICK]
    registry = load_registry(store)
    declared = _declared(context, keys)
    touched: set[str] = set()
    for name in names:
        touched.update(read_manifest(store, name).tables())
    behind = _left_behind(store, registry, context.cursor or None, touched)
    undeclared = sorted((touched | behind) - declared) if declared is not None else []
    if undeclared:  # captured since the definitions loaded: the new-tables sensor applies them
        context.log.info(f"{len(undeclared)} tables have no asset until the definitions reload: {', '.join(undeclared[:10])}")
    if declared is not None:
        touched, behind = touched & declared, behind & declared
    retry_key = f"retry:{int(time.time() // RETRY_AFTER_SECONDS)}"
    retries = [apply_run_request(sorted(behind), retry_key, keys)] if behind else []
    if not names:
        tables = sorted(t for t in registry if declared is None or t in declared)
        confirmation = _confirmation(context, tables, lag_warn_seconds, keys) if not retries else None
        if confirmation is None and not retries:
            return SkipReason(f"No raw batch after {context.cursor or 'the start'}.")
        return SensorResult(run_requests=[confirmation] if confirmation else retries)
    last = names[-1]
    waiting = _waiting_tables(context, keys)
    wanted = sorted(touched - waiting)
    runs = [apply_run_request(wanted, f"{last}:{len(wanted)}", keys)] if wanted else []
    context.log.info(
        f"{len(names)} new raw batches up to {last}: {len(touched)} tables in one run"
        + (f" ({len(touched & waiting)} tables left to apply runs waiting to start)" if touched & waiting else "")
        + (f"; {len(behind)} tables left behind by earlier runs requested again" if behind else "")
    )
    return SensorResult(run_requests=runs + retries, cursor=last)


def build_new_tables_sensor(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> SensorDefinition:
    """Applies the tables captured since the definitions loaded (in every mode but the continuous one, which
    applies everything itself): they have no asset the automation or the raw-batch sensor could select. With
    CDC_DAGSTER_WEBSERVER it also has the code location reloaded, which shows their assets."""
    webserver = cadence.webserver

    @sensor(
        name=keys.qualified("new_tables_sensor"),
        job_name=keys.job(NEW_TABLES_JOB),
        required_resource_keys=keys.resource_keys("lakehouse"),
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED if cadence.continuous else DefaultSensorStatus.RUNNING,
        description=(
            "Requests a run of apply_new_tables for the tables captured since the definitions loaded, with changes "
            "pending: no asset of theirs can be selected until the code location reloads, which shows them. With "
            "CDC_DAGSTER_WEBSERVER set it asks that webserver to reload the code location once for them."
        ),
    )
    def new_tables_sensor(context: SensorEvaluationContext, **_given: Any) -> SensorResult:
        declared = _declared(context, keys)
        if declared is None:
            return SensorResult(skip_reason="Evaluated outside the definitions: no declared tables to compare with.")
        house = SourceResources(context, keys).lakehouse.get()
        holder = continuous_holder(house)
        if holder is not None:
            return SensorResult(
                skip_reason=f"The continuous mode is running ({holder.describe()}) and applies every table itself."
            )
        registry = load_registry(house.store)
        undeclared = sorted(t for t in registry if t not in declared)
        reloaded, cursor = _reload_for(context, webserver, undeclared)
        new = [t for t in undeclared if needs_work(registry[t], load_progress(house.store, CURRENT_STAGE, t))]
        if not new:
            return SensorResult(skip_reason=" ".join(["Every table with changes pending has its assets.", reloaded]).strip(), cursor=cursor)
        job = keys.job(NEW_TABLES_JOB)
        if context.instance.get_runs(filters=RunsFilter(job_name=job, statuses=WAITING_STATUSES), limit=1):
            return SensorResult(skip_reason=f"A run of {job} waits to start. {reloaded}".strip(), cursor=cursor)
        context.log.info(f"{len(new)} tables captured since the definitions loaded: {', '.join(new[:10])}. {reloaded}")
        return SensorResult(run_requests=[RunRequest(run_config={"ops": {NEW_TABLES_OP: {"config": {"tables": new}}}})], cursor=cursor)

    return new_tables_sensor


def _reload_for(
    context: SensorEvaluationContext, webserver: WebserverAddress | None, undeclared: list[str]
) -> tuple[str, str | None]:
    """Have the code location reloaded for tables the registry has and the definitions do not, once per set of them
    (the cursor), again after RETRY_AFTER_SECONDS when they are still missing: a deployed code server whose state
    file a reload does not refresh would otherwise be reloaded every tick. What was done, as a sentence; the cursor."""
    if not undeclared:
        return "", None
    if webserver is None:
        return "Reload the code location to see their assets (or set CDC_DAGSTER_WEBSERVER).", context.cursor
    wanted = ",".join(undeclared)
    last = json.loads(context.cursor) if context.cursor and context.cursor.startswith("{") else {}
    if last.get("tables") == wanted and time.time() - float(last.get("at", 0)) < RETRY_AFTER_SECONDS:
        return (
            f"The code location was reloaded for {len(undeclared)} tables at {time.strftime('%H:%M:%S', time.gmtime(last['at']))} "
            "UTC and still has no assets for them: refresh its state (`dg utils refresh-defs-state`).",
            context.cursor,
        )
    origin = context.code_location_origin
    if origin is None:
        return "No code location to reload (evaluated outside a code server).", context.cursor
    failed = reload_code_location(webserver, origin.location_name)
    cursor = json.dumps({"tables": wanted, "at": time.time()})
    if failed is not None:
        context.log.warning(failed)
        return f"Not reloaded: {failed}.", cursor
    return f"Reloaded the code location {origin.location_name} for {', '.join(undeclared[:10])}.", cursor


def _declared(context: SensorEvaluationContext, keys: SourceKeys) -> set[str] | None:
    """The tables of the source the loaded definitions have assets for (None when the sensor runs outside them, in a
    test)."""
    repository = getattr(context, "repository_def", None)
    if repository is None:
        return None
    return set(current_tables_of(list(repository.asset_graph.get_all_asset_keys()), keys))


def _waiting_tables(context: SensorEvaluationContext, keys: SourceKeys) -> set[str]:
    """Tables of apply runs queued and not started yet: such a run takes in every change captured before it
    starts, so another run for them behind it would only queue up (under steady load the queue would grow)."""
    runs = context.instance.get_runs(
        filters=RunsFilter(job_name=keys.job(APPLY_JOB), statuses=WAITING_STATUSES), limit=MAX_BATCHES_PER_TICK
    )
    waiting: set[str] = set()
    for run in runs:
        waiting.update(current_tables_of(list(run.asset_selection or []), keys))
    return waiting


def _left_behind(store: ObjectStore, registry: dict, cursor: str | None, touched: set[str]) -> set[str]:
    """Tables whose batches the sensor already handled but whose current state has not taken them in: their
    run failed, or ran before capture had registered the table. Requested again at most every few minutes."""
    if cursor is None:
        return set()
    behind = tables_behind(store, CURRENT_STAGE, registry)
    return {t for t in behind if t not in touched and str(registry[t]["last_batch"]) <= cursor}


def capture_due(lag_bytes: int, last_capture: float | None, now: float, confirm_every: float) -> str | None:
    """Why the binlog sensor requests a capture now, or None: the binlog grew, or the source has been quiet
    for `confirm_every` seconds since the last capture (or none is recorded) and the quiet tables are due to be
    confirmed current."""
    if lag_bytes:
        return f"the binlog is {lag_bytes} bytes past the checkpoint"
    if last_capture is None:
        return "no capture recorded yet: one confirms the quiet tables current"
    if now - last_capture >= confirm_every:
        return f"nothing new in the binlog for {now - last_capture:.0f}s: a capture confirms the quiet tables current"
    return None


def build_binlog_sensor(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> SensorDefinition:
    """Capture whenever the binlog has grown past the checkpoint, looking every CDC_CAPTURE_INTERVAL_SECONDS
    (switched off when that is unset: capture then runs on the capture schedule's cron).

    A quiet source still gets a capture every quarter of the freshness warn window: the cron would have run
    one, and only a capture confirms the quiet tables up to date, so without it their freshness would warn
    although nothing is behind."""
    interval = cadence.capture_interval_seconds

    @sensor(
        name=keys.qualified("binlog_sensor"),
        job_name=keys.job(CAPTURE_JOB),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse"),
        minimum_interval_seconds=int(interval or 30),
        default_status=DefaultSensorStatus.RUNNING if interval is not None else DefaultSensorStatus.STOPPED,
        description=(
            "Continuous capture: every CDC_CAPTURE_INTERVAL_SECONDS, requests a capture run when the source's binlog "
            "has grown past the checkpoint, and, on a quiet source, every quarter of the freshness warn window so the "
            "quiet tables are confirmed current. Skips while a capture holds the lakehouse's capture lock or waits "
            "to start. Running when CDC_CAPTURE_INTERVAL_SECONDS is set (the capture schedule is then off)."
        ),
    )
    def binlog_sensor(context: SensorEvaluationContext, **_given: Any) -> RunRequest | SkipReason:
        used = SourceResources(context, keys)
        house = used.lakehouse.get()
        busy = capture_in_progress(context.instance, house, keys.lane(CAPTURE_LANE))
        if busy:
            return SkipReason(busy)
        now = time.time()
        try:
            lag = capture_lag(used.binlog.settings(), house, now)
        except DemoServerNotRunning as exc:
            return SkipReason(f"{exc} No capture until it runs.")
        last = context.instance.get_latest_materialization_event(keys.raw_asset)
        reason = capture_due(lag.lag_bytes, last.timestamp if last else None, now, cadence.confirm_every_seconds)
        if reason is None:
            return SkipReason(f"The binlog ends at {lag.binlog_end}: nothing new to capture.")
        context.log.info(reason)
        return RunRequest()

    return binlog_sensor


BINLOG_POSITION_SENSOR = "binlog_position_sensor"
POSITION_SENSOR_SECONDS = 30
LAG_REPORT_SECONDS = 60  # how often the binlog position sensor records each table's lag check (no run)
SOURCE_SILENT = "unanswered"  # the binlog position's version while the source does not answer
_IN_PROGRESS = [*WAITING_STATUSES, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


@dataclass(frozen=True)
class PositionCursor:
    """What the binlog position sensor last did: the version of the binlog position it last recorded and when, and
    when it last recorded the tables' lag."""

    observed: str | None = None
    observed_at: float = 0.0
    lag_reported_at: float = 0.0

    @classmethod
    def read(cls, text: str | None) -> PositionCursor:
        try:
            values = json.loads(text) if text else {}
        except ValueError:
            values = {}
        return cls(values.get("observed"), float(values.get("observed_at", 0.0)), float(values.get("lag_reported_at", 0.0)))

    def text(self) -> str:
        return json.dumps({"observed": self.observed, "observed_at": self.observed_at, "lag_reported_at": self.lag_reported_at})


@dataclass(frozen=True)
class PositionTiming:
    """How often the binlog position sensor acts: `retry_seconds`, record an unchanged version again while its work
    is still undone (a capture that failed, a source that does not answer: the cadence of the capture's cron);
    `confirm_every`, confirm quiet tables older than this (a quarter of the tightest warn window); `lag_thresholds`,
    the lag check's (warn, fail) seconds."""

    retry_seconds: float
    confirm_every: float
    lag_thresholds: tuple[float, float]

    @classmethod
    def of(cls, warn_minutes: float, lag_thresholds: tuple[float, float]) -> PositionTiming:
        """For the tightest warn window: a record made again every half period of the capture's cron (at least every
        tick), so one the automation missed (its first evaluation reads no update) or a failed capture is retried by
        the next cron tick; quiet tables confirmed every quarter of the window."""
        retry = max(POSITION_SENSOR_SECONDS, update_minutes(warn_minutes) * 60 / 2)
        return cls(retry, warn_minutes * 60 / 4, lag_thresholds)


def build_binlog_position_sensor(
    cadence: CadenceSettings, timing: PositionTiming, keys: SourceKeys = UNNAMED, sinks: tuple[str, ...] = ()
) -> SensorDefinition:
    """The automation mode's look at the source, without a run: what lets an idle source launch none. `sinks`: the
    configured sinks, whose lag it records every minute too."""

    @sensor(
        name=keys.qualified(BINLOG_POSITION_SENSOR),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", *(("sinks", "cadence") if sinks else ())),
        minimum_interval_seconds=POSITION_SENSOR_SECONDS,
        default_status=DefaultSensorStatus.RUNNING if cadence.automation_on else DefaultSensorStatus.STOPPED,
        description=(
            "Automation mode: asks the source's binlog end (one cheap query) and compares it with the capture's "
            "checkpoint. When the binlog grew (or captured changes wait to be applied) it records "
            f"{keys.asset_key(BINLOG_POSITION).to_user_string()}, which the automation waits for before it requests a "
            "capture. While the source is idle it launches nothing and records, without a run, the quiet tables' "
            "confirmations (so their freshness holds) and every minute each table's lag check (and each sink's)."
        ),
    )
    def binlog_position_sensor(context: SensorEvaluationContext, **_given: Any) -> SensorResult:
        return binlog_position_tick(context, SourceResources(context, keys), timing, keys, sinks)

    return binlog_position_sensor


def binlog_position_tick(
    context: SensorEvaluationContext,
    used: SourceResources,
    timing: PositionTiming,
    keys: SourceKeys,
    sinks: tuple[str, ...] = (),
) -> SensorResult:
    """One look: a record of the binlog position when the capture has work, the quiet tables' confirmations when it
    has none, and the tables' lag every LAG_REPORT_SECONDS; a capture or apply run only ever comes from the
    automation, after such a record."""
    house = used.lakehouse.get()
    now = time.time()
    cursor = PositionCursor.read(context.cursor)
    declared = _declared(context, keys)
    lag_due = now - cursor.lag_reported_at >= LAG_REPORT_SECONDS
    events: list[AssetMaterialization | AssetCheckEvaluation] = []
    try:
        lag = capture_lag(used.binlog.settings(), house, now)
    except (CdcUserError, pymysql.err.MySQLError, OSError) as exc:  # a capture run tries, and fails saying why
        reason = f"The source did not answer: {exc}"
        tables = sorted(declared if declared is not None else load_registry(house.store))
        if lag_due:
            events += [_lag_not_compared(t, str(exc), keys) for t in tables]
        work: tuple[str, str] | None = (SOURCE_SILENT, reason)
        if isinstance(exc, DemoServerNotRunning):  # not started, not failing: no run until it is
            work, reason = None, f"{exc} No run until it runs."
    else:
        registry = load_registry(house.store)
        tables = sorted(t for t in registry if declared is None or t in declared)
        behind = sorted(t for t in tables_behind(house.store, CURRENT_STAGE, registry) if t in tables)
        end = str(lag.binlog_end)
        if lag.lag_bytes:
            work = (end, f"The binlog ends at {end}, {lag.lag_bytes} bytes past the checkpoint: a capture is due.")
        elif behind:
            work = (f"{end}+apply", f"Changes of {len(behind)} tables captured up to {end} wait to be applied.")
        else:
            work = None
            reason = f"The binlog ends at the checkpoint ({end}): nothing new, no run."
            confirmed = _quiet_confirmations(context, house, end, timing.confirm_every, now, keys)
            events += confirmed
            if confirmed:
                reason += f" Confirmed {sum(isinstance(e, AssetMaterialization) for e in confirmed)} assets up to date."
        if lag_due:
            events += _lag_evaluations(house, lag.seconds, now, tables, timing.lag_thresholds, events, keys)
    if work is not None:
        version, reason = work
        again = version == cursor.observed and now - cursor.observed_at < timing.retry_seconds
        busy = context.instance.get_runs(
            filters=RunsFilter(tags={QUEUE_TAG: keys.lane(SYNC_LANE)}, statuses=_IN_PROGRESS), limit=1
        )
        if busy:
            reason += f" Run {busy[0].run_id[:8]} of this source is {busy[0].status.value.lower()}: no new record."
        elif again:
            reason += " Recorded already: the automation requests the capture at its next cron tick."
        else:
            events.append(  # a materialization, not an observation: Dagster's automation reads an external asset's
                AssetMaterialization(  # materializations alone (an observation counts only on an observable asset)
                    keys.asset_key(BINLOG_POSITION),
                    description=reason,
                    metadata={"binlog_end": version},
                    tags={DATA_VERSION_TAG: version},
                )
            )
            cursor = replace(cursor, observed=version, observed_at=now)
            context.log.info(reason)
    if lag_due:
        events += _sink_lag_evaluations(used, sinks, now, keys)
        cursor = replace(cursor, lag_reported_at=now)
    return SensorResult(skip_reason=reason, cursor=cursor.text(), asset_events=events)


def _sink_lag_evaluations(used: SourceResources, sinks: tuple[str, ...], now: float, keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """Each sink's lag check, as the check job would record it, with no run; a sink whose state cannot be read is
    recorded as not compared, never passing."""
    evaluations = []
    for sink in sinks:
        try:
            verdict = sink_lag_verdict(sink, used, now)
        except (CdcUserError, OSError) as exc:
            verdict = {
                "passed": False,
                "severity": AssetCheckSeverity.WARN,
                "description": f"not compared: the {sink} sink's progress could not be read ({exc})",
                "metadata": {"compared": False},
            }
        evaluations.append(AssetCheckEvaluation(asset_key=keys.sink_asset_key(sink), check_name="sink_lag", **verdict))
    return evaluations


def _quiet_confirmations(
    context: SensorEvaluationContext, house: Any, end: str, confirm_every: float, now: float, keys: SourceKeys
) -> list[AssetMaterialization | AssetCheckEvaluation]:
    """What a capture would record on an idle source, without its run: the raw batches confirmed current (the
    checkpoint is the binlog end), and each quiet table's confirmation (tables.confirmations), each only once its
    last materialization is `confirm_every` old, so freshness holds while nothing changes."""
    events: list[AssetMaterialization | AssetCheckEvaluation] = []
    raw = context.instance.get_latest_materialization_event(keys.raw_asset)
    if raw is not None and now - raw.timestamp >= confirm_every:
        events.append(
            AssetMaterialization(
                keys.raw_asset,
                description=f"up to date: the binlog ends at the checkpoint, {end}",
                metadata={"unchanged": True, "batches": 0, "row_changes": 0, "up_to_date_through": end},
            )
        )
    try:
        events += confirmations(context.instance, house, end, confirm_every, now, keys=keys)
    except CdcUserError as exc:  # a corrupt progress file: the apply runs say so
        context.log.warning(f"no table confirmed up to date: {exc}")
    return events


def _lag_evaluations(
    house: Any,
    capture_seconds: float,
    now: float,
    tables: list[str],
    thresholds: tuple[float, float],
    recorded: list[Any],
    keys: SourceKeys,
) -> list[AssetCheckEvaluation]:
    """Each table's lag check, as a check job would record it (the tables whose confirmation carries one left out)."""
    done = {e.asset_key for e in recorded if isinstance(e, AssetCheckEvaluation) and e.check_name == LAG_CHECK}
    warn, fail = thresholds
    lags = table_lags(house, capture_seconds, now)
    return [
        v.evaluation(keys)
        for v in lag_verdicts(lags, tables, warn, fail)
        if v.table in tables and keys.table_asset_key(v.table) not in done
    ]


def _lag_not_compared(table: str, error: str, keys: SourceKeys) -> AssetCheckEvaluation:
    """A table's lag check while the source does not answer: not compared, so not passed (a warning)."""
    return AssetCheckEvaluation(
        asset_key=keys.table_asset_key(table),
        check_name=LAG_CHECK,
        passed=False,
        severity=AssetCheckSeverity.WARN,
        description=f"{table}: lag not compared: the source did not answer ({error})",
        metadata={"not_compared": error},
    )
