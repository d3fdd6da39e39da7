"""Each table's own checks, on its own asset `current/<schema>/<table>`: equality with the source, schema, lag.

The runs that check many tables at once (the apply runs' checks on `current_tables`, `check_equality`, `check_lag`,
the continuous mode's cadence) compare every table of the run in one pass, as before, and record one evaluation
per table they compared on that table's asset, so the UI names the table that differs (with its keys) or falls
behind. The specs are declared with the per-table assets when the definitions load (`build_table_checks`); run on
their own from the UI, they compare the tables selected.
"""

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    In,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    op,
)

from cdc_assets.capture.run import capture_lag
from cdc_assets.core.names import TableRef
from cdc_assets.defs.keys import UNNAMED, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.runtime.step_events import log_batch
from cdc_assets.verification.changed_keys import compare_changed
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.integrity import duplicate_seqs
from cdc_assets.verification.lag import table_lags
from cdc_assets.verification.schema_match import schema_differences

EQUALITY_CHECK = "current_matches_source"
SCHEMA_CHECK = "current_schema_matches_source"
LAG_CHECK = "table_lag"
UNIQUE_CHECK = "change_log_seq_unique"  # on each table's change log, `changes/<schema>/<table>`
TABLE_CHECKS = (EQUALITY_CHECK, SCHEMA_CHECK, LAG_CHECK)  # on current/<schema>/<table>
MAX_KEYS = 50  # differing keys kept in a check's metadata, per kind

CHECK_DESCRIPTIONS = {
    EQUALITY_CHECK: (
        "This table equals its source table at one consistent point (keys changed in flight left out): the keys "
        "changed since it was last found equal after each apply, every row on the check_equality cadence. A "
        "failure names the keys missing, extra or different."
    ),
    SCHEMA_CHECK: "This table has the source table's columns, in order, with the Delta types of the type mapping.",
    LAG_CHECK: (
        "How long ago this table's oldest change not yet in its current state was committed (at least capture's "
        "lag): warns past CDC_LAG_WARN_SECONDS, fails past CDC_LAG_FAIL_SECONDS."
    ),
    UNIQUE_CHECK: (
        "Each _cdc_seq is in this change log once: no row change was appended twice (a run that finds one applies "
        "nothing to current state)."
    ),
}


@dataclass(frozen=True)
class TableVerdict:
    """One check's result for one table, as either an evaluation logged by a run or a check's own result."""

    table: str
    check: str
    passed: bool
    description: str
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    metadata: dict[str, Any] = field(default_factory=dict)

    def asset_key(self, keys: SourceKeys) -> AssetKey:
        """The asset the check is on, of the source `keys` names: the table's change log or current state."""
        return keys.changes_asset_key(self.table) if self.check == UNIQUE_CHECK else keys.table_asset_key(self.table)

    def check_key(self, keys: SourceKeys) -> AssetCheckKey:
        return AssetCheckKey(self.asset_key(keys), self.check)

    def evaluation(self, keys: SourceKeys) -> AssetCheckEvaluation:
        return AssetCheckEvaluation(
            asset_key=self.asset_key(keys),
            check_name=self.check,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=self.metadata,
        )

    def result(self, keys: SourceKeys) -> AssetCheckResult:
        return AssetCheckResult(
            asset_key=self.asset_key(keys),
            check_name=self.check,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=self.metadata,
        )


