"""Runs of the code location's jobs on the persistent instance in DAGSTER_HOME (what `cdc-lakehouse` drives, so
`make dev` shows its runs), and the read-only views the CLI prints: verify and status. Each command is given the
settings the CLI built (core.settings.Settings: the environment with its flags over it); its runs' definitions and
resources are built from them (defs/code_location.build_definitions), so a flag reaches the runs without the
environment."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetCheckSeverity, AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from cdc_assets.capture.run import capture_lag, preflight
from cdc_assets.core.errors import CdcUserError, unreachable_message, unreachable_reason
from cdc_assets.core.settings import Settings
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.continuous import ALIVE_STATUSES, CONTINUOUS_OP, stop_followers
from cdc_assets.defs.keys import (
    CONTINUOUS_JOB,
    REPAIR_JOB,
    SNAPSHOT_JOB,
    SYNC_JOB,
    SourceKeys,
    publish_job_name,
)
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.defs.sinks import configured_sinks
from cdc_assets.defs.sync import SYNC_OP
from cdc_assets.lake.quarantine import quarantined_tables
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import known_tables
from cdc_assets.runtime.collector import freeze_imported
from cdc_assets.runtime.instance import ensure_dagster_home, open_instance
from cdc_assets.sinks.checkpoint import load_checkpoint as load_sink_checkpoint
from cdc_assets.sinks.lag import sink_lag
from cdc_assets.sinks.publish import check_sink
from cdc_assets.stages.follow import continuous_holder, continuous_owner, refuse_beside_continuous
from cdc_assets.stages.history.as_of import export_as_of
from cdc_assets.stages.snapshot.records import snapshots_in_progress
from cdc_assets.verification.compare import tables_to_verify
from cdc_assets.verification.consistency import ConsistentComparison, verify_tables
from cdc_assets.verification.lag import table_lags
from cdc_assets.verification.quarantined import comparing_all_but_quarantined

_instances: dict[str, DagsterInstance] = {}


def instance() -> DagsterInstance:
    """The persistent Dagster instance of the lakehouse's home (the one its command chose: `ensure_dagster_home` with
    the settings' lakehouse), opened once per process and kept open (the instance of a home this process used before,
    for another lakehouse, is closed)."""
    home = ensure_dagster_home()  # a new home gets the cached empty databases
    if str(home) not in _instances:
        for other in list(_instances):
            _instances.pop(other).dispose()
        _instances[str(home)] = open_instance(home)  # a user's own instance that cannot open: one sentence
    return _instances[str(home)]


def connections_kept_open(dagster: DagsterInstance) -> AbstractContextManager[Any]:
    """The event log's SQLite connections kept open for the length of a run, when it is ours (cdc_assets.runtime.event_log:
    a run's events each opened and closed its database otherwise); a user's own dagster.yaml may name another."""
    keep = getattr(dagster.event_log_storage, "connections_kept_open", None)
    return keep() if keep is not None else nullcontext()


@dataclass
class RunOutcome:
    """What one or more runs of one source did: success, each asset's materialization metadata (by the asset's path
    below the source's name, `raw_binlog_batches`, `current/shop/orders`, whatever the source's name), the checks
    that failed."""

    success: bool
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed_checks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    user_errors: list[str] = field(default_factory=list)  # sinks that could not publish: one sentence each
    # checks that failed as warnings: a table not compared this time (something in flight past the run's capture),
    # with the reason; never counted as passing, not a failure of the run either (the next run compares it)
    warnings: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # tables held back (lake/quarantine): one sentence each

    def of(self, asset: AssetKey) -> dict[str, Any]:
        """The materialization metadata of `asset` in these runs (empty when they did not materialize it)."""
        return self.metadata.get(asset.to_user_string(), {})

    def totals(self, prefix: str, changed_by: str) -> dict[str, Any]:
        """The numbers of every `prefix/<schema>/<table>` materialization of these runs added up, with `tables` (how
        many) and `tables_changed` (how many with a `changed_by` above 0)."""
        layer = [v for k, v in self.metadata.items() if k.startswith(f"{prefix}/")]
        totals: dict[str, Any] = {"tables": len(layer), "tables_changed": sum(1 for v in layer if v.get(changed_by))}
        for values in layer:
            for key, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and key != "delta_version":
                    totals[key] = totals.get(key, 0) + value
        return totals

    def of_observation(self, asset: AssetKey, description: str) -> dict[str, Any]:
        """The metadata of the runs' observation of `asset` described so (empty when there was none)."""
        return self.metadata.get(f"{asset.to_user_string()}:{description}", {})

    def __add__(self, later: RunOutcome) -> RunOutcome:
        """Two runs' outcomes as one: numbers added, per-table details merged."""
        metadata = {k: dict(v) for k, v in self.metadata.items()}
        for asset, values in later.metadata.items():
            merged = metadata.setdefault(asset, {})
            for key, value in values.items():
                old = merged.get(key)
                if isinstance(value, dict) and isinstance(old, dict):
                    merged[key] = {**old, **value}
                elif isinstance(value, int | float) and isinstance(old, int | float) and not isinstance(value, bool):
                    merged[key] = old + value
                else:
                    merged[key] = value
        return RunOutcome(
            self.success and later.success,
            metadata,
            self.failed_checks + later.failed_checks,
            self.seconds + later.seconds,
            self.user_errors + later.user_errors,
            self.warnings + later.warnings,
            list(dict.fromkeys(self.quarantined + later.quarantined)),
        )


