"""Current state: every change log's pending changes applied to current/<schema>/<table>."""

import datetime as dt
import json
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetExecutionContext, BackfillPolicy, MaterializeResult, asset

from cdc_assets import current_state
from cdc_assets.assets.changes import table_changes, target_tables
from cdc_assets.assets.metadata import per_table_metadata
from cdc_assets.change_log import DDL_COLUMN, open_table, row_count
from cdc_assets.current_state import (
    SCHEMA_OPS,
    ApplyResult,
    PendingTable,
    applied_seq,
    apply_changes,
    apply_keyless_changes,
    apply_schema_change,
    read_pending,
    version_of_shape,
)
from cdc_assets.ddl import SchemaChange
from cdc_assets.lakehouse import CURRENT, Lakehouse, TableRef
from cdc_assets.locks import Lease, lakehouse_lock
from cdc_assets.parallel import for_each_table
from cdc_assets.partitions import run_owner, tables_partitions
from cdc_assets.raw_batch import TableVersion
from cdc_assets.resources import LakehouseResource
from cdc_assets.stages import CHANGES_STAGE, CURRENT_LOCK, CURRENT_STAGE
from cdc_assets.state import TableProgress, load_progress, save_progress
from spark_resources import SparkSessionResource, TransformsFor


@dataclass
class CurrentReport:
    applied: list[ApplyResult] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    schema_changes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Step:
    """One thing to do to one current-state table, in `_cdc_seq` order across all tables: apply a segment
    of changes (all under one table version) or a schema change."""

    seq: int  # unique: a segment's first change, or the schema change's own (a RENAME's create comes first)
    table: TableRef
    segment: PendingTable | None = None
    change: SchemaChange | None = None
    commit_ts: dt.datetime | None = None


def table_steps(pending: PendingTable) -> list[Step]:
    """A table's pending changes split at its schema changes, each part under the version then in force."""
    changes = pending.changes.sort_by("_cdc_seq")
    is_schema = pc.is_in(changes.column("_cdc_op"), pa.array(SCHEMA_OPS))
    if not pc.any(is_schema).as_py():
        return _segment_steps(pending, pending.version, changes)
    schema_rows = changes.filter(is_schema).to_pylist()
    events = []
    for row in schema_rows:
        detail = json.loads(row[DDL_COLUMN])
        events.append((row["_cdc_seq"], SchemaChange.from_json(detail), row["_cdc_commit_ts"]))
    events.sort(key=lambda e: e[0])
    data = changes.filter(pc.invert(is_schema))
    seqs = data.column("_cdc_seq")
    steps = []
    version = pending.version
    if events[0][1].before is not None:
        version = version_of_shape(events[0][1].before)
    bounds = [e[0] for e in events] + [None]
    lower = None
    for i, upper in enumerate(bounds):
        mask = pc.less(seqs, upper) if upper is not None else pc.is_valid(seqs)
        if lower is not None:
            mask = pc.and_(mask, pc.greater(seqs, lower))
        part = data.filter(mask)
        steps += _segment_steps(pending, version, part)
        if i < len(events):
            seq, change, commit_ts = events[i]
            steps.append(Step(seq, pending.table, change=change, commit_ts=commit_ts))
            if change.after is not None:
                version = version_of_shape(change.after)
            lower = seq
    return steps


def _segment_steps(pending: PendingTable, version: TableVersion, part: pa.Table) -> list[Step]:
    """Changes under one version: one step, or (index only) one per MAX_CHANGES_PER_MERGE changes, read later."""
    if not part.num_rows:
        return []
    if not pending.index_only:
        segment = PendingTable(pending.table, version, part, pending.applied_seq)
        return [Step(int(part.column("_cdc_seq")[0].as_py()), pending.table, segment=segment)]
    seqs = part.column("_cdc_seq")
    steps = []
    size = current_state.MAX_CHANGES_PER_MERGE
    for offset in range(0, len(seqs), size):
        window = seqs.slice(offset, size)
        low, high = int(window[0].as_py()), int(window[-1].as_py())
        segment = PendingTable(pending.table, version, part.slice(0, 0), pending.applied_seq, bounds=(low, high))
        steps.append(Step(low, pending.table, segment=segment))
    return steps


def pending_tables(
    lakehouse: Lakehouse, changes_progress: dict[str, TableProgress], current_progress: dict[str, TableProgress]
) -> list[PendingTable]:
    """Tables whose change log has changes their current state has not taken in."""

    def read(name: str) -> PendingTable | None:
        version_json = changes_progress[name].version
        if version_json is None:  # no change log yet
            return None
        dropped = current_progress[name].dropped_seq if name in current_progress else None
        return read_pending(lakehouse, TableRef.parse(name), TableVersion.from_json(version_json), dropped)

    return [p for p in for_each_table(changes_progress, read) if p is not None]