def _key_value(value: Any) -> Any:
    """A key value as JSON metadata can hold it: DECIMAL, dates and times as their text, bytes as hex."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


def _keys(keys: list[tuple]) -> list[Any]:
    values = [[_key_value(v) for v in k] for k in keys[:MAX_KEYS]]
    return [k if len(k) != 1 else k[0] for k in values]


def equality_verdicts(comparisons: Iterable[ConsistentComparison]) -> list[TableVerdict]:
    """One per table compared: its figures, and the keys that differ (the first MAX_KEYS of each kind)."""
    verdicts = []
    for c in comparisons:
        diff = c.diff
        metadata: dict[str, Any] = {
            "scope": c.scope,
            "position": c.position,
            "applied_seq": c.applied_seq if c.applied_seq is not None else "",
            "source_rows": c.source_rows,
            "lakehouse_rows": c.lakehouse_rows,
            "compared_rows": c.compared_rows,
            "in_flight_keys": c.in_flight_keys,
            "changed_keys": c.changed_keys,
            "source_checksum": c.source_checksum,
            "lakehouse_checksum": c.lakehouse_checksum,
            "not_compared": c.not_compared or "",
        }
        if not c.ok:
            metadata.update(
                {
                    "missing": len(diff.missing),
                    "extra": len(diff.extra),
                    "different": len(diff.different),
                    "missing_keys": MetadataValue.json(_keys(diff.missing)),
                    "extra_keys": MetadataValue.json(_keys(diff.extra)),
                    "different_keys": MetadataValue.json(_keys(diff.different)),
                }
            )
        verdicts.append(
            TableVerdict(str(c.table), EQUALITY_CHECK, c.ok, c.describe(), equality_severity([c]), metadata=metadata)
        )
    return verdicts


def equality_severity(comparisons: Iterable[ConsistentComparison]) -> AssetCheckSeverity:
    """A difference fails a check as an error; a table that could not be compared fails it as a warning: never
    passed, since nothing showed it equal (it is compared again next time)."""
    return AssetCheckSeverity.ERROR if any(c.differs for c in comparisons) else AssetCheckSeverity.WARN


def schema_verdicts(tables: Iterable[str], problems: dict[str, str]) -> list[TableVerdict]:
    """One per table whose columns were compared with the source's."""
    return [
        TableVerdict(
            t,
            SCHEMA_CHECK,
            t not in problems,
            f"{t}: {problems[t]}" if t in problems else f"{t}: columns and types match the source",
        )
        for t in tables
    ]


def lag_verdicts(lags: dict[str, float], tables: Iterable[str], warn: float, fail: float) -> list[TableVerdict]:
    """One per table of `tables` and per table behind (past `warn`), whatever the run's tables: the asset of a
    table falling behind says so as soon as any lag check looks."""
    wanted = set(tables) | {t for t, s in lags.items() if s >= warn}
    verdicts = []
    for t in sorted(wanted & set(lags)):
        seconds = lags[t]
        behind = seconds >= warn
        verdicts.append(
            TableVerdict(
                t,
                LAG_CHECK,
                not behind,
                f"{t} is {seconds:.0f} s behind" if behind else f"{t} within {warn:g} s ({seconds:.0f} s)",
                AssetCheckSeverity.ERROR if seconds >= fail else AssetCheckSeverity.WARN,
                {"lag_seconds": round(seconds, 1), "warn_after_seconds": warn, "fail_after_seconds": fail},
            )
        )
    return verdicts


def uniqueness_verdicts(tables: Iterable[str], duplicates: dict[str, int]) -> list[TableVerdict]:
    """One per change log whose seqs were counted."""
    return [
        TableVerdict(
            t,
            UNIQUE_CHECK,
            not duplicates.get(t),
            f"{t}: {duplicates[t]} duplicate changes" if duplicates.get(t) else f"{t}: each _cdc_seq once",
            metadata={"duplicate_changes": duplicates.get(t, 0)},
        )
        for t in tables
    ]


def table_check_specs(tables: Iterable[str], keys: SourceKeys = UNNAMED) -> list[AssetCheckSpec]:
    """The three checks of each table's current state, and its change log's."""
    return [
        AssetCheckSpec(name, asset=keys.table_asset_key(t), description=CHECK_DESCRIPTIONS[name])
        for t in tables
        for name in TABLE_CHECKS
    ] + [
        AssetCheckSpec(UNIQUE_CHECK, asset=keys.changes_asset_key(t), description=CHECK_DESCRIPTIONS[UNIQUE_CHECK])
        for t in tables
    ]


def selected_tables(selected: Iterable[AssetCheckKey], by_key: dict[AssetKey, str]) -> dict[str, list[str]]:
    """Per check name, the tables whose check of that name is selected."""
    chosen: dict[str, list[str]] = {EQUALITY_CHECK: [], SCHEMA_CHECK: [], LAG_CHECK: [], UNIQUE_CHECK: []}
    for key in selected:
        if key.asset_key in by_key and key.name in chosen:
            chosen[key.name].append(by_key[key.asset_key])
    return {name: sorted(tables) for name, tables in chosen.items()}


# Tables per check definition. Dagster builds a job's dependencies in time that grows with a check definition's
# inputs times its checks (for each input it gathers every check's asset again: dagster 1.13, asset_job.py
# `build_node_deps`): one definition for every table made the code location's load quadratic in the table count
# (2.7 s of 8.4 at 1,000 tables, minutes at 10,000; benchmarks/definitions_load.py). Definitions of this many tables
# keep it linear; a run of checks on more tables runs one step per definition, each comparing its tables in one pass.
TABLES_PER_CHECK_DEFINITION = 100