def _user_error_message(error: Any) -> str | None:
    """The sentence of the CdcUserError behind a Dagster step failure (walking the error's causes)."""

    def subclasses(cls: type) -> set[str]:
        return {cls.__name__}.union(*(subclasses(c) for c in cls.__subclasses__()))

    user_errors = subclasses(CdcUserError)
    while error is not None:
        if getattr(error, "cls_name", None) in user_errors:
            message = str(getattr(error, "message", "")).strip()
            prefixes = tuple(user_errors) + ("cdc_assets.",)
            return message.split(": ", 1)[1] if message.startswith(prefixes) else message
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    return None


def _unreachable_store(error: Any) -> str | None:
    """Why a step failed on an object store that stayed down through every retry (None: it failed otherwise), for
    failures outside the stages' own translation (an asset check reading a Delta table, say)."""
    while error is not None:
        reason = unreachable_reason({str(getattr(error, "cls_name", ""))}, str(getattr(error, "message", "")))
        if reason:
            return reason
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    return None


def _root_cause(error: Any) -> str:
    """The innermost error of a step failure: Dagster's own wrapper ("Error occurred while executing op") says
    nothing of what went wrong; the full chain stays in the run's event log."""
    if error is None:
        return "failed"
    while (getattr(error, "cause", None) or getattr(error, "context", None)) is not None:
        error = error.cause or error.context
    return str(error.message).strip().splitlines()[0]


def run_job(
    settings: Settings,
    job_name: str,
    verbose: bool = False,
    op_config: dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    partition_key: str | None = None,
    check_source: bool = True,
    run_id: str | None = None,
) -> RunOutcome:
    """One run of a job of the source's definitions on the persistent instance; raises CdcUserError for what a user can
    fix. `job_name`: the job's own name (`sync`), which the source's name qualifies (`orders_db__sync`).
    `check_source=False` for runs that never read the source (a sink publishes from the lakehouse alone)."""
    ensure_dagster_home(settings.lakehouse.location)
    resources = initialized_resources(settings)
    if check_source:
        preflight(resources.binlog.settings())  # what the user can fix is said before any run starts
    resources.lakehouse.get().check_writable()
    keys = SourceKeys(settings.name)
    job = build_definitions(settings, table_assets=False).resolve_job_def(keys.job(job_name))
    began = time.monotonic()
    # verbose: the pipeline's progress messages, never Dagster's events (a failure's stack trace stays in the run)
    loggers = {"progress": {}} if verbose else {"console": {"config": {"log_level": "CRITICAL"}}}
    run_config: dict[str, Any] = {"loggers": loggers}
    if op_config:
        run_config["ops"] = op_config
    freeze_imported()  # Dagster and the job built: what the run's own objects are collected apart from
    with connections_kept_open(instance()):
        result = job.execute_in_process(
            instance=instance(),
            run_config=run_config,
            raise_on_error=False,
            tags={"cdc/trigger": "cli", **(tags or {})},
            partition_key=partition_key,
            run_id=run_id,
        )
    failures = []
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_FAILURE:
            error = event.step_failure_data.error
            user_message = _user_error_message(error)
            if user_message:
                raise CdcUserError(user_message)
            down = _unreachable_store(error)
            if down:
                lakehouse = resources.lakehouse.get()
                raise CdcUserError(unreachable_message(str(lakehouse), lakehouse.endpoint, down))
            failures.append(f"{event.step_key}: {_root_cause(error)}")
    metadata = {}
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            metadata[_own_name(keys, materialization.asset_key)] = {
                k: getattr(v, "value", v) for k, v in materialization.metadata.items()
            }
        elif event.event_type == DagsterEventType.ASSET_OBSERVATION:  # what a run found (a repair), by its description
            observation = event.asset_observation_data.asset_observation
            metadata[f"{_own_name(keys, observation.asset_key)}:{observation.description}"] = {
                k: getattr(v, "value", v) for k, v in observation.metadata.items()
            }
    evaluations = [e for e in result.get_asset_check_evaluations() if not e.passed]
    failed_checks = [
        f"{e.asset_key.to_user_string()}:{e.check_name}" for e in evaluations if e.severity != AssetCheckSeverity.WARN
    ]
    warnings = [e.description or e.check_name for e in evaluations if e.severity == AssetCheckSeverity.WARN]
    return RunOutcome(
        result.success and not failed_checks, metadata, failed_checks + failures, time.monotonic() - began,
        warnings=sorted(set(warnings)),
    )  # fmt: skip