def _rename_partners(pending: list[PendingTable]) -> set[str]:
    partners: set[str] = set()
    for p in pending:
        if DDL_COLUMN not in p.changes.column_names:
            continue
        for detail in p.changes.column(DDL_COLUMN).drop_null().to_pylist():
            change = json.loads(detail)
            partners |= {t for t in (change.get("renamed_from"), change.get("renamed_to")) if t}
    return partners


def apply_pending(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    tables: Collection[str] | None = None,
    log: Any | None = None,
    owner: str = "cdc-lakehouse",
) -> CurrentReport:
    """Apply the newest pending change per key of `tables` (default: all); one Spark job picks them all.

    Holds the lakehouse's current-state lock so two runs never merge into the same table at once.
    A renamed table's rows move with it, so both sides of a RENAME are taken in together.
    """
    began = time.monotonic()
    report = CurrentReport()
    store = lakehouse.store
    wait = lakehouse.lock_wait_seconds
    with lakehouse_lock(lakehouse, CURRENT_LOCK, "current-state update", owner, wait, log=log) as lease:
        targets = set(target_tables(lakehouse, tables))
        reached: dict[str, TableProgress] = {}
        current: dict[str, TableProgress] = {}
        pending: list[PendingTable] = []
        while True:
            # What the change logs hold now; recorded as this stage's progress once it is applied.
            new = sorted(targets - set(reached))
            reached.update({t: load_progress(store, CHANGES_STAGE, t) for t in new})
            current.update({t: load_progress(store, CURRENT_STAGE, t) for t in new})
            pending += pending_tables(lakehouse, {t: reached[t] for t in new}, current)
            partners = _rename_partners(pending) - targets
            if not partners:
                break
            targets |= partners
        dropped: dict[str, int] = {}
        if pending:
            _apply(lakehouse, transforms, pending, report, lease, log, dropped)
        lease.check()

        def saved(item: tuple[str, TableProgress]) -> None:
            table, progress = item
            floor = dropped.get(table, current[table].dropped_seq)
            save_progress(store, CURRENT_STAGE, table, TableProgress(progress.batch, dropped_seq=floor))

        for_each_table([(t, p) for t, p in reached.items() if p.batch is not None], saved)
        report.tables = sorted(targets)
    report.seconds = time.monotonic() - began
    return report


def _apply(
    lakehouse: Lakehouse,
    transforms: TransformsFor,
    pending: list[PendingTable],
    report: CurrentReport,
    lease: Lease,
    log: Any | None,
    dropped: dict[str, int],
) -> None:
    steps = sorted((s for p in pending for s in table_steps(p)), key=lambda s: s.seq)
    segments = {i: s.segment for i, s in enumerate(steps) if s.segment is not None}
    engine = transforms(sum(p.changes.num_rows for p in pending))
    # One transform picks the newest change per key of every part already read; a part read later (a
    # table with millions of pending changes) gets one of its own when its turn comes.
    keyed = {i: p for i, p in segments.items() if p.version.primary_key and p.bounds is None}
    latest = (
        _by_table_id(engine.latest_change_per_key(pa.concat_tables([_key_events(i, p) for i, p in keyed.items()])))
        if keyed
        else {}
    )

    def run(chain: list[tuple[int, Step]]) -> list[tuple[Step, str | ApplyResult]]:
        """One table's steps (with its rename partners'), in `_cdc_seq` order."""
        done: list[tuple[Step, str | ApplyResult]] = []
        for n, (i, step) in enumerate(chain):
            lease.check()  # on S3 a lease lost to another run means: merge nothing more
            if step.change is not None:
                assert step.commit_ts is not None
                following = chain[n + 1][1] if n + 1 < len(chain) else None
                if _created_with_its_rows(lakehouse, step, following):
                    done.append((step, "created"))
                    continue
                done.append((step, apply_schema_change(lakehouse, step.change, step.seq, step.commit_ts)))
                continue
            segment = segments[i]
            if segment.bounds is not None:
                segment = segment.load(lakehouse)
                if segment.version.primary_key:
                    done.append(
                        (step, apply_changes(lakehouse, segment, engine.latest_change_per_key(_key_events(i, segment))))
                    )
                else:
                    done.append((step, apply_keyless_changes(lakehouse, segment)))
            elif segment.version.primary_key:
                done.append((step, apply_changes(lakehouse, segment, latest[i] if i in latest else _no_changes())))
            else:  # no primary key: duplicates are counted, not keyed (apply_keyless_changes)
                done.append((step, apply_keyless_changes(lakehouse, segment)))
        return done

    results: dict[str, ApplyResult] = {}
    for chain in for_each_table(independent_chains(steps), run):
        for step, outcome in chain:
            if isinstance(outcome, ApplyResult):
                results[str(step.table)] = _sum(results.get(str(step.table)), outcome)
                continue
            assert step.change is not None
            if step.change.action == "drop" and outcome != "already applied":
                dropped[str(step.table)] = step.seq
            elif step.change.action == "create":
                dropped.pop(str(step.table), None)
            report.schema_changes.append(f"{step.table} at {step.seq}: {outcome}")
    report.applied.extend(results.values())
    if log is not None:
        applied = list(results.values())
        log.info(
            f"current state: {len(steps)} steps on {engine.engine} over {len(applied)} tables: "
            f"{sum(r.changes_in for r in applied)} changes -> {sum(r.inserted for r in applied)} inserted, "
            f"{sum(r.updated for r in applied)} updated, {sum(r.removed for r in applied)} deleted"
            + (f"; schema changes: {', '.join(report.schema_changes)}" if report.schema_changes else "")
        )


