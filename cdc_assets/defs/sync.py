"""`cdc-lakehouse sync` as one Dagster run: capture, the change logs and current state of the tables it touched,
and their checks, in one step of the `sync` job.

A sync used to be a run of `capture` and then one `apply_changes` run per range of touched tables: two or more
run launches, each with its run bookkeeping, its planned-materialization events and a step per asset and per check
(most of a small sync's time, `benchmarks/README.md`, "Fixed costs"). The tables a sync touches are known only once
it has captured, so one partitioned asset run cannot cover them; this op runs the pipeline's one driver
(cdc_assets/pipeline/driver.py), as the asset runs do, and records what they record from the driver's reports: the raw-batch materialization, the source
tables' observations and the quiet tables' confirmations, each touched table's `changes/<schema>/<table>` and
`current/<schema>/<table>` materializations, and each touched table's check evaluations (the blocking ones stop the
run when they fail, as in the asset jobs), written in three batches of events (`event_log.log_batch`). The
automation, the schedule and the sensors keep their asset jobs.

From the command line, a child forked before Dagster's import runs the driver (runtime/forked_capture.py,
runtime/forked_stages.py) and has usually done the capture, the stages and the checks' comparisons by the time the
op asks: the op records the child's reports as they come, in the same events, and runs the driver itself only for
the steps the child did not report (`pipeline.driver.remaining`), each resuming from the lakehouse's own progress.
"""

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    Config,
    DagsterEventType,
    Failure,
    JobDefinition,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.capture.run import CaptureReport
from cdc_assets.core import work_tally
from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.assets.metadata import applied_figures, changes_figures
from cdc_assets.defs.assets.raw import capture_events
from cdc_assets.defs.assets.tables import table_materializations
from cdc_assets.defs.checks import contiguity_of, equality_of, lag_of, schema_match_of, uniqueness_of
from cdc_assets.defs.keys import REPAIR_JOB, SYNC_JOB, SYNC_LANE, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.raw_batches import batch_exists, read_manifest
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.pipeline.driver import (
    SYNC_STEPS,
    Captured,
    ChangesLogged,
    Checked,
    CurrentApplied,
    Pending,
    StepReport,
    drive,
    remaining,
)
from cdc_assets.repair.run import repair
from cdc_assets.runtime import forked_capture
from cdc_assets.runtime.step_events import log_batch


