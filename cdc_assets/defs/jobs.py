"""Jobs: `capture` materializes the raw batches, `apply_changes` the change logs and current state of the tables a
run selects, `check_lag` runs the tables' lag checks alone (the sinks' jobs are in defs/sinks.py); `snapshot` loads
existing rows; `check_equality` compares every row of every table with the source; `forget` rewrites a table's
earlier layers (a person's keys removed, or column policies added since capture applied). Assets and checks are selected
by key or group, so this module needs neither their modules nor the wiring around them. Each is built for one source
(`build_jobs(keys)`): its names, selections, ops, resource keys and run tags are the source's."""

from typing import Any

from dagster import (
    AssetCheckKey,
    AssetMaterialization,
    AssetSelection,
    Config,
    Failure,
    JobDefinition,
    OpExecutionContext,
    define_asset_job,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.defs.assets.metadata import applied_figures, capture_metadata, changes_figures
from cdc_assets.defs.assets.tables import table_materializations
from cdc_assets.defs.checks import log_comparisons, uniqueness_of
from cdc_assets.defs.keys import (
    APPLY_JOB,
    APPLY_LANE,
    CAPTURE_JOB,
    CAPTURE_LANE,
    CHANGES_TABLE_PREFIX,
    CURRENT_TABLE_PREFIX,
    EQUALITY_JOB,
    FORGET_JOB,
    FORGET_OP,
    LAG_JOB,
    NEW_TABLES_JOB,
    SNAPSHOT_JOB,
    SourceKeys,
)
from cdc_assets.defs.resources import SourceResources
from cdc_assets.defs.table_checks import LAG_CHECK, equality_verdicts
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.state import known_tables
from cdc_assets.pipeline.driver import CHANGES as CHANGES_STEP
from cdc_assets.pipeline.driver import CURRENT as CURRENT_STEP
from cdc_assets.pipeline.driver import ChangesLogged, CurrentApplied, bring_up_to_date, drive
from cdc_assets.runtime.event_log import log_batch
from cdc_assets.sinks.checkpoint import sinks_published
from cdc_assets.stages.rewrite.layers import LayerCount
from cdc_assets.stages.rewrite.person import forget_keys_in, read_keys_file
from cdc_assets.stages.rewrite.policies import rewrite_policies
from cdc_assets.stages.snapshot.run import take_snapshot
from cdc_assets.verification.changed_keys import compare_every_row


def build_capture_job(keys: SourceKeys) -> Any:  # define_asset_job's (its class is not public)
    return define_asset_job(
        keys.job(CAPTURE_JOB),
        selection=AssetSelection.assets(keys.raw_asset),
        tags=keys.tags("capture", CAPTURE_LANE),
        description=(
            "Capture: raw batches from the checkpoint to the binlog end as of the run's start, then the contiguity "
            "check. Holds the lakehouse's capture lock, so two captures never run at once."
        ),
    )


def build_apply_job(keys: SourceKeys) -> Any:
    return define_asset_job(
        keys.job(APPLY_JOB),
        selection=AssetSelection.key_prefixes(keys.prefix(CHANGES_TABLE_PREFIX), keys.prefix(CURRENT_TABLE_PREFIX)),
        tags=keys.tags("apply", APPLY_LANE),
        description=(
            "For the tables a run selects (all of them by default): append new raw-batch changes to their change logs, "
            "apply them to their current state, then check each table against the source. One run, however many tables."
        ),
    )


def build_lag_check_job(tables: list[str], sink_checks: list[AssetCheckKey], keys: SourceKeys) -> Any:
    """The lag checks alone: each table's, and each configured sink's."""
    return define_asset_job(
        keys.job(LAG_JOB),
        selection=AssetSelection.checks(*(AssetCheckKey(keys.table_asset_key(t), LAG_CHECK) for t in tables), *sink_checks),
        tags=keys.tags("check"),
        description=(
            "Evaluates the per-table lag check (and each sink's lag check) alone, so a stopped pipeline or sink is "
            "reported even when nothing runs."
        ),
    )


class SnapshotConfig(Config):
    tables: list[str] = Field(default_factory=list, description="schema.table names; empty: every included table.")


def build_snapshot_job(keys: SourceKeys) -> JobDefinition:
    @op(
        name=keys.op("snapshot_tables"),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", "transforms"),
        description=(
            "Loads tables' existing rows into current state consistently with the binlog, so later changes apply on "
            "top: on Arrow inside one consistent snapshot captured exactly up to its position; on Spark by parallel "
            "tasks a primary-key chunk at a time from a low watermark, resumable chunk by chunk."
        ),
    )
    def snapshot_tables(context: OpExecutionContext, config: SnapshotConfig) -> None:
        used = SourceResources(context, keys)
        binlog, house = used.binlog, used.lakehouse.get()
        report = take_snapshot(
            binlog.settings(),
            house,
            config.tables,
            log=context.log,
            owner=run_owner(context.run.run_id),
            transforms=used.transforms.for_changes,
        )
        if report.capture is not None:
            context.log_event(
                AssetMaterialization(keys.raw_asset, metadata=capture_metadata(report.capture, binlog.max_batch_rows))
            )
        context.log.info(
            f"snapshot at {report.position}: {len(report.rows)} tables, {sum(report.rows.values())} rows in {report.seconds:.1f}s"
        )
        figures = {
            table: {
                "snapshot_position": str(report.position), "snapshot_seq": report.seq, "snapshot_rows": rows,
                # what a table's history cannot know: the changes in the gap of a lakehouse begun again
                **({"history_gap": report.history_gaps[table]} if table in report.history_gaps else {}),
            }
            for table, rows in report.rows.items()
        }  # fmt: skip
        house = used.lakehouse.get()
        log_batch(context, list(table_materializations(house, figures, keys=keys).values()))  # each loaded table's own asset

    @job(name=keys.job(SNAPSHOT_JOB), executor_def=in_process_executor, tags=keys.tags("snapshot"), description=snapshot_tables.description)
    def snapshot_job() -> None:
        snapshot_tables.alias("snapshot_tables")()

    return snapshot_job


class EqualityConfig(Config):
    tables: list[str] = Field(default_factory=list, description="schema.table names; empty: every table the lakehouse knows.")


def build_equality_job(keys: SourceKeys) -> JobDefinition:
    @op(
        name=keys.op("compare_every_row_op"),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse"),
        description=(
            "Compares every row of every current-state table with its source table at one consistent point (keys "
            "changed in flight left out), the comparison the checks after applies narrow to the keys they changed. Fails "
            "naming each table that differs, with its keys, and records each table's current_matches_source on its own "
            "asset; a table found equal becomes the base of the next checks."
        ),
    )
    def compare_every_row_op(context: OpExecutionContext, config: EqualityConfig) -> None:
        used = SourceResources(context, keys)
        house = used.lakehouse.get()
        tables = [TableRef.parse(t) for t in known_tables(house.store, config.tables or None)]
        comparisons = compare_every_row(used.binlog.settings(), house, tables)
        failing = log_comparisons(context.log, comparisons)
        log_batch(context, [v.evaluation(keys) for v in equality_verdicts(comparisons)])  # each table's own asset
        if failing:
            raise Failure(description="; ".join(failing[:5]), metadata={"differing": len(failing)})

    @job(
        name=keys.job(EQUALITY_JOB),
        executor_def=in_process_executor,
        tags=keys.tags("check"),
        description=compare_every_row_op.description,
    )
    def equality_job() -> None:
        compare_every_row_op.alias("compare_every_row_op")()

    return equality_job


class NewTablesConfig(Config):
    tables: list[str] = Field(default_factory=list, description="schema.table names the definitions have no asset for.")


NEW_TABLES_OP = "take_in_new_tables"  # its node in the job, which a run's config names


def build_new_tables_job(keys: SourceKeys) -> JobDefinition:
    @op(
        name=keys.op(NEW_TABLES_OP),
        required_resource_keys=keys.resource_keys("lakehouse", "transforms"),
        description=(
            "Applies the tables captured since the definitions loaded, which have no asset to select yet: their new raw "
            "batches into their change logs, then into current state, recording each table's change log, seq check and "
            "current state under its key. Their assets show after the next definitions reload."
        ),
    )
    def take_in_new_tables(context: OpExecutionContext, config: NewTablesConfig) -> None:
        used = SourceResources(context, keys)
        house, owner = used.lakehouse.get(), run_owner(context.run.run_id)
        tables = known_tables(house.store, config.tables)
        steps = (CHANGES_STEP, CURRENT_STEP)
        transforms = used.transforms.for_changes
        for report in drive(None, house, owner=owner, steps=steps, tables=tables, transforms=transforms, log=context.log):
            if isinstance(report, ChangesLogged):
                unique = uniqueness_of(report.duplicates or {}, tables, keys)
                logs = [
                    AssetMaterialization(keys.changes_asset_key(t), metadata=changes_figures(report.changes, t)) for t in tables
                ]
                log_batch(context, [*logs, *unique])
                failed = [e.description for e in unique if not e.passed]
                if failed:
                    raise Failure(description="change_log_seq_unique failed, current state not applied: " + "; ".join(failed))
            elif isinstance(report, CurrentApplied):
                figures = applied_figures(report.current.tables, report.current.applied)
                log_batch(context, list(table_materializations(house, figures, report.facts, keys=keys).values()))

    @job(
        name=keys.job(NEW_TABLES_JOB),
        executor_def=in_process_executor,
        tags=keys.tags("apply", APPLY_LANE),
        description=take_in_new_tables.description,
    )
    def new_tables_job() -> None:
        take_in_new_tables.alias(NEW_TABLES_OP)()

    return new_tables_job


class ForgetConfig(Config):
    table: str = Field(description="schema.table")
    keys_file: str = Field(
        default="",
        description="the private file `cdc-lakehouse forget` wrote the keys to, alive while the command runs (never a "
        "key here: a run's config is kept and shown)",
    )
    rewrite_policies: bool = Field(default=False, description="no keys: apply column policies added since capture")


def build_forget_job(keys: SourceKeys) -> JobDefinition:
    @op(
        name=keys.op(FORGET_OP),
        required_resource_keys=keys.resource_keys("binlog", "lakehouse"),
        description=(
            "Rewrites one table's earlier layers (raw batches, change log, current state, history) and purges what held "
            "the old rows from storage: every row and version of some keys (`cdc-lakehouse forget TABLE --key …`, the "
            "keys read from a file, never from the config), or the column policies added since the table was captured "
            "(`--rewrite-policies`). Exactly once across crashes: run again, it finishes what a stopped run began."
        ),
    )
    def forget_rows(context: OpExecutionContext, config: ForgetConfig) -> None:
        used = SourceResources(context, keys)
        binlog = used.binlog
        house, owner, table = used.lakehouse.get(), run_owner(context.run.run_id), TableRef.parse(config.table)
        policy = binlog.settings().column_policy

        def catch_up() -> None:  # under the rewrite's locks: capture, then the table's change log and current state
            bring_up_to_date(binlog.settings(), house, [str(table)], owner)

        if config.rewrite_policies:
            rewritten = rewrite_policies(catch_up, house, table, policy, owner=owner)
            if rewritten is None:
                context.log.info(f"{table}: no column policy was added to it since it was captured: nothing to rewrite")
                return
            layers, figures = rewritten.layers, {"policy_rewrite": rewritten.key, "policy_columns": ", ".join(sorted(rewritten.columns))}
        elif config.keys_file:
            keys_read = read_keys_file(config.keys_file)
            forgot = forget_keys_in(
                binlog.settings(), house, table, keys_read, policy, owner,
                lambda seq: sinks_published(house.store, str(table), seq), catch_up,
            )  # fmt: skip
            layers = forgot.layers
            figures = {"forget_record": forgot.key, "forgotten_keys": len(forgot.key_hashes), "published_by": ", ".join(forgot.published_by)}
        else:
            raise CdcUserError("The forget job needs keys_file (written by `cdc-lakehouse forget`) or rewrite_policies: true.")
        figures |= {f"{layer}_{what}": n for layer, count in layers.items() for what, n in count.to_json().items()}
        context.log.info(f"{table}: rewritten, {sum(c.files_purged for c in layers.values())} files of older versions purged")
        changes = AssetMaterialization(keys.changes_asset_key(str(table)), metadata=layers.get("changes", LayerCount()).to_json())
        log_batch(context, [changes, *table_materializations(house, {str(table): figures}, keys=keys).values()])

    @job(name=keys.job(FORGET_JOB), executor_def=in_process_executor, tags=keys.tags("forget"), description=forget_rows.description)
    def forget_job() -> None:
        forget_rows.alias(FORGET_OP)()

    return forget_job
