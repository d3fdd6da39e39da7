"""Asset checks: they run after each materialization, in every run the sensor, the schedule, the UI or
`cdc-lakehouse sync` starts. Blocking checks stop downstream work when a layer is wrong. The checks of the
current-state layer compare all the run's tables at once and also record each table's verdict on its own asset
(`defs/table_checks.py`), in one batch of events. Each check's outcome is built by a plain function (`contiguity`,
`seq_uniqueness`, `equality`, `schema_match`, `lag`), which the `sync` job's one step (`defs/sync.py`) calls too."""

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import SourceSettings
from cdc_assets.defs.freshness import lag_thresholds
from cdc_assets.defs.keys import CHANGES_ASSET, CURRENT_ASSET, RAW_ASSET
from cdc_assets.defs.resources import BinlogResource, LakehouseResource
from cdc_assets.defs.table_checks import equality_severity, equality_verdicts, lag_verdicts, schema_verdicts
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.runtime.event_log import log_batch
from cdc_assets.verification.changed_keys import compare_changed
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets.verification.lag import lags_now
from cdc_assets.verification.schema_match import schema_differences

MAX_DETAILS = 50


def run_tables(context: AssetCheckExecutionContext, lakehouse: Lakehouse) -> list[str]:
    """The tables (partitions) the check's run materialized that the lakehouse knows; all of them when the
    run names no partition."""
    partitioned = context.has_partition_key or context.has_partition_key_range
    return known_tables(lakehouse.store, context.partition_keys if partitioned else None)


@asset_check(
    asset=RAW_ASSET,
    blocking=True,
    description=(
        "Raw batches are contiguous: each starts where the previous ended (no gap, no overlap in binlog "
        "position or _cdc_seq), and the checkpoint sits at the end of the last one. Checks what the run added "
        "(a run that added nothing: the last batch and the checkpoint)."
    ),
)
def raw_batches_contiguous(context: AssetCheckExecutionContext, lakehouse: LakehouseResource) -> AssetCheckResult:
    event = context.instance.get_latest_materialization_event(RAW_ASSET)
    materialization = event.asset_materialization if event is not None else None
    first = materialization.metadata.get("first_batch") if materialization is not None else None
    since = first.value if first is not None and first.value else None
    return AssetCheckResult(**contiguity(lakehouse.get(), since if isinstance(since, str) else None))


def contiguity(house: Lakehouse, since: str | None) -> dict[str, Any]:
    """raw_batches_contiguous's outcome from batch `since` on (the check's fields, for a result or an evaluation).
    A run that added no batch (`since` None) checks the last batch against the checkpoint, not the whole chain
    again: that read every manifest the lakehouse ever made, at every capture and every no-op sync."""
    if since is None:
        names = list_batches(house.store)
        since = names[-1] if names else None
    breaks = batch_chain_breaks(house, since)
    return {
        "passed": not breaks,
        "severity": AssetCheckSeverity.ERROR,
        "description": "; ".join(breaks[:3]) if breaks else "contiguous",
        "metadata": {
            "breaks": len(breaks),
            "checked_from": since or "the first batch",
            "details": MetadataValue.json(breaks[:MAX_DETAILS]),
        },
    }


@asset_check(
    asset=CHANGES_ASSET,
    blocking=True,
    description="Every change log of the run's tables has each _cdc_seq once: no row change was appended twice.",
)
def change_log_seq_unique(context: AssetCheckExecutionContext, lakehouse: LakehouseResource) -> AssetCheckResult:
    house = lakehouse.get()
    return AssetCheckResult(**seq_uniqueness(house, run_tables(context, house)))


def seq_uniqueness(house: Lakehouse, tables: list[str]) -> dict[str, Any]:
    """change_log_seq_unique's outcome over `tables`."""
    return uniqueness_of(duplicate_seqs(house, tables), tables)


