"""`cdc-lakehouse sync` as one Dagster run: capture, the change logs and current state of the tables it touched,
and their checks, in one step of the `sync` job.

A sync used to be a run of `capture` and then one `apply_changes` run per range of touched tables: two or more
run launches, each with its run bookkeeping, its planned-materialization events and a step per asset and per check
(most of a small sync's time, `benchmarks/README.md`, "Fixed costs"). The tables a sync touches are known only once
it has captured, so one partitioned asset run cannot cover them; this op calls the same stage functions the
assets call, in the same order, and records what the asset runs record: the raw-batch materialization, the source
tables' observations and the quiet tables' confirmations, each touched table's `changes/<schema>/<table>` and
`current/<schema>/<table>` materializations, and each touched table's check evaluations (the blocking ones stop the
run when they fail, as in the asset jobs), written in three batches of events (`event_log.log_batch`). The
automation, the schedule and the sensors keep their asset jobs.

From the command line, a child forked before Dagster's import has usually done the capture, the stages and the checks'
comparisons by the time the op asks (runtime/forked_capture.py, runtime/forked_stages.py): the op then records the child's
reports in the same events, and calls the functions itself only for the steps the child did not report.
"""

import dataclasses
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    Config,
    DagsterEventType,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from cdc_assets.capture.journal import CaptureJournal
from cdc_assets.capture.run import CaptureReport, capture
from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.assets.metadata import applied_figures, changes_figures
from cdc_assets.defs.assets.raw import capture_events
from cdc_assets.defs.assets.tables import table_materializations
from cdc_assets.defs.checks import (
    contiguity,
    equality,
    equality_of,
    lag,
    lag_of,
    schema_match,
    schema_match_of,
    seq_uniqueness,
    uniqueness_of,
)
from cdc_assets.defs.keys import RAW_ASSET, REPAIR_JOB, STAGE_TAG, SYNC_JOB, changes_asset_key
from cdc_assets.defs.resources import BinlogResource, LakehouseResource
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.raw_batches import batch_exists, read_manifest
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.repair.run import repair, repaired_after
from cdc_assets.runtime import forked_capture
from cdc_assets.runtime.event_log import log_batch
from cdc_assets.runtime.forked_stages import pending_tables
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.run import apply_pending
from spark_resources.resources import TransformsResource