def recorded_raw_batches(instance: Any, run_id: str, keys: SourceKeys) -> bool:
    """Whether run `run_id` logged its raw batches' materialization (a run that died right after it)."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    return any(r.event_log_entry.dagster_event.asset_key == keys.raw_asset for r in records)


def with_batches_taken_over(instance: Any, house: Lakehouse, report: CaptureReport, keys: SourceKeys) -> CaptureReport:
    """The report with the batches its capture took over from runs that ended before recording them (see
    capture/journal.py) put in binlog order among its own, but those their run did record after all."""
    if not report.taken_over:
        return report
    runs = set(report.taken_over.values())
    unrecorded = {run for run in runs if not recorded_raw_batches(instance, run, keys)}
    own = {b.name for b in report.batches}
    taken = [
        read_manifest(house.store, name)
        for name, run in report.taken_over.items()
        if run in unrecorded and name not in own and batch_exists(house.store, name)  # one removed by hand: gone
    ]
    return dataclasses.replace(report, batches=sorted([*taken, *report.batches], key=lambda b: b.name))


def _repaired(
    context: OpExecutionContext,
    settings: Any,
    house: Lakehouse,
    tables: list[str],
    owner: str,
    journal: CaptureJournal,
    keys: SourceKeys,
) -> CaptureReport | None:
    """`cdc-lakehouse repair`'s repair of `tables` (repair/run.py), said table by table and recorded as an
    observation of the raw batches (the repair's batch is one); its capture's report (up to its point, and its
    batch), None when it captured nothing."""
    repaired = repair(settings, house, tables, log=context.log, owner=owner, journal=journal)
    outcome = {t.table: t.describe() for t in repaired.tables}
    context.log_event(
        AssetObservation(keys.raw_asset, description="repair", metadata={"repaired": outcome, "position": repaired.position or ""})
    )
    return repaired.capture


def _evaluation(asset: Any, name: str, fields: dict[str, Any]) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(asset_key=asset, check_name=name, **fields)


def _blocked(evaluation: AssetCheckEvaluation) -> Failure:
    return Failure(
        description=f"blocking check {evaluation.check_name} failed: {evaluation.description}",
        metadata={"check": evaluation.check_name},
    )


class SyncConfig(Config):
    repair: list[str] = Field(
        default_factory=list,
        description="schema.table names to repair first (`cdc-lakehouse repair`): their rows that differ from the "
        "source are written as `repair` changes at one consistent point, then applied and checked as any change.",
    )


SYNC_OP = "sync_lakehouse"  # its node in the sync and repair jobs, which a run's config names


def build_sync_op(keys: SourceKeys) -> Any:  # an OpDefinition
    """The sync's one op, for the source `keys` names (its definition name the source's, its node `sync_lakehouse`)."""

    @op(
        name=keys.op(SYNC_OP),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", "transforms", "cadence"),
        description=(
            "cdc-lakehouse sync in one run: captures raw batches up to the binlog end as of its start (and confirms the "
            "quiet tables up to date), then appends the touched tables' changes to their change logs and applies them "
            "to current state, and evaluates the raw batches' check and each touched table's checks "
            "(raw_batches_contiguous and change_log_seq_unique block what follows them). Records the same "
            "materializations and check evaluations as a capture run followed by a run of the tables, in a few batches of events."
        ),
    )
    def sync_lakehouse(context: OpExecutionContext, config: SyncConfig) -> None:
        sync(context, config, SourceResources(context, keys))

    return sync_lakehouse


def sync(context: OpExecutionContext, config: SyncConfig, used: SourceResources) -> None:
    """The sync op's work, with the resources of its source (`used.keys`)."""
    keys, binlog, cadence, transforms = used.keys, used.binlog, used.cadence, used.transforms
    house, settings, owner = used.lakehouse.get(), binlog.settings(), run_owner(context.run_id)
    forked = forked_capture.take(context.run_id)  # the command line's driver, begun before Dagster was imported
    journal = CaptureJournal(context.run_id)
    # the repair's capture: up to its point, and its batch there (a repair is never forked)
    captured = _repaired(context, settings, house, config.repair, owner, journal, keys) if config.repair else None

    def run(steps: list[str], tables: list[str] | None) -> Iterator[StepReport]:
        return drive(
            settings, house, owner=owner, steps=steps, tables=tables, transforms=transforms.for_changes,
            log=context.log, journal=journal, repairs_owed=True, captured=captured,
        )  # fmt: skip

    held: list[Captured] = []  # the capture, recorded once the tables the stages take are known (they are not quiet)
    own: dict[str, AssetMaterialization] = {}  # current state's, recorded with the checks' evaluations

    def record_capture(busy: list[str]) -> None:
        if held:
            _record_capture(
                context, house, held.pop(), binlog.max_batch_rows, cadence.confirm_every_seconds, journal, busy, keys
            )

    spent = TimeSpent()
    try:
        for step in spent.of_steps(_reports(context.log, None if config.repair else forked, run)):
            if isinstance(step, Captured):
                held.append(step)
            elif isinstance(step, Pending):
                record_capture(step.tables)
            elif isinstance(step, ChangesLogged):
                _record_changes(context, house, step, keys)
            elif isinstance(step, CurrentApplied):
                figures = applied_figures(step.current.tables, step.current.applied)
                own = table_materializations(house, figures, step.facts, keys=keys)
            elif isinstance(step, Checked):
                log_batch(context, [*own.values(), *_verdicts(step, context.log, cadence.lag_thresholds, keys)])
        record_capture([])  # a capture the blocking rules stopped the run after
    except Exception:
        record_capture([])  # recorded first, as when the op ran each step itself
        raise
    finally:
        spent.recorded()
    context.log.info(spent.sentence())


# The driver's step report that ends each part of a sync's time (what came before the report was that part's work).
STEP_PARTS = {
    Captured: "capture",
    Pending: "planning",
    ChangesLogged: "change logs",
    CurrentApplied: "current state",
    Checked: "checks against the source",
}
RECORDING = "Dagster events"


@dataclasses.dataclass
class TimeSpent:
    """Where a sync's seconds went (issue 45: a user sees the split with `-v`): each step's work, timed from the end
    of the one before to its report (in the forked child, or the driver here), and the op's recording of Dagster's
    events (materializations, check evaluations) between the reports. Each part also says the work in it by kind
    (`core.work_tally`: Delta commits per layer, Delta tables opened, state and batch file operations, locks), the
    forked child's included: it sends a step's work just before the step's report."""

    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    work: dict[str, work_tally.Tally] = dataclasses.field(default_factory=dict)
    _mark: float = dataclasses.field(default_factory=time.monotonic)
    _work_mark: work_tally.Tally = dataclasses.field(default_factory=work_tally.snapshot)

    def _count(self, part: str) -> None:
        """The time and work since the last count, counted to `part`."""
        now, tally = time.monotonic(), work_tally.snapshot()
        self.seconds[part] = self.seconds.get(part, 0.0) + now - self._mark
        self.work[part] = self.work.get(part, work_tally.Tally()) + (tally - self._work_mark)
        self._mark, self._work_mark = now, tally

    def of_steps(self, steps: Iterator[StepReport]) -> Iterator[StepReport]:
        """`steps`, the time up to each report counted to its part and the time the op takes over it (recording
        the report) to Dagster's events."""
        for step in steps:
            self._count(STEP_PARTS.get(type(step), "other steps"))
            yield step
            self._count(RECORDING)

    def recorded(self) -> None:
        """The op's recording after its last report (the capture it still held, or a step it stopped on) is over."""
        self._count(RECORDING)

    def sentence(self) -> str:
        """`where the time went: current state 21.1 s (current-state commits 1,000 (12.0 s), …), …`: the parts by
        their seconds, each with its work (work-seconds: a pool's threads add up)."""
        parts = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        said = []
        for name, seconds in parts:
            work = self.work.get(name, work_tally.Tally())
            said.append(f"{name} {seconds:.1f} s" + (f" ({work.sentence()})" if work.counts else ""))
        return "where the time went: " + ", ".join(said)