def uniqueness_of(duplicates: dict[str, int], tables: list[str]) -> dict[str, Any]:
    """change_log_seq_unique's outcome from the duplicates found in `tables` (here, or by a sync's forked child)."""
    return {
        "passed": not duplicates,
        "severity": AssetCheckSeverity.ERROR,
        "description": ", ".join(f"{t}: {n} duplicate changes" for t, n in duplicates.items()) or "unique",
        "metadata": {"tables_checked": len(tables), "tables_with_duplicates": MetadataValue.json(duplicates)},
    }


def comparison_figures(comparisons: list[ConsistentComparison]) -> dict[str, dict[str, object]]:
    """Each table's figures of an equality comparison, for metadata."""
    results: dict[str, dict[str, object]] = {}
    for comparison in comparisons:
        results[str(comparison.table)] = {
            "position": comparison.position,
            "applied_seq": comparison.applied_seq,
            "source_rows": comparison.source_rows,
            "lakehouse_rows": comparison.lakehouse_rows,
            "compared_rows": comparison.compared_rows,
            "in_flight_keys": comparison.in_flight_keys,
            "source_checksum": comparison.source_checksum,
            "lakehouse_checksum": comparison.lakehouse_checksum,
            "not_compared": comparison.not_compared,
            "buckets": comparison.buckets,
            "scope": comparison.scope,
            "changed_keys": comparison.changed_keys,
            "files_read": comparison.files_read,
        }
    return results


def log_comparisons(log: Any, comparisons: list[ConsistentComparison]) -> list[str]:
    """One error line per table that differs (its keys), one info line in all; the sentences of those that differ."""
    failing = [c.describe() for c in comparisons if not c.ok]
    for c in comparisons:  # one line each for the tables that differ or were not compared; figures in the metadata
        if c.differs:
            log.error(c.describe())
        elif c.not_compared:
            log.warning(c.describe())
    left_out = sum(c.in_flight_keys for c in comparisons)
    unseen = sum(1 for c in comparisons if c.not_compared)
    log.info(
        f"{len(comparisons) - len(failing)} of {len(comparisons)} tables equal to the source"
        + (f", {unseen} not compared" if unseen else "")
        + (f" ({left_out} keys changed in flight left out)" if left_out else "")
    )
    return failing


@asset_check(
    asset=CURRENT_ASSET,
    description=(
        "Every current-state table of the run equals its source table at one consistent point: the source is "
        "read inside a consistent snapshot, keys changed after the table's applied _cdc_seq are left out on "
        "both sides. Only the keys changed since the table was last found equal are compared, with the row counts "
        "(every row when that cannot be trusted, e.g. after a commit that is not the pipeline's, and when they "
        "differ); the check_equality job compares every row on its own cadence (CDC_FULL_CHECK_CRON). Records each "
        "table's current_matches_source on its own asset, current/<schema>/<table>, with the keys that differ."
    ),
)
def current_matches_source(
    context: AssetCheckExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource
) -> AssetCheckResult:
    house = lakehouse.get()
    fields, verdicts = equality(binlog.settings(), house, run_tables(context, house), context.log)
    log_batch(context, verdicts)  # each table's own asset
    return AssetCheckResult(**fields)


def equality(
    settings: SourceSettings, house: Lakehouse, tables: list[str], log: Any
) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """current_matches_source's outcome over `tables` (the keys changed since each was last found equal), and each
    table's verdict for its own asset."""
    return equality_of(compare_changed(settings, house, [TableRef.parse(t) for t in tables]), tables, log)


def equality_of(
    comparisons: list[ConsistentComparison], tables: list[str], log: Any
) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """current_matches_source's outcome from the comparisons of `tables` (made here, or by a sync's forked child)."""
    failing = log_comparisons(log, comparisons)
    return {
        "passed": not failing,
        "severity": equality_severity(comparisons),
        "description": "; ".join(failing[:5]) if failing else f"{len(tables)} tables equal to the source",
        "metadata": {
            "tables": len(tables),
            "differing": len(failing),
            "not_compared": sum(1 for c in comparisons if c.not_compared),
            "per_table": MetadataValue.json(comparison_figures(comparisons)),
        },
    }, [v.evaluation() for v in equality_verdicts(comparisons)]