def _own_name(keys: SourceKeys, key: AssetKey) -> str:
    """An asset's name as RunOutcome keeps it: its path below the source's name (the whole key of another's)."""
    path = keys.own_path(key)
    return key.to_user_string() if path is None else AssetKey(path).to_user_string()


def run_sync(settings: Settings, verbose: bool = False, run_id: str | None = None) -> RunOutcome:
    """One run of the `sync` job (capture, then the touched tables' change logs and current state, with the checks
    of all three), then a publish run per configured sink. `run_id`: the sync run's id, chosen before a capture
    was forked for it (cdc_assets.runtime.forked_capture)."""
    lakehouse = initialized_resources(settings).lakehouse.get()
    refuse_beside_continuous(lakehouse)
    outcome = run_job(settings, SYNC_JOB, verbose, run_id=run_id)
    outcome.quarantined = [q.sentence() for q in quarantined_tables(lakehouse.store).values()]
    if configured_sinks(settings):
        outcome = outcome + run_publish(settings, None, verbose)
    return outcome


def run_repair(settings: Settings, tables: list[str], verbose: bool = False) -> RunOutcome:
    """A `sync` run that repairs `tables` first (`cdc-lakehouse repair`): their differing rows written as `repair`
    changes, applied and checked with everything else the run captures."""
    refuse_beside_continuous(initialized_resources(settings).lakehouse.get())
    return run_job(settings, REPAIR_JOB, verbose, {SYNC_OP: {"config": {"repair": tables}}})


def run_publish(settings: Settings, sinks: list[str] | None = None, verbose: bool = False) -> RunOutcome:
    """A publish run per sink (default: every configured one), each on its own: a sink that cannot publish is
    recorded in `user_errors` (its checkpoint unmoved) and the others go on."""
    configured = configured_sinks(settings)
    names = list(dict.fromkeys(sinks)) if sinks else configured
    if not names:
        raise CdcUserError(
            "No sink is configured: set CDC_RABBITMQ_URL or CDC_KINESIS_STREAM (see docs/sinks.md)."
        )
    resources = initialized_resources(settings)
    outcome = RunOutcome(True)
    for name in names:
        try:
            sink = resources.sinks.settings(name)  # unknown, not configured, badly configured: this sink only
            check_sink(sink)  # an unreachable broker, refused credentials, a missing destination: said before any run
            outcome = outcome + run_job(settings, publish_job_name(sink.name), verbose, check_source=False)  # its own name
        except CdcUserError as exc:
            outcome = outcome + RunOutcome(False, user_errors=[str(exc)])
    return outcome


def run_snapshot(settings: Settings, tables: list[str], verbose: bool = False) -> RunOutcome:
    """A snapshot run; its progress (tables or chunks read, rows) reaches the CLI's display, or with `verbose` its
    log lines are printed as they come."""
    refuse_beside_continuous(initialized_resources(settings).lakehouse.get())
    return run_job(settings, SNAPSHOT_JOB, verbose, {"snapshot_tables": {"config": {"tables": tables}}})


STOPPED = "continuous mode stopped"
STOP_WAIT_SECONDS = 300.0  # a stop waits this long for the cycle in progress (a long catch-up capture) to finish


