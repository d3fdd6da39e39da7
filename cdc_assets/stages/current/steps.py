"""The steps of the current-state stage, on either engine: what is done to which table in `_cdc_seq` order, and
the report of what was done."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import CREATE, DROP, SCHEMA_OPS, TRUNCATE
from cdc_assets.core.shapes import SchemaChange, TableShape
from cdc_assets.lake.quarantine import Quarantine
from cdc_assets.stages.current.apply import ApplyResult, PendingTable


@dataclass
class CurrentReport:
    applied: list[ApplyResult] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    schema_changes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    quarantined: dict[str, Quarantine] = field(default_factory=dict)  # tables held back this run (lake/quarantine)


@dataclass(frozen=True)
class Span:
    """A table's changes with a seq in (`after`, `upto`]: all under one shape, with no schema change among them.
    After `truncate_seq` (the last TRUNCATE among them) only the changes that follow it count, and every row
    written before it goes."""

    shape: TableShape
    after: int
    upto: int
    truncate_seq: int | None


@dataclass(frozen=True)
class SchemaStep:
    seq: int
    change: SchemaChange
    commit_ts: dt.datetime


def table_plan(
    events: list[dict[str, Any]], shape: TableShape, after: int, upto: int, holds_changes: Callable[[int, int], bool]
) -> list[Span | SchemaStep]:
    """What is done to one table, in `_cdc_seq` order, on either engine: its pending changes in (`after`, `upto`]
    cut into spans at its schema changes, each span under the shape then in force (the shape before the first
    schema change, else `shape`), with the last TRUNCATE inside it. `events` are the pending TRUNCATE and schema
    change rows (`_cdc_seq`, `_cdc_op`, `_cdc_commit_ts`, `_cdc_ddl`) in seq order; a span for which
    `holds_changes(lower, upper)` says no row change or TRUNCATE lies in (lower, upper] is left out."""
    changes = [e for e in events if e["_cdc_op"] in SCHEMA_OPS]
    truncates = [int(e["_cdc_seq"]) for e in events if e["_cdc_op"] == TRUNCATE]
    if changes:
        first = SchemaChange.from_json(json.loads(changes[0]["_cdc_ddl"]))
        if first.before is not None:
            shape = first.before
    plan: list[Span | SchemaStep] = []
    lower = after
    for event in [*changes, None]:
        upper = int(event["_cdc_seq"]) - 1 if event is not None else upto
        if upper > lower and holds_changes(lower, upper):
            within = [t for t in truncates if lower < t <= upper]
            plan.append(Span(shape, lower, upper, max(within) if within else None))
        if event is None:
            break
        change = SchemaChange.from_json(json.loads(event["_cdc_ddl"]))
        plan.append(SchemaStep(int(event["_cdc_seq"]), change, event["_cdc_commit_ts"]))
        if change.after is not None:
            shape = change.after
        lower = int(event["_cdc_seq"])
    return plan


@dataclass(frozen=True)
class SparkSegment:
    """The changes of one table between two of its schema changes, under one shape: those with a seq in
    (`after`, `upto`], read from `frame()` (the table's pending change-log rows) by Spark tasks."""

    shape: TableShape
    frame: Callable[[], Any]  # the Spark DataFrame, planned on first use: a small table's job never needs it
    after: int
    upto: int
    truncate_seq: int | None
    changes: int  # changes pending in the whole table: sizes the write


@dataclass(frozen=True)
class Step:
    """One thing to do to one current-state table, in `_cdc_seq` order across all tables: apply a segment
    of changes (all under one table version) or a schema change."""

    seq: float  # the sort key: a segment's first change (on Spark: just after the event before it), or the
    # schema change's own seq (a RENAME's create comes first)
    table: TableRef
    segment: PendingTable | SparkSegment | None = None
    change: SchemaChange | None = None
    commit_ts: dt.datetime | None = None


def independent_chains(steps: list[Step]) -> list[list[tuple[int, Step]]]:
    """The steps (with their index) grouped by table, each group in `_cdc_seq` order; the two sides of a RENAME
    share a group, as the new table is made from the old one's rows. Groups can be applied side by side."""
    parent: dict[str, str] = {}

    def root(table: str) -> str:
        while parent.setdefault(table, table) != table:
            table = parent[table]
        return table

    for step in steps:
        root(str(step.table))
        if step.change is not None:
            for partner in (step.change.renamed_from, step.change.renamed_to):
                if partner is not None:
                    parent[root(str(partner))] = root(str(step.table))
    chains: dict[str, list[tuple[int, Step]]] = {}
    for i, step in enumerate(steps):
        chains.setdefault(root(str(step.table)), []).append((i, step))
    return list(chains.values())


def record_outcomes(
    chains: list[list[tuple[Step, str | ApplyResult]]],
    report: CurrentReport,
    dropped: dict[str, int | None],
    log: Any | None,
    steps: int,
    engine: str,
) -> None:
    """What the steps did, into the report, and which tables a DROP or a CREATE left dropped or not."""
    results: dict[str, ApplyResult] = {}
    for chain in chains:
        for step, outcome in chain:
            if isinstance(outcome, ApplyResult):
                name = str(step.table)
                results[name] = results[name] + outcome if name in results else outcome
                continue
            assert step.change is not None
            if step.change.action == DROP and outcome != "already applied":
                dropped[str(step.table)] = step.seq
            elif step.change.action == CREATE:
                dropped[str(step.table)] = None  # created again: no longer dropped
            report.schema_changes.append(f"{step.table} at {step.seq}: {outcome}")
    report.applied.extend(results.values())
    if log is not None:
        applied = list(results.values())
        log.info(
            f"current state: {steps} steps on {engine} over {len(applied)} tables: "
            f"{sum(r.changes_in for r in applied)} changes -> {sum(r.inserted for r in applied)} inserted, "
            f"{sum(r.updated for r in applied)} updated, {sum(r.removed for r in applied)} deleted"
            + (f"; schema changes: {', '.join(report.schema_changes)}" if report.schema_changes else "")
        )
