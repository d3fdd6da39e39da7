"""`cdc-lakehouse sync` as one Dagster run: capture, the change logs and current state of the tables it touched,
and their checks, in one step of the `sync` job.

A sync used to be a run of `capture` and then one `apply_changes` run per range of touched tables: two or more
run launches, each with its run bookkeeping, its planned-materialization events and a step per asset and per check
(most of a small sync's time, `benchmarks/README.md`, "Fixed costs"). The tables a sync touches are known only once
it has captured, so one partitioned asset run cannot cover them; this op calls the same stage functions the
assets call, in the same order, and records what the asset runs record: the raw-batch materialization, a
materialization of each touched table's `table_changes` and `current_tables` partition with the metadata a range
run gives every partition, each table's own `current/<schema>/<table>` materialization, and an evaluation of each
asset check (the blocking ones stop the run when they fail, as in the asset jobs). The schedule and the sensors
keep their asset jobs.
"""

from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    Failure,
    OpExecutionContext,
    in_process_executor,
    job,
    op,
)

from cdc_assets.capture.run import capture
from cdc_assets.defs.assets.changes import changes_metadata
from cdc_assets.defs.assets.current import current_events
from cdc_assets.defs.assets.metadata import capture_metadata
from cdc_assets.defs.checks import contiguity, equality, lag, schema_match, seq_uniqueness
from cdc_assets.defs.keys import CHANGES_ASSET, CURRENT_ASSET, RAW_ASSET, STAGE_TAG, SYNC_JOB
from cdc_assets.defs.partitions import TABLES_PARTITIONS_NAME, run_owner, with_new_tables
from cdc_assets.defs.resources import BinlogResource, LakehouseResource
from cdc_assets.lake.layout import CURRENT_STAGE
from cdc_assets.lake.state import known_tables, tables_behind
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes import missing_change_logs, process_new_batches
from cdc_assets.stages.current import apply_pending
from cdc_assets.stages.current_state import missing_current_tables
from spark_resources.resources import TransformsResource


def pending_tables(house: Lakehouse, ordered: list[str]) -> list[str]:
    """The tables with changes captured and not yet in current state, and those whose change log or current state
    was removed by hand, in partition order."""
    pending = set(tables_behind(house.store, CURRENT_STAGE))
    pending |= set(missing_current_tables(house, sorted(set(ordered) - pending)))
    pending |= set(missing_change_logs(house, sorted(set(ordered) - pending)))
    return [t for t in ordered if t in pending]


def _evaluation(asset: Any, name: str, fields: dict[str, Any]) -> AssetCheckEvaluation:
    return AssetCheckEvaluation(asset_key=asset, check_name=name, **fields)


def _blocked(evaluation: AssetCheckEvaluation) -> Failure:
    return Failure(
        description=f"blocking check {evaluation.check_name} failed: {evaluation.description}",
        metadata={"check": evaluation.check_name},
    )


@op(
    out={},
    description=(
        "cdc-lakehouse sync in one run: captures raw batches up to the binlog end as of its start, then appends the "
        "touched tables' changes to their change logs and applies them to current state, and evaluates the checks "
        "of the three assets (raw_batches_contiguous and change_log_seq_unique block what follows them). Records "
        "the same materializations and check evaluations as a capture run followed by apply runs."
    ),
)
def sync_lakehouse(
    context: OpExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource, transforms: TransformsResource
) -> Iterator[Any]:
    house, settings, owner = lakehouse.get(), binlog.settings(), run_owner(context.run_id)
    report = capture(settings, house, log=context.log, owner=owner)
    context.log.info(
        f"captured {len(report.batches)} batches, {report.rows} row changes of {len(report.tables)} tables "
        f"up to {report.end} in {report.seconds:.1f}s"
    )
    yield AssetMaterialization(RAW_ASSET, metadata=capture_metadata(report, binlog.max_batch_rows))
    contiguous = _evaluation(
        RAW_ASSET, "raw_batches_contiguous", contiguity(house, report.batches[0].name if report.batches else None)
    )
    yield contiguous
    if not contiguous.passed:
        raise _blocked(contiguous)

    instance = context.instance
    ordered, new = with_new_tables(
        list(instance.get_dynamic_partitions(TABLES_PARTITIONS_NAME)), known_tables(house.store)
    )
    if new:
        instance.add_dynamic_partitions(TABLES_PARTITIONS_NAME, new)
    tables = pending_tables(house, ordered)
    if not tables:
        return

    changes = process_new_batches(house, transforms.for_changes, tables=tables, log=context.log, owner=owner)
    metadata = changes_metadata(changes, tables)
    for table in tables:
        yield AssetMaterialization(CHANGES_ASSET, partition=table, metadata=metadata)
    unique = _evaluation(
        CHANGES_ASSET, "change_log_seq_unique", seq_uniqueness(house, known_tables(house.store, tables))
    )
    yield unique
    if not unique.passed:
        raise _blocked(unique)

    current = apply_pending(house, transforms.for_changes, tables=tables, log=context.log, owner=owner)
    metadata, own = current_events(house, current)
    for table in tables:
        yield AssetMaterialization(CURRENT_ASSET, partition=table, metadata=metadata)
    yield from own.values()
    checked = known_tables(house.store, tables)
    yield _evaluation(CURRENT_ASSET, "current_matches_source", equality(settings, house, checked, context.log))
    yield _evaluation(CURRENT_ASSET, "current_schema_matches_source", schema_match(settings, house, checked))
    yield _evaluation(CURRENT_ASSET, "table_lag", lag(settings, house))


@job(name=SYNC_JOB, executor_def=in_process_executor, tags={STAGE_TAG: "sync"}, description=sync_lakehouse.description)
def sync_job() -> None:
    sync_lakehouse()