def _reports(
    log: Any, forked: forked_capture.ForkedCapture | None, run: Callable[[list[str], list[str] | None], Iterator[StepReport]]
) -> Iterator[StepReport]:
    """The sync's step reports: the forked child's as they come, then the op's own run of the driver (`run(steps,
    tables)`) for the steps the child did not report, or all of them without a child. A sentence the child's step
    ended with is the op's at that step, as its own call would have said it."""
    received: list[StepReport] = []
    if forked is not None:
        for step in forked.reports(log):
            received.append(step)
            yield step
    rest = remaining(received, SYNC_STEPS)
    if rest is None:
        return
    if forked is not None and forked.user_error is not None:
        raise CdcUserError(forked.user_error)
    yield from run(*rest)


def _record_capture(
    context: OpExecutionContext,
    house: Lakehouse,
    captured: Captured,
    max_batch_rows: int | None,
    confirm_every: float,
    journal: CaptureJournal,
    busy: list[str],
    keys: SourceKeys,
) -> None:
    """The raw batches' materialization (with the batches taken over from runs that ended before recording them), the
    quiet tables' confirmations (not `busy`: the tables the stages take) and raw_batches_contiguous, which blocks
    what follows it."""
    report = with_batches_taken_over(context.instance, house, captured.capture, keys)
    metadata, confirmed = capture_events(
        context.instance, house, report, max_batch_rows, context.log, confirm_every, keys=keys, busy=busy
    )
    raw = keys.raw_asset
    contiguous = _evaluation(raw, "raw_batches_contiguous", contiguity_of(captured.breaks or [], captured.chain_from))
    log_batch(context, [AssetMaterialization(raw, metadata=metadata), *confirmed, contiguous])
    journal.close(house.store)  # recorded: the journal of this run's batches goes
    if not contiguous.passed:
        raise _blocked(contiguous)


def _record_changes(context: OpExecutionContext, house: Lakehouse, logged: ChangesLogged, keys: SourceKeys) -> None:
    """Each change log's materialization and change_log_seq_unique, which blocks current state."""
    unique = uniqueness_of(logged.duplicates or {}, known_tables(house.store, logged.tables), keys)
    logs = [
        AssetMaterialization(keys.changes_asset_key(t), metadata=changes_figures(logged.changes, t)) for t in logged.tables
    ]
    log_batch(context, [*logs, *unique])
    for evaluation in unique:
        if not evaluation.passed:
            raise _blocked(evaluation)


def _verdicts(
    checked: Checked, log: Any, lag_thresholds: tuple[float, float], keys: SourceKeys
) -> list[AssetCheckEvaluation]:
    """Each checked table's equality (its differences logged), schema and lag evaluations."""
    return [
        *equality_of(checked.comparisons, log, keys),
        *schema_match_of(checked.schema_problems, checked.tables, keys),
        *lag_of(checked.lags, checked.tables, lag_thresholds, keys),
    ]


def build_sync_jobs(keys: SourceKeys) -> list[JobDefinition]:
    """The source's `sync` job and its `repair` job (the sync's op with the tables to repair in its config)."""
    sync_op = build_sync_op(keys)

    @job(
        name=keys.job(SYNC_JOB),
        executor_def=in_process_executor,
        tags=keys.tags("sync", SYNC_LANE),
        description=sync_op.description,
    )
    def sync_job() -> None:
        sync_op.alias(SYNC_OP)()

    @job(
        name=keys.job(REPAIR_JOB),
        executor_def=in_process_executor,
        tags=keys.tags("repair"),
        description=(
            "cdc-lakehouse repair from the UI: give the tables in the launchpad (ops: sync_lakehouse: config: repair: "
            "[schema.table, …]). Their rows that differ from the source are read again at one consistent point, without a "
            "lock, and written as `repair` / `repair_delete` changes, then applied and checked as `sync` does."
        ),
    )
    def repair_job() -> None:
        sync_op.alias(SYNC_OP)()

    return [sync_job, repair_job]