def build_table_checks(tables: list[str], keys: SourceKeys = UNNAMED) -> list[AssetChecksDefinition]:
    """The per-table checks as subsettable definitions of up to TABLES_PER_CHECK_DEFINITION tables each: what the UI
    lists on each table's asset, and what it runs when a user executes some of them (one run compares the tables
    selected, a pass per definition, not a run per table). The first is `per_table_checks`, the next
    `per_table_checks_2` and so on, over the tables in name order."""
    ordered = sorted(tables)
    size = TABLES_PER_CHECK_DEFINITION
    return [
        _table_checks_definition(ordered[start : start + size], keys, "per_table_checks" + (f"_{start // size + 1}" if start else ""))
        for start in range(0, len(ordered), size)
    ]


def _table_checks_definition(tables: list[str], keys: SourceKeys, name: str) -> AssetChecksDefinition:
    """One subsettable check definition of `tables`. Built as `@multi_asset_check` builds it, but with inputs and
    outputs named by position: that decorator names them after the asset keys, and a key segment such as `a~20b` is
    not a valid Dagster name."""
    specs = table_check_specs(tables, keys)
    by_key = {keys.table_asset_key(t): t for t in tables} | {keys.changes_asset_key(t): t for t in tables}
    inputs = {f"table_{i}": key for i, key in enumerate(by_key)}
    outputs = {f"check_{i}": spec for i, spec in enumerate(specs)}

    @op(
        name=keys.op(name),
        ins={name: In(Nothing) for name in inputs},
        out={name: Out(Nothing, is_required=False) for name in outputs},
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", "cadence"),
        description=(
            "Each table's equality, schema and lag checks on its current state, and its change log's seq check. "
            "A sync, check_equality and the continuous mode record these evaluations for the tables they compare."
        ),
    )
    def per_table_checks(context: OpExecutionContext) -> Iterator[AssetCheckResult]:
        used = SourceResources(context, keys)
        selected = context.selected_asset_check_keys
        thresholds = used.cadence.lag_thresholds
        verdicts = run_table_checks(used.binlog.settings(), used.lakehouse.get(), selected_tables(selected, by_key), thresholds)
        # a comparison may judge other tables too (a cascade's children, a table behind): recorded, not yielded
        log_batch(context, [v.evaluation(keys) for v in verdicts if v.check_key(keys) not in selected])
        for verdict in verdicts:
            if verdict.check_key(keys) in selected:
                yield verdict.result(keys)

    return AssetChecksDefinition.create(
        keys_by_input_name=inputs, node_def=per_table_checks, check_specs_by_output_name=outputs, can_subset=True
    )


def run_table_checks(
    settings: Any, house: Any, chosen: dict[str, list[str]], lag_thresholds: tuple[float, float]
) -> list[TableVerdict]:
    """Each chosen table's chosen checks, each kind in one pass over its tables; a verdict for every one."""
    verdicts: list[TableVerdict] = []
    if chosen[EQUALITY_CHECK]:
        tables = [TableRef.parse(t) for t in chosen[EQUALITY_CHECK]]
        verdicts += equality_verdicts(compare_changed(settings, house, tables))
    if chosen[SCHEMA_CHECK]:
        verdicts += schema_verdicts(chosen[SCHEMA_CHECK], schema_differences(settings, house, chosen[SCHEMA_CHECK]))
    if chosen[UNIQUE_CHECK]:
        verdicts += uniqueness_verdicts(chosen[UNIQUE_CHECK], duplicate_seqs(house, chosen[UNIQUE_CHECK]))
    if chosen[LAG_CHECK]:
        now = time.time()
        warn, fail = lag_thresholds
        lags = table_lags(house, capture_lag(settings, house, now).seconds, now)
        verdicts += [v for v in lag_verdicts(lags, chosen[LAG_CHECK], warn, fail) if v.table in chosen[LAG_CHECK]]
    done = {(v.table, v.check) for v in verdicts}
    for name, names in chosen.items():  # a table the comparison left out (gone from the lakehouse) still gets one
        verdicts += [
            TableVerdict(t, name, True, f"{t}: not compared (not in the lakehouse's table registry)")
            for t in names
            if (t, name) not in done
        ]
    return verdicts
