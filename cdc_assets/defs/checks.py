"""Asset checks. The raw batches' contiguity is an asset check of its own, blocking what follows it in a run. Each
table's checks are on its own assets: `change_log_seq_unique` on `changes/<schema>/<table>` (assets/lakehouse_tables,
blocking its apply), equality, schema and lag on `current/<schema>/<table>` (`defs/table_checks.py`). The runs that
check many tables at once (the sync job's one step, the continuous mode, check_equality) compare them in one pass and
record one evaluation per table; the functions here (`contiguity`, `schema_match`, `lag`, and the `_of` halves,
`uniqueness_of` and `equality_of` among them, for what the pipeline's driver found, in the run or in a sync's forked
child) build those evaluations."""

from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from cdc_assets.core.settings import SourceSettings
from cdc_assets.defs.keys import SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.defs.table_checks import equality_verdicts, lag_verdicts, schema_verdicts, uniqueness_verdicts
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.integrity import chain_checked_from
from cdc_assets.verification.lag import lags_now
from cdc_assets.verification.schema_match import schema_differences

MAX_DETAILS = 50


def build_raw_checks(keys: SourceKeys) -> list[AssetChecksDefinition]:
    """The checks on the source's raw batches: raw_batches_contiguous."""

    @asset_check(
        asset=keys.raw_asset,
        name="raw_batches_contiguous",
        blocking=True,
        required_resource_keys=keys.resource_keys("lakehouse"),
        description=(
            "Raw batches are contiguous: each starts where the previous ended (no gap, no overlap in binlog "
            "position or _cdc_seq), and the checkpoint sits at the end of the last one. Checks what the run added "
            "(a run that added nothing: the last batch and the checkpoint)."
        ),
    )
    def raw_batches_contiguous(context: AssetCheckExecutionContext) -> AssetCheckResult:
        event = context.instance.get_latest_materialization_event(keys.raw_asset)
        materialization = event.asset_materialization if event is not None else None
        first = materialization.metadata.get("first_batch") if materialization is not None else None
        since = first.value if first is not None and first.value else None
        house = SourceResources(context, keys).lakehouse.get()
        return AssetCheckResult(**contiguity(house, since if isinstance(since, str) else None))

    return [raw_batches_contiguous]


def contiguity(house: Lakehouse, since: str | None) -> dict[str, Any]:
    """raw_batches_contiguous's outcome from batch `since` on (the check's fields, for a result or an evaluation;
    `since` None: a run that added no batch, verification.integrity.chain_checked_from)."""
    checked_from, breaks = chain_checked_from(house, since)
    return contiguity_of(breaks, checked_from)


def contiguity_of(breaks: list[str], since: str | None) -> dict[str, Any]:
    """raw_batches_contiguous's fields from the breaks found from batch `since` on (here, or by the pipeline driver's
    capture step)."""
    return {
        "passed": not breaks,
        "severity": AssetCheckSeverity.ERROR,
        "description": "; ".join(breaks[:3]) if breaks else "contiguous",
        "metadata": {
            "breaks": len(breaks),
            "checked_from": since or "the first batch",
            "details": MetadataValue.md("\n".join(f"- {b}" for b in breaks[:MAX_DETAILS]) or "none"),
        },
    }


def uniqueness_of(duplicates: dict[str, int], tables: list[str], keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """change_log_seq_unique of each of `tables` from the duplicates the pipeline's driver found in them."""
    return [v.evaluation(keys) for v in uniqueness_verdicts(tables, duplicates)]


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


def equality_of(comparisons: list[ConsistentComparison], log: Any, keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """current_matches_source of each table the pipeline's driver compared, its differences logged."""
    log_comparisons(log, comparisons)
    return [v.evaluation(keys) for v in equality_verdicts(comparisons)]


def schema_match(settings: SourceSettings, house: Lakehouse, tables: list[str], keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """current_schema_matches_source of each of `tables`."""
    return schema_match_of(schema_differences(settings, house, tables), tables, keys)


def schema_match_of(problems: dict[str, str], tables: list[str], keys: SourceKeys) -> list[AssetCheckEvaluation]:
    """current_schema_matches_source of each of `tables` from the differences found (here, or by a sync's forked
    child)."""
    return [v.evaluation(keys) for v in schema_verdicts(tables, problems)]


def lag(
    settings: SourceSettings, house: Lakehouse, tables: list[str], thresholds: tuple[float, float], keys: SourceKeys
) -> list[AssetCheckEvaluation]:
    """table_lag of each of `tables` (the run's) and of each table behind, from every table's lag now."""
    return lag_of(lags_now(settings, house), tables, thresholds, keys)


def lag_of(
    lags: dict[str, float], tables: list[str], thresholds: tuple[float, float], keys: SourceKeys
) -> list[AssetCheckEvaluation]:
    """table_lag from every table's lag (measured here, or by a sync's forked child), warning and failing past
    `thresholds` (the cadence resource's CDC_LAG_WARN/FAIL_SECONDS)."""
    warn, fail = thresholds
    return [v.evaluation(keys) for v in lag_verdicts(lags, tables, warn, fail)]
