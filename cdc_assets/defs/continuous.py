"""The continuous mode in Dagster: one long-running run of the `continuous` job follows the binlog in one warm
process (the pipeline's driver run for ever, cdc_assets/pipeline/driver.py) and records each cycle as materializations of the same assets the batch runs
materialize, runs the equality check on a cadence, and stops between two cycles when the run is terminated (from
the UI, `cdc-lakehouse stop`, Ctrl-C or SIGTERM). A sensor starts it, and starts it again when it died.

The follower (the driver) runs in a thread of the op, which gathers each cycle's step reports into a `Cycle`; the op's
own thread turns what it did into Dagster events (a generator
yields only in the thread that runs it), watches the run's status for a termination and runs the checks. The
checks' equality comparisons run in a child process (runtime/check_process.py; in process for an S3 lakehouse): the
row-for-row comparison of a large table would otherwise hold the GIL for tens of seconds against the follower.
One check at a time; a stop waits for the one in progress (up to STOP_CHECK_WAIT_SECONDS) and records it.
"""

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetMaterialization,
    Config,
    DagsterExecutionInterruptedError,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
    sensor,
)
from pydantic import Field

from cdc_assets.capture.run import CaptureReport
from cdc_assets.core.settings import CadenceSettings
from cdc_assets.defs.assets.metadata import applied_figures, capture_metadata, changes_figures
from cdc_assets.defs.assets.tables import confirmations, table_materializations
from cdc_assets.defs.checks import lag, log_comparisons, schema_match
from cdc_assets.defs.keys import CONTINUOUS_JOB, UNNAMED, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.defs.table_checks import EQUALITY_CHECK, equality_verdicts
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.lake.table_facts import TableFacts
from cdc_assets.pipeline.driver import (
    CAPTURE,
    CHANGES,
    CURRENT,
    DEFAULT_POLL_SECONDS,
    Captured,
    ChangesLogged,
    CurrentApplied,
    CycleEnded,
    Forever,
    Idle,
    drive,
)
from cdc_assets.runtime.check_process import Answer, CheckProcessDied, ChildChecks, InProcessChecks, Request, checks_for
from cdc_assets.runtime.collector import freeze_imported
from cdc_assets.runtime.queue import WAITING_STATUSES
from cdc_assets.runtime.step_events import log_batch
from cdc_assets.stages.changes.plan import ChangesReport
from cdc_assets.stages.current.steps import CurrentReport
from cdc_assets.stages.follow import continuous_holder, continuous_owner