@asset_check(
    asset=CURRENT_ASSET,
    description=(
        "Every current-state table of the run has the source table's columns, in the same order, with the "
        "Delta types of the type mapping, followed only by _cdc_ columns (a table whose columns changed in flight "
        "is left out until the run that applies the change). Records each table's verdict on its own asset."
    ),
)
def current_schema_matches_source(
    context: AssetCheckExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource
) -> AssetCheckResult:
    house = lakehouse.get()
    fields, verdicts = schema_match(binlog.settings(), house, run_tables(context, house))
    log_batch(context, verdicts)  # each table's own asset
    return AssetCheckResult(**fields)


def schema_match(
    settings: SourceSettings, house: Lakehouse, tables: list[str]
) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """current_schema_matches_source's outcome over `tables`, and each table's verdict for its own asset."""
    return schema_match_of(schema_differences(settings, house, tables), tables)


def schema_match_of(problems: dict[str, str], tables: list[str]) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """current_schema_matches_source's outcome from the differences found in `tables` (here, or by a sync's
    forked child)."""
    return {
        "passed": not problems,
        "severity": AssetCheckSeverity.ERROR,
        "description": "; ".join(f"{t}: {p}" for t, p in list(problems.items())[:5]) or f"{len(tables)} schemas match",
        "metadata": {"tables": len(tables), "mismatches": MetadataValue.json(problems)},
    }, [v.evaluation() for v in schema_verdicts(tables, problems)]


@asset_check(
    asset=CURRENT_ASSET,
    description=(
        "Per-table lag: for every table, how long ago the oldest change not yet in its current state was "
        "committed (or, while capture is behind the binlog, the capture lag). Warns past CDC_LAG_WARN_SECONDS and "
        "fails past CDC_LAG_FAIL_SECONDS (default: the freshness windows), naming each table that is behind. Records "
        "the table_lag of the run's tables (every table in check_lag's runs) and of each table behind on their own assets."
    ),
)
def table_lag(context: AssetCheckExecutionContext, binlog: BinlogResource, lakehouse: LakehouseResource) -> AssetCheckResult:
    house = lakehouse.get()
    fields, verdicts = lag(binlog.settings(), house, run_tables(context, house))
    log_batch(context, verdicts)  # each table's own asset
    return AssetCheckResult(**fields)


def lag(
    settings: SourceSettings, house: Lakehouse, tables: list[str]
) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """table_lag's outcome: every table's lag against the thresholds; and the verdicts for the own assets of
    `tables` (the run's) and of each table behind."""
    return lag_of(lags_now(settings, house), tables)


def lag_of(lags: dict[str, float], tables: list[str]) -> tuple[dict[str, Any], list[AssetCheckEvaluation]]:
    """table_lag's outcome from every table's lag (measured here, or by a sync's forked child)."""
    warn, fail = lag_thresholds()
    verdicts = [v.evaluation() for v in lag_verdicts(lags, tables, warn, fail)]
    failing = {t: s for t, s in lags.items() if s >= fail}
    warning = {t: s for t, s in lags.items() if warn <= s < fail}
    behind = failing or warning
    described = ", ".join(f"{t} is {s:.0f} s behind" for t, s in sorted(behind.items(), key=lambda kv: -kv[1])[:10])
    return {
        "passed": not behind,
        "severity": AssetCheckSeverity.ERROR if failing else AssetCheckSeverity.WARN,
        "description": described or f"all {len(lags)} tables within {warn:g} s",
        "metadata": {
            "max_lag_seconds": round(max(lags.values(), default=0.0), 1),
            "tables_failing": MetadataValue.json(sorted(failing)),
            "tables_warning": MetadataValue.json(sorted(warning)),
            "warn_after_seconds": warn,
            "fail_after_seconds": fail,
            "per_table_lag_seconds": MetadataValue.json({t: round(s, 1) for t, s in sorted(lags.items())}),
        },
    }, verdicts


ALL_CHECKS = [
    raw_batches_contiguous,
    change_log_seq_unique,
    current_matches_source,
    current_schema_matches_source,
    table_lag,
]