def recorded_raw_batches(instance: Any, run_id: str) -> bool:
    """Whether run `run_id` logged its raw batches' materialization (a run that died right after it)."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
    return any(r.event_log_entry.dagster_event.asset_key == RAW_ASSET for r in records)


def with_batches_taken_over(instance: Any, house: Lakehouse, report: CaptureReport) -> CaptureReport:
    """The report with the batches its capture took over from runs that ended before recording them (see
    capture/journal.py) put in binlog order among its own, but those their run did record after all."""
    if not report.taken_over:
        return report
    runs = set(report.taken_over.values())
    unrecorded = {run for run in runs if not recorded_raw_batches(instance, run)}
    own = {b.name for b in report.batches}
    taken = [
        read_manifest(house.store, name)
        for name, run in report.taken_over.items()
        if run in unrecorded and name not in own and batch_exists(house.store, name)  # one removed by hand: gone
    ]
    return dataclasses.replace(report, batches=sorted([*taken, *report.batches], key=lambda b: b.name))


def _repaired(
    context: OpExecutionContext, settings: Any, house: Lakehouse, tables: list[str], owner: str, journal: CaptureJournal
) -> CaptureReport | None:
    """`cdc-lakehouse repair`'s repair of `tables` (repair/run.py), said table by table and recorded as an
    observation of the raw batches (the repair's batch is one); its capture's report (up to its point, and its
    batch), None when it captured nothing."""
    repaired = repair(settings, house, tables, log=context.log, owner=owner, journal=journal)
    outcome = {t.table: t.describe() for t in repaired.tables}
    context.log_event(
        AssetObservation(RAW_ASSET, description="repair", metadata={"repaired": outcome, "position": repaired.position or ""})
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


@op(
    description=(
        "cdc-lakehouse sync in one run: captures raw batches up to the binlog end as of its start (and confirms the "
        "quiet tables up to date), then appends the touched tables' changes to their change logs and applies them "
        "to current state, and evaluates the raw batches' check and each touched table's checks "
        "(raw_batches_contiguous and change_log_seq_unique block what follows them). Records the same "
        "materializations and check evaluations as a capture run followed by a run of the tables, in a few batches of events."
    ),
)
def sync_lakehouse(
    context: OpExecutionContext,
    config: SyncConfig,
    binlog: BinlogResource,
    lakehouse: LakehouseResource,
    transforms: TransformsResource,
) -> None:
    house, settings, owner = lakehouse.get(), binlog.settings(), run_owner(context.run_id)
    forked = forked_capture.take(context.run_id)  # the command line's capture, begun before Dagster was imported
    report = forked.result(context.log) if forked is not None else None
    child = forked if report is not None else None  # it goes on with the stages (forked_stages), reported here
    journal = CaptureJournal(context.run_id)
    if config.repair:  # the repair's capture: up to its point, and its batch there (never forked)
        report = _repaired(context, settings, house, config.repair, owner, journal)
    if report is None:
        report = capture(settings, house, log=context.log, owner=owner, journal=journal)
    if child is None:  # (a forked child has done this after its capture)
        report = repaired_after(settings, house, report, owner, context.log, journal)
    report = with_batches_taken_over(context.instance, house, report)

    def from_child(step: str) -> Any | None:
        """The child's report of `step`, or None: then the op does the step (raising the child's sentence there
        when the child's stage ended with one, as the op's own call would)."""
        done = child.reported(step, context.log) if child is not None else None
        if done is None and child is not None and child.user_error is not None:
            raise CdcUserError(child.user_error)
        return done

    # what the child is bringing up to date: not quiet tables to confirm (a sentence it ended with is said below,
    # where the op's own call says it: the capture is recorded first)
    pending = child.reported("tables", context.log) if child is not None else None
    metadata, confirmed = capture_events(
        context.instance, house, report, binlog.max_batch_rows, context.log, busy=pending or ()
    )
    contiguous = _evaluation(RAW_ASSET, "raw_batches_contiguous", contiguity(house, report.batches[0].name if report.batches else None))
    log_batch(context, [AssetMaterialization(RAW_ASSET, metadata=metadata), *confirmed, contiguous])
    journal.close(house.store)  # recorded: the journal of this run's batches goes
    if not contiguous.passed:
        raise _blocked(contiguous)

    ordered = known_tables(house.store)
    if pending is None:
        tables = pending_tables(house, ordered)
    else:  # the child's, in the lakehouse's order
        reported_tables = set(pending)
        tables = [t for t in ordered if t in reported_tables]
    if not tables:
        return

    reported = from_child("changes")
    if reported is None:
        changes = process_new_batches(house, transforms.for_changes, tables=tables, log=context.log, owner=owner)
        unique = seq_uniqueness(house, known_tables(house.store, tables))
    else:
        changes, duplicates = reported
        unique = uniqueness_of(duplicates, known_tables(house.store, tables))
    logs = [AssetMaterialization(changes_asset_key(t), metadata=changes_figures(changes, t)) for t in tables]
    log_batch(context, [*logs, *unique])
    for evaluation in unique:
        if not evaluation.passed:
            raise _blocked(evaluation)

    reported = from_child("current")
    if reported is None:
        current = apply_pending(house, transforms.for_changes, tables=tables, log=context.log, owner=owner)
        facts = None
    else:
        current, facts = reported
    own = table_materializations(house, applied_figures(current.tables, current.applied), facts)
    checked = known_tables(house.store, tables)
    found = from_child("checks")
    if found is None:
        verdicts = [
            *equality(settings, house, checked, context.log),
            *schema_match(settings, house, checked),
            *lag(settings, house, checked),
        ]
    else:
        comparisons, problems, lags = found
        verdicts = [*equality_of(comparisons, context.log), *schema_match_of(problems, checked), *lag_of(lags, checked)]
    log_batch(context, [*own.values(), *verdicts])
    if child is not None:
        child.wait(context.log)


@job(name=SYNC_JOB, executor_def=in_process_executor, tags={STAGE_TAG: "sync"}, description=sync_lakehouse.description)
def sync_job() -> None:
    sync_lakehouse()


@job(
    name=REPAIR_JOB,
    executor_def=in_process_executor,
    tags={STAGE_TAG: "repair"},
    description=(
        "cdc-lakehouse repair from the UI: give the tables in the launchpad (ops: sync_lakehouse: config: repair: "
        "[schema.table, …]). Their rows that differ from the source are read again at one consistent point, without a "
        "lock, and written as `repair` / `repair_delete` changes, then applied and checked as `sync` does."
    ),
)
def repair_job() -> None:
    sync_lakehouse()