CONTINUOUS_SENSOR = "continuous_sensor"
CONTINUOUS_OP = "follow_binlog"  # its node in the continuous job, which a run's config names
RUN_STATUS_EVERY_SECONDS = 1.0  # how often the op looks whether its run is being terminated
# A run that started longer ago than the time it may wait for the locks of a batch run in progress (the
# lakehouse's lock wait) plus this, and still holds no lock, is taken for dead (killed with its process).
STARTUP_GRACE_SECONDS = 60.0
STOP_CHECK_WAIT_SECONDS = 20.0  # how long a stop waits for the check in progress before abandoning it (killing its child)
ALIVE_STATUSES = [*WAITING_STATUSES, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


# Followers alive in this process, so a run whose step was interrupted outside the op (Dagster raises a pending
# interrupt as the step resumes) still lets its follower finish the cycle it is in: see stop_followers().
_followers: dict[threading.Thread, threading.Event] = {}
_followers_mutex = threading.Lock()


def stop_followers(timeout: float | None = None) -> None:
    """Ask every follower of this process to stop after its cycle, and wait for it."""
    with _followers_mutex:
        followers = list(_followers.items())
    for _, stop in followers:
        stop.set()
    for thread, _ in followers:
        thread.join(timeout)


@dataclass
class Cycle:
    """What one cycle of the driver did, from its step reports: the capture, and the change logs and current-state
    tables it touched (with the facts of those it applied)."""

    number: int
    capture: CaptureReport | None = None
    changes: ChangesReport | None = None
    current: CurrentReport | None = None
    facts: dict[str, TableFacts] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    seconds: float = 0.0


def follow(
    settings: Any,
    house: Lakehouse,
    transforms: Any,
    until: Forever,
    on_cycle: Callable[[Cycle], None],
    on_idle: Callable[[str], None],
    owner: str,
    log: Any | None = None,
) -> None:
    """The driver run for ever (capture, change logs, current state each cycle), each cycle that did work handed to
    `on_cycle`, and the position an idle cycle found everything captured up to to `on_idle`."""
    cycle = Cycle(0)  # numbered when it ends
    steps = (CAPTURE, CHANGES, CURRENT)
    for step in drive(settings, house, owner=owner, steps=steps, until=until, transforms=transforms, log=log, blocking=False):
        if isinstance(step, Captured):
            cycle.capture = step.capture
        elif isinstance(step, ChangesLogged):
            cycle.changes = step.changes
        elif isinstance(step, CurrentApplied):
            cycle.current, cycle.facts = step.current, step.facts
        elif isinstance(step, CycleEnded):
            cycle.number, cycle.tables, cycle.seconds = step.number, step.tables, step.seconds
            on_cycle(cycle)
            cycle = Cycle(0)
        elif isinstance(step, Idle):
            if step.position is not None:
                on_idle(step.position)
            cycle = Cycle(0)


class ContinuousConfig(Config):
    poll_seconds: float = Field(
        default=DEFAULT_POLL_SECONDS, gt=0, description="How long an idle follower waits before it looks at the binlog again."
    )


@dataclass
class _Checks:
    """When the equality check is due, and which tables it owes a comparison; when the quiet tables were last
    confirmed up to date, and the binlog position the follower last found everything captured up to."""

    every: float
    full_every: float
    runner: ChildChecks | InProcessChecks
    keys: SourceKeys  # the source's: its events are recorded under its keys
    touched: set[str] = field(default_factory=set)
    last: float = field(default_factory=time.monotonic)
    last_full: float = field(default_factory=time.monotonic)
    confirm_every: float = field(kw_only=True)  # seconds: CadenceResource.confirm_every_seconds
    lag_thresholds: tuple[float, float] = field(kw_only=True)  # table_lag's warn and fail (CDC_LAG_WARN/FAIL_SECONDS)
    last_confirmed: float | None = None
    caught_up: str | None = None  # set by the follower's thread when idle (a plain assignment)
    recorded: Lakehouse | None = None  # the lakehouse the cycles' events read table metadata from (the op's thread)

    def confirm_due(self, now: float) -> bool:
        """Whether to look for quiet tables to confirm now (at most every `confirm_every` / 2 seconds)."""
        if self.last_confirmed is not None and now - self.last_confirmed < self.confirm_every / 2:
            return False
        self.last_confirmed = now
        return True

    def due(self, now: float) -> tuple[str, list[str]] | None:
        """('full', []) for every table, ('changed', tables) for the tables changed since the last one, or None."""
        if now - self.last_full >= self.full_every:
            self.last_full = self.last = now
            self.touched.clear()
            return "full", []
        if self.touched and now - self.last >= self.every:
            self.last = now
            tables, self.touched = sorted(self.touched), set()
            return "changed", tables
        return None


FOLLOW_DESCRIPTION = (
    "Continuous mode: follows the binlog in one warm process (capture, then the change logs and current state of "
    "the tables each batch touched), records each cycle as materializations of raw_binlog_batches and of the "
    "touched tables' `changes/<schema>/<table>` and `current/<schema>/<table>`, and evaluates each table's "
    "current_matches_source, current_schema_matches_source and table_lag every CDC_CHECK_INTERVAL_SECONDS (the "
    "tables changed) and CDC_FULL_CHECK_INTERVAL_SECONDS (every table). Holds "
    "the capture, change-log and current-state locks for its whole life; a termination stops it between cycles."
)


def follow_binlog(context: OpExecutionContext, config: ContinuousConfig, used: SourceResources) -> Iterator[Any]:
    """The continuous op's work, with the resources of its source (`used.keys`)."""
    cadence, transforms = used.cadence, used.transforms
    house = used.lakehouse.get()
    settings = used.binlog.settings()
    checks = _Checks(
        cadence.check_interval_seconds, cadence.full_check_interval_seconds, checks_for(settings, house), used.keys,
        confirm_every=cadence.confirm_every_seconds, lag_thresholds=cadence.lag_thresholds,
    )  # fmt: skip
    # The op thread's own copy, its tables kept open like the follower's (each copy is used by one thread and its
    # pool): the tables whose metadata each cycle records are read from the commits since, not opened afresh.
    checks.recorded = house.with_tables_kept_open()
    events: queue.Queue[Cycle | BaseException | None] = queue.Queue()
    stop = threading.Event()
    main = threading.main_thread()

    def should_stop() -> bool:
        return stop.is_set() or not main.is_alive()  # the process is exiting: finish this cycle, no other

    def run() -> None:
        try:
            follow(
                settings,
                house,
                transforms.for_changes,
                Forever(should_stop, config.poll_seconds, wake=stop),
                events.put,
                on_idle=lambda position: setattr(checks, "caught_up", position),
                owner=continuous_owner(context.run_id),
                log=context.log,
            )
            events.put(None)
        except BaseException as exc:  # handed to the op's thread, which fails the step with it
            events.put(exc)
        finally:
            with _followers_mutex:
                _followers.pop(threading.current_thread(), None)

    transforms.start_session_if_spark_takes_every_run()  # its JVM's start beside the first poll, not in a cycle
    freeze_imported()  # every cycle's collections walk only what the cycles made
    follower = threading.Thread(target=run, name="continuous-follower")
    with _followers_mutex:
        _followers[follower] = stop
    follower.start()
    context.log.info(f"continuous mode: following the binlog into {house} (poll every {config.poll_seconds:g} s)")
    interrupted = False
    try:
        yield from _watch(context, house, settings, events, stop, checks)
    except (DagsterExecutionInterruptedError, KeyboardInterrupt):
        interrupted = True
    except BaseException:  # a failure, or the generator closed: no check is waited for
        checks.runner.close()
        raise
    finally:  # also when the generator is closed: the cycle in progress finishes before the step ends
        stop.set()
        follower.join()
    # what the last cycle did, the check in progress, then the stop
    failure: BaseException | None = None
    try:
        while not events.empty():
            item = events.get()
            if isinstance(item, Cycle):
                yield from _cycle_events(context, checks.recorded or house, item, checks)
            elif isinstance(item, BaseException):
                failure = item
        if checks.runner.pending is not None and failure is None:
            answered = checks.runner.result(timeout=STOP_CHECK_WAIT_SECONDS)
            if answered is not None:
                yield from _check_answered(context, house, settings, checks, *answered)
            else:
                context.log.warning(f"continuous mode: the {checks.runner.pending.kind} check in progress was abandoned at the stop")
    finally:
        checks.runner.close()
    if failure is not None:
        raise failure
    run_record = context.instance.get_run_by_id(context.run_id)
    if interrupted or (run_record is not None and run_record.status == DagsterRunStatus.CANCELING):
        if run_record is not None and run_record.status == DagsterRunStatus.STARTED:
            context.instance.report_run_canceling(run_record, message="Continuous mode stopped by a signal.")
        context.log.info("continuous mode stopped after a complete cycle: the next start goes on from the checkpoint")
        raise DagsterExecutionInterruptedError()  # the run ends as canceled, as a terminated run does


def _watch(
    context: OpExecutionContext,
    house: Lakehouse,
    settings: Any,
    events: queue.Queue,
    stop: threading.Event,
    checks: _Checks,
) -> Iterator[Any]:
    """Turn the follower's cycles into events until it ends; stop it when the run is being terminated."""
    looked = time.monotonic()
    while True:
        try:
            item = events.get(timeout=RUN_STATUS_EVERY_SECONDS)
        except queue.Empty:
            item = None
        else:
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield from _cycle_events(context, checks.recorded or house, item, checks)
        now = time.monotonic()
        if now - looked >= RUN_STATUS_EVERY_SECONDS:
            looked = now
            record = context.instance.get_run_by_id(context.run_id)
            if record is not None and record.status == DagsterRunStatus.CANCELING:
                context.log.info("continuous mode: termination requested; stopping after the cycle in progress")
                stop.set()
                return
        answered = checks.runner.result()
        if answered is not None:
            yield from _check_answered(context, house, settings, checks, *answered)
        due = checks.due(now) if checks.runner.pending is None else None  # one check at a time: the next waits
        if due is not None:
            _submit_check(house, checks, *due)
            answered = checks.runner.result()  # at once when it ran in process
            if answered is not None:
                yield from _check_answered(context, house, settings, checks, *answered)
        caught_up, checks.caught_up = checks.caught_up, None
        if caught_up is not None and checks.confirm_due(now):  # the source is quiet: its tables are up to date
            confirmed = confirmations(context.instance, house, caught_up, checks.confirm_every, time.time(), keys=checks.keys)
            log_batch(context, confirmed)


def _cycle_events(context: OpExecutionContext, house: Lakehouse, cycle: Cycle, checks: _Checks) -> Iterator[Any]:
    """Materializations of the cycle: the raw batches, and each touched table's partitions and own asset, with the
    batch runs' metadata; and, at most every half confirmation interval, the quiet tables confirmed up to date
    through the cycle's capture. One batch of events per cycle."""
    events: list[Any] = []
    if cycle.capture is not None and cycle.capture.batches:
        metadata = {**capture_metadata(cycle.capture), "cycle": cycle.number}
        events.append(AssetMaterialization(checks.keys.raw_asset, metadata=metadata))
    if cycle.capture is not None and checks.confirm_due(time.monotonic()):
        position, touched = str(cycle.capture.end), set(cycle.tables)
        events += confirmations(context.instance, house, position, checks.confirm_every, time.time(), touched, keys=checks.keys)
    if cycle.tables:
        events += _table_events(context, house, cycle, checks)
    log_batch(context, events)
    yield from ()


def _table_events(context: OpExecutionContext, house: Lakehouse, cycle: Cycle, checks: _Checks) -> list[AssetMaterialization]:
    """Each touched table's change log and current state."""
    checks.touched.update(cycle.tables)
    changes, current = cycle.changes, cycle.current
    figures = applied_figures(cycle.tables, current.applied if current else [])
    for counts in figures.values():
        counts["cycle"] = cycle.number
    own = table_materializations(house, figures, cycle.facts, keys=checks.keys)  # each touched table's current state
    events = []
    for table in cycle.tables:
        logged = {**changes_figures(changes, table), "cycle": cycle.number} if changes else {"changes": 0, "cycle": cycle.number}
        events.append(AssetMaterialization(checks.keys.changes_asset_key(table), metadata=logged))
        events.append(own[table])
    return events


def _submit_check(house: Lakehouse, checks: _Checks, kind: str, tables: list[str]) -> None:
    """Hand the equality comparison of a due check to the check process (runtime/check_process.py); its answer is
    turned into the check evaluations when it comes (`_check_answered`)."""
    checks.runner.submit(Request(kind, known_tables(house.store, tables or None)))


def _check_answered(
    context: OpExecutionContext, house: Lakehouse, settings: Any, checks: _Checks, request: Request, answer: Answer
) -> Iterator[AssetCheckEvaluation]:
    """The batch runs' three checks of each table: equality (the check process's answer), then the tables' schemas
    and every table's lag (cheap: the source's columns, and each table's progress)."""
    names = request.tables or known_tables(house.store)
    if isinstance(answer.error, CheckProcessDied):  # killed, out of memory: a failed check, and the next one starts a new child
        context.log.error(f"continuous mode, {request.kind} check: {answer.error}")
        for table in names:
            yield AssetCheckEvaluation(
                asset_key=checks.keys.table_asset_key(table),
                check_name=EQUALITY_CHECK,
                passed=False,
                severity=AssetCheckSeverity.ERROR,
                description=str(answer.error),
                metadata={"scope": request.kind},
            )
        return
    if answer.error is not None:
        raise answer.error
    context.log.info(f"continuous mode, {request.kind} check:")
    log_comparisons(context.log, answer.comparisons or [])
    verdicts = equality_verdicts(answer.comparisons or [])  # each says which cadence compared it
    keys = checks.keys
    log_batch(context, [replace(v, metadata={**v.metadata, "cadence": request.kind}).evaluation(keys) for v in verdicts])
    log_batch(context, [*schema_match(settings, house, names, keys), *lag(settings, house, names, checks.lag_thresholds, keys)])
    yield from ()


def build_continuous_job(keys: SourceKeys) -> JobDefinition:
    """The source's `continuous` job: its one op follows the binlog until the run is terminated."""

    @op(
        name=keys.op(CONTINUOUS_OP),
        out={},
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", "transforms", "cadence"),
        description=FOLLOW_DESCRIPTION,
    )
    def follow_binlog_op(context: OpExecutionContext, config: ContinuousConfig) -> Iterator[Any]:
        yield from follow_binlog(context, config, SourceResources(context, keys))

    @job(
        name=keys.job(CONTINUOUS_JOB),
        executor_def=in_process_executor,
        tags=keys.tags("continuous"),
        description=FOLLOW_DESCRIPTION,
    )
    def continuous_job() -> None:
        follow_binlog_op.alias(CONTINUOUS_OP)()

    return continuous_job


def build_continuous_sensor(cadence: CadenceSettings, keys: SourceKeys = UNNAMED) -> SensorDefinition:
    """Starts the source's continuous job when no run of it is alive, so it is started again when it died. Running by
    default when CDC_CONTINUOUS=1 (`cadence.continuous`: the continuous sensor starts switched on under `make dev`)."""

    @sensor(
        name=keys.qualified(CONTINUOUS_SENSOR),
        job_name=keys.job(CONTINUOUS_JOB),
        required_resource_keys=keys.resource_keys("lakehouse"),
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING if cadence.continuous else DefaultSensorStatus.STOPPED,
        description=(
            "Keeps the continuous mode running: requests a run of the `continuous` job when none is queued or "
            "running and no continuous mode holds the lakehouse (a killed run's process is gone, so its locks are "
            "too). Running when CDC_CONTINUOUS=1; switch it off before terminating the run to stop for good."
        ),
    )
    def continuous_sensor(context: SensorEvaluationContext, **_given: Any) -> RunRequest | SkipReason:
        reason = continuous_alive(context.instance, SourceResources(context, keys).lakehouse.get(), keys)
        return SkipReason(reason) if reason else RunRequest()

    return continuous_sensor


def continuous_alive(instance: Any, house: Lakehouse, keys: SourceKeys) -> str | None:
    """Why no new continuous run is needed (one holds the lakehouse, waits to start or is just starting), or None.
    A started run that holds no lock past the grace period died with its process: it is marked failed."""
    holder = continuous_holder(house)
    if holder is not None:
        return f"Continuous mode is running ({holder.describe()})."
    runs = instance.get_runs(filters=RunsFilter(job_name=keys.job(CONTINUOUS_JOB), statuses=ALIVE_STATUSES), limit=20)
    for run in runs:
        if run.status in WAITING_STATUSES:
            return f"Continuous run {run.run_id[:8]} is {run.status.value.lower()}."
        record = instance.get_run_record_by_id(run.run_id)
        started = record.start_time if record is not None and record.start_time else None
        if started is not None and time.time() - started < house.lock_wait_seconds + STARTUP_GRACE_SECONDS:
            return f"Continuous run {run.run_id[:8]} is starting."
        if run.status == DagsterRunStatus.STARTED:
            instance.report_run_failed(run, message="The continuous run holds no lock: its process is gone.")
    return None