@dataclass
class ContinuousOutcome:
    """How a continuous run ended: stopped on request (the normal end), or failed with what went wrong."""

    stopped: bool
    run_id: str
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_continuous(settings: Settings, poll_seconds: float | None = None, verbose: bool = False) -> ContinuousOutcome:
    """The continuous job in this process until it is stopped (`cdc-lakehouse stop`, the UI, Ctrl-C, SIGTERM).

    Refuses at once when another continuous mode holds the lakehouse; a batch run in progress is waited for (up
    to CDC_LOCK_WAIT_SECONDS) by the follower itself. Dagster turns SIGTERM and Ctrl-C into an interruption of the
    step; the op lets its follower finish the cycle in progress first, and the run ends as canceled.
    """
    ensure_dagster_home(settings.lakehouse.location)
    resources = initialized_resources(settings)
    preflight(resources.binlog.settings())
    lakehouse = resources.lakehouse.get()
    lakehouse.check_writable()
    refuse_beside_continuous(lakehouse)
    job = build_definitions(settings, table_assets=False).resolve_job_def(SourceKeys(settings.name).job(CONTINUOUS_JOB))
    loggers = {"progress": {}} if verbose else {"console": {"config": {"log_level": "CRITICAL"}}}
    run_config: dict[str, Any] = {"loggers": loggers}
    if poll_seconds is not None:
        run_config["ops"] = {CONTINUOUS_OP: {"config": {"poll_seconds": poll_seconds}}}
    began = time.monotonic()
    tags = {"cdc/trigger": "cli", "cdc/host": socket.gethostname(), "cdc/pid": str(os.getpid())}
    try:
        with connections_kept_open(instance()):
            result = job.execute_in_process(instance=instance(), run_config=run_config, raise_on_error=False, tags=tags)
    finally:
        stop_followers()  # an interruption Dagster raised outside the op leaves its follower to finish its cycle
    record = instance().get_run_by_id(result.run_id)
    stopped = record is not None and record.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.CANCELING)
    failures = []
    for event in result.all_events:
        if event.event_type != DagsterEventType.STEP_FAILURE:
            continue
        error = event.step_failure_data.error
        if _interrupted(error):
            stopped = True
            continue
        user_message = _user_error_message(error)
        if user_message:
            raise CdcUserError(user_message)
        failures.append(f"{event.step_key}: {_root_cause(error)}")
    return ContinuousOutcome(stopped and not failures, result.run_id, failures, time.monotonic() - began)


def _interrupted(error: Any) -> bool:
    while error is not None:
        if getattr(error, "cls_name", None) in ("DagsterExecutionInterruptedError", "KeyboardInterrupt"):
            return True
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    return False