def _created_with_its_rows(lakehouse: Lakehouse, step: Step, following: Step | None) -> bool:
    """A new table whose first rows come in the very next step is created by that step, rows and all: one
    Delta commit instead of an empty table and then its rows."""
    change = step.change
    return (
        change is not None
        and change.action == "create"
        and change.renamed_from is None
        and change.after is not None
        and following is not None
        and following.segment is not None
        and following.table == step.table
        and following.segment.version.columns == change.after.columns
        and following.segment.version.primary_key == change.after.primary_key
        and applied_seq(lakehouse, step.table) is None
    )


def _no_changes() -> pa.Table:
    # made when needed: building a table makes pyarrow import pandas, half a second of every run's start
    return pa.schema(
        [("table_id", pa.int32()), ("key", pa.string()), ("seq", pa.int64()), ("action", pa.string())]
    ).empty_table()


def _by_table_id(latest: pa.Table) -> dict[int, pa.Table]:
    """The newest changes split by `table_id` (they come ordered by it), without a filter per table."""
    ordered = latest.sort_by([("table_id", "ascending"), ("seq", "ascending")])
    ids = ordered.column("table_id").to_pylist()
    parts: dict[int, pa.Table] = {}
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or ids[end] != ids[start]:
            parts[ids[start]] = ordered.slice(start, end - start)
            start = end
    return parts


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


def _key_events(table_id: int, pending: PendingTable) -> pa.Table:
    """The part's changes as key events for latest_change_per_key. After a TRUNCATE only the changes that
    follow it decide a key's row; the rows before it go."""
    changes = pending.changes.filter(pc.greater(pending.changes.column("_cdc_seq"), pending.truncate_seq or -1))
    return pa.table(
        {
            "table_id": pa.array([table_id] * changes.num_rows, pa.int32()),
            "seq": changes.column("_cdc_seq"),
            "op": changes.column("_cdc_op"),
            "key": changes.column("_cdc_key"),
            "before_key": changes.column("_cdc_before_key"),
        }
    )


def _sum(a: ApplyResult | None, b: ApplyResult) -> ApplyResult:
    if a is None:
        return b
    return ApplyResult(
        b.table,
        a.changes_in + b.changes_in,
        a.upserted + b.upserted,
        a.deleted + b.deleted,
        a.inserted + b.inserted,
        a.updated + b.updated,
        a.removed + b.removed,
        b.applied_seq,
    )


def current_row_count(lakehouse: Lakehouse, table: str) -> int | None:
    """Rows in a current-state table, from the Delta log's file statistics (no data read)."""
    dt = open_table(lakehouse.table_uri(CURRENT, TableRef.parse(table)), lakehouse.storage_options())
    return None if dt is None else row_count(dt)


@asset(
    group_name="current",
    deps=[table_changes],
    partitions_def=tables_partitions,
    backfill_policy=BackfillPolicy.single_run(),
    description=(
        "Current-state tables under current/<schema>/<table> (Delta), one partition per source table: one row "
        "per source row, the source's columns plus _cdc_seq and _cdc_commit_ts, rebuilt by applying the "
        "newest change per key from the change log in _cdc_seq order."
    ),
)
def current_tables(
    context: AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkSessionResource
) -> MaterializeResult:
    house = lakehouse.get()
    report = apply_pending(
        house, spark.transforms, tables=context.partition_keys, log=context.log, owner=run_owner(context.run.run_id)
    )
    applied = {str(r.table): r for r in report.applied}
    rows = dict(zip(report.tables, for_each_table(report.tables, lambda t: current_row_count(house, t)), strict=True))
    per_table = {}
    for name in report.tables:
        r = applied.get(name)
        per_table[name] = {
            "changes_in": r.changes_in if r else 0,
            "inserted": r.inserted if r else 0,
            "updated": r.updated if r else 0,
            "deleted": r.removed if r else 0,
            "rows": rows[name],
        }
    return MaterializeResult(
        metadata={
            "tables": len(report.tables),
            "tables_changed": len(report.applied),
            "changes_in": sum(r.changes_in for r in report.applied),
            "rows_inserted": sum(r.inserted for r in report.applied),
            "rows_updated": sum(r.updated for r in report.applied),
            "rows_deleted": sum(r.removed for r in report.applied),
            "rows_out": sum(v["rows"] or 0 for v in per_table.values()),
            **per_table_metadata(per_table, busiest_by="changes_in"),
            "duration_seconds": round(report.seconds, 3),
        }
    )
