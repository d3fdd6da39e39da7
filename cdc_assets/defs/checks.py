"""Asset checks: they run after each materialization, in every run the sensor, the schedule, the UI or
`cdc-lakehouse sync` starts. Blocking checks stop downstream work when a layer is wrong. The checks of the
current-state layer compare all the run's tables at once and also record each table's verdict on its own asset
(`defs/table_checks.py`), in one batch of events."""

import time
from typing import Any

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from cdc_assets.capture.run import capture_lag
from cdc_assets.core.names import TableRef
from cdc_assets.defs.event_log import log_batch
from cdc_assets.defs.freshness import lag_thresholds
from cdc_assets.defs.keys import CHANGES_ASSET, CURRENT_ASSET, RAW_ASSET
from cdc_assets.defs.resources import BinlogResource, LakehouseResource
from cdc_assets.defs.table_checks import equality_verdicts, lag_verdicts, schema_verdicts
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.changed_keys import compare_changed
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets.verification.lag import table_lags
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
        "position or _cdc_seq), and the checkpoint sits at the end of the last one. Checks what the run added."
    ),
)
def raw_batches_contiguous(context: AssetCheckExecutionContext, lakehouse: LakehouseResource) -> AssetCheckResult:
    event = context.instance.get_latest_materialization_event(RAW_ASSET)
    materialization = event.asset_materialization if event is not None else None
    first = materialization.metadata.get("first_batch") if materialization is not None else None
    since = first.value if first is not None and first.value else None
    breaks = batch_chain_breaks(lakehouse.get(), since if isinstance(since, str) else None)
    return AssetCheckResult(
        passed=not breaks,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(breaks[:3]) if breaks else "contiguous",
        metadata={"breaks": len(breaks), "checked_from": since or "the first batch", "details": MetadataValue.json(breaks[:MAX_DETAILS])},
    )


@asset_check(
    asset=CHANGES_ASSET,
    blocking=True,
    description="Every change log of the run's tables has each _cdc_seq once: no row change was appended twice.",
)
def change_log_seq_unique(context: AssetCheckExecutionContext, lakehouse: LakehouseResource) -> AssetCheckResult:
    house = lakehouse.get()
    tables = run_tables(context, house)
    duplicates = duplicate_seqs(house, tables)
    return AssetCheckResult(
        passed=not duplicates,
        severity=AssetCheckSeverity.ERROR,
        description=", ".join(f"{t}: {n} duplicate changes" for t, n in duplicates.items()) or "unique",
        metadata={"tables_checked": len(tables), "tables_with_duplicates": MetadataValue.json(duplicates)},
    )


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
    for text in failing:  # one line each for the tables that differ; every table's figures are in the metadata
        log.error(text)
    left_out = sum(c.in_flight_keys for c in comparisons)
    log.info(
        f"{len(comparisons) - len(failing)} of {len(comparisons)} tables equal to the source"
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
    tables = run_tables(context, house)
    comparisons = compare_changed(binlog.settings(), house, [TableRef.parse(t) for t in tables])
    results = comparison_figures(comparisons)
    failing = log_comparisons(context.log, comparisons)
    log_batch(context, [v.evaluation() for v in equality_verdicts(comparisons)])  # each table's own asset
    return AssetCheckResult(
        passed=not failing,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(failing[:5]) if failing else f"{len(tables)} tables equal to the source",
        metadata={
            "tables": len(tables),
            "differing": len(failing),
            "not_compared": sum(1 for c in comparisons if c.not_compared),
            "per_table": MetadataValue.json(results),
        },
    )


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
    tables = run_tables(context, house)
    problems = schema_differences(binlog.settings(), house, tables)
    log_batch(context, [v.evaluation() for v in schema_verdicts(tables, problems)])  # each table's own asset
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        description="; ".join(f"{t}: {p}" for t, p in list(problems.items())[:5]) or f"{len(tables)} schemas match",
        metadata={"tables": len(tables), "mismatches": MetadataValue.json(problems)},
    )


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
    warn, fail = lag_thresholds()
    house, now = lakehouse.get(), time.time()
    lags = table_lags(house, capture_lag(binlog.settings(), house, now).seconds, now)
    # each table's own asset: the run's tables (every table in check_lag's runs), and any table behind
    log_batch(context, [v.evaluation() for v in lag_verdicts(lags, run_tables(context, house), warn, fail)])
    failing = {t: s for t, s in lags.items() if s >= fail}
    warning = {t: s for t, s in lags.items() if warn <= s < fail}
    behind = failing or warning
    described = ", ".join(f"{t} is {s:.0f} s behind" for t, s in sorted(behind.items(), key=lambda kv: -kv[1])[:10])
    return AssetCheckResult(
        passed=not behind,
        severity=AssetCheckSeverity.ERROR if failing else AssetCheckSeverity.WARN,
        description=described or f"all {len(lags)} tables within {warn:g} s",
        metadata={
            "max_lag_seconds": round(max(lags.values(), default=0.0), 1),
            "tables_failing": MetadataValue.json(sorted(failing)),
            "tables_warning": MetadataValue.json(sorted(warning)),
            "warn_after_seconds": warn,
            "fail_after_seconds": fail,
            "per_table_lag_seconds": MetadataValue.json({t: round(s, 1) for t, s in sorted(lags.items())}),
        },
    )


ALL_CHECKS = [
    raw_batches_contiguous,
    change_log_seq_unique,
    current_matches_source,
    current_schema_matches_source,
    table_lag,
]