LEFT_STARTED = (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def stop_continuous(settings: Settings, wait_seconds: float = STOP_WAIT_SECONDS) -> str:
    """Stop the continuous mode after its cycle in progress, and wait until it has: its runs are terminated (as
    from the UI; a run the CLI started in the foreground is also sent SIGTERM when it runs on this host)."""
    ensure_dagster_home(settings.lakehouse.location)
    lakehouse = initialized_resources(settings).lakehouse.get()
    dagster = instance()
    holder = continuous_holder(lakehouse)
    job = SourceKeys(settings.name).job(CONTINUOUS_JOB)
    runs = dagster.get_runs(filters=RunsFilter(job_name=job, statuses=ALIVE_STATUSES))
    if holder is None and not runs:
        return "continuous mode is not running"
    for run in runs:
        if holder is None and run.status in (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING):
            dagster.report_run_canceled(run, message="Its process is gone (it holds no lock).")
            continue
        if run.status == DagsterRunStatus.STARTED:
            dagster.report_run_canceling(run, message="Stop requested by `cdc-lakehouse stop`.")
        if run.tags.get("cdc/trigger") != "cli":
            dagster.run_coordinator.cancel_run(run.run_id)
    if holder is not None and holder.host == socket.gethostname() and holder.pid > 0 and not runs:
        os.kill(holder.pid, signal.SIGTERM)  # a continuous mode whose run this instance does not know
    deadline = time.monotonic() + wait_seconds
    held_by = {run.run_id for run in runs if holder is not None and holder.owner == continuous_owner(run.run_id)}
    while True:
        holding = continuous_holder(lakehouse) is not None
        unfinished = [r for run in runs if (r := dagster.get_run_by_id(run.run_id)) is not None and not r.is_finished]
        if not holding:
            # The lock is free: a run that never held it and is still STARTED died without a word (SIGKILL, a lost
            # host) beside the one that did; nothing but this will ever end it. (The holder's own run is left to
            # record its own end.)
            dead = [r for r in unfinished if r.run_id not in held_by and r.status in LEFT_STARTED]
            for run in dead:
                dagster.report_run_canceled(run, message="Its process is gone (it holds no lock).")
            unfinished = [r for r in unfinished if r not in dead]
        if not holding and not unfinished:
            break
        if time.monotonic() > deadline:
            raise CdcUserError(
                f"The continuous mode did not stop within {wait_seconds:g} s (a long cycle is still finishing): run "
                "`cdc-lakehouse stop` again later, or look at its run in the UI."
            )
        time.sleep(0.2)
    return STOPPED


def run_export(settings: Settings, table: str, point: str, destination: str) -> int:
    """`cdc-lakehouse export`: a table as of a point (a time or seq:N) to a Parquet file; the rows written."""
    return export_as_of(initialized_resources(settings).lakehouse.get(), table, point, destination)


def run_verify(settings: Settings, tables: list[str] | None = None) -> list[ConsistentComparison]:
    """Current-state tables compared with the source at one consistent point (`cdc-lakehouse verify`)."""
    resources = initialized_resources(settings)
    source, lakehouse = resources.binlog.settings(), resources.lakehouse.get()
    return comparing_all_but_quarantined(
        lakehouse, tables_to_verify(lakehouse, tables), lambda kept: verify_tables(source, lakehouse, [str(t) for t in kept])
    )


@dataclass(frozen=True)
class Status:
    """`cdc-lakehouse status`: the checkpoint, lag, tables and freshness."""

    lakehouse: str
    checkpoint: str | None
    binlog_end: str
    lag_bytes: int
    lag_seconds: float
    next_seq: int | None
    gtid: str | None  # at the checkpoint: MySQL's executed GTID set, MariaDB's last GTID of each domain
    tables: list[str]
    table_lag_seconds: dict[str, float]
    freshness_windows_minutes: dict[str, float]  # warn, fail
    raw_batches: int
    last_batch: str | None
    seconds_since_materialized: dict[str, float | None]  # per asset; None: never materialized
    snapshots_in_progress: dict[str, dict[str, int]]  # per table stopped mid-way: chunks read of chunks, rows
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)  # per configured sink: destination, seq, lag
    quarantined: dict[str, str] = field(default_factory=dict)  # per quarantined table: its sentence (cause and fix)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def collect_status(settings: Settings) -> Status:
    ensure_dagster_home(settings.lakehouse.location)
    resources = initialized_resources(settings)
    lakehouse = resources.lakehouse.get()
    now = time.time()
    lag = capture_lag(resources.binlog.settings(), lakehouse, now)
    checkpoint = lag.checkpoint
    batches = list_batches(lakehouse.store)
    freshness: dict[str, float | None] = {}
    sinks: dict[str, dict[str, Any]] = {}
    for name in configured_sinks(settings):
        sink = resources.sinks.settings(name)
        sent = load_sink_checkpoint(lakehouse.store, name)
        behind = sink_lag(sink, lakehouse, sent, now)
        sinks[name] = {
            "destination": sink.destination,
            "last_seq": sent.last_seq,
            "messages": sent.messages,
            "lag_seconds": round(behind.seconds, 1),
            "pending_changes": behind.pending,
        }
    own = SourceKeys(settings.name)
    keys = [
        own.raw_asset,
        *(own.table_asset_key(t) for t in known_tables(lakehouse.store)),
        *(own.sink_asset_key(n) for n in sinks),
    ]
    last = {r.asset_entry.asset_key: r.asset_entry.last_materialization for r in instance().get_asset_records(keys)}
    for key in keys:  # one query for every asset: the raw batches, each table's current state, each sink
        event = last.get(key)
        freshness[key.to_user_string()] = None if event is None else round(time.time() - event.timestamp, 1)
    warn, fail = settings.cadence.freshness_windows
    return Status(
        lakehouse=str(lakehouse),
        checkpoint=str(checkpoint.position) if checkpoint else None,
        binlog_end=str(lag.binlog_end),
        lag_bytes=lag.lag_bytes,
        lag_seconds=round(lag.seconds, 1) if checkpoint else 0.0,
        next_seq=checkpoint.next_seq if checkpoint else None,
        gtid=checkpoint.gtid if checkpoint else None,
        tables=known_tables(lakehouse.store),
        quarantined={t: q.sentence() for t, q in quarantined_tables(lakehouse.store).items()},
        table_lag_seconds={t: round(v, 1) for t, v in table_lags(lakehouse, lag.seconds, now).items()},
        freshness_windows_minutes={"warn": warn, "fail": fail},
        raw_batches=len(batches),
        last_batch=batches[-1] if batches else None,
        seconds_since_materialized=freshness,
        snapshots_in_progress={
            str(r.table): {"chunks_read": len(r.done), "chunks": r.chunks, "rows": r.rows}
            for r in snapshots_in_progress(lakehouse.store)
        },
        sinks=sinks,
    )
