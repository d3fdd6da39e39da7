"""Equality after each apply, at the cost of what it changed: only the keys changed since a table was last found
equal are compared, with the total row counts; the comparison of every row runs on its own cadence.

Each table's checked state (`_state/checked/<schema>/<table>.json`) holds the Delta version of its current state
and the `_cdc_seq` up to which it was last found equal to the source, saved only when it was. The next check reads
from the table's change log the keys of the changes after that seq (before and after images) and compares those
keys' rows on both sides, at one consistent point (verification/consistency.py: keys changed in flight are left
out, as in every comparison), plus the row counts with the keys in flight left out. A table is compared row for
row instead when it has no checked state, has no primary key, was written since its checked version by a commit
that is not the pipeline's (its Delta history) or had every row replaced (a snapshot, a rewrite), had a schema
change or TRUNCATE since, or had most of its rows changed; and when the changed keys or counts differ, so a table that differs is always named with its keys by the
full comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_assets.core.mysql_types import arrow_type
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ROW_OPS
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import APPLIED_SEQ_KEY, COMPACTION_KEY, row_count
from cdc_assets.lake.files import read_rows_after
from cdc_assets.lake.layout import CHANGES, CHECKED_STATE
from cdc_assets.lake.state import known_tables, load_checkpoint, load_schemas
from cdc_assets.lake.store import Lakehouse, MissingObject, ObjectStore
from cdc_assets.source import server as source
from cdc_assets.source.foreign_keys import foreign_keys
from cdc_assets.verification.cascades import cascaded_keys, parents_before_logged
from cdc_assets.verification.consistency import CHANGED_KEYS, EVERY_ROW, ConsistentComparison, compare_many
from cdc_assets.verification.quarantined import comparing_all_but_quarantined

MOST_ROWS = 0.5  # more changed keys than this share of the table's rows (and than FEW_KEYS): every row is read
FEW_KEYS = 20_000  # keys looked up by key whatever the table's size: a few queries either way


@dataclass(frozen=True)
class CheckedState:
    """Where a current-state table was last found equal to its source."""

    version: int  # the current-state table's Delta version compared
    seq: int  # every change up to this `_cdc_seq` was in the rows compared
    source_rows: int
    lakehouse_rows: int
    position: str  # the source's binlog position then


def _state_key(table: TableRef) -> str:
    return f"{CHECKED_STATE}/{table.path}.json"


def load_checked(store: ObjectStore, table: TableRef) -> CheckedState | None:
    """The table's checked state; None when there is none or it cannot be read (the next check reads every row)."""
    try:
        body = json.loads(store.get(_state_key(table)))
        return CheckedState(int(body["version"]), int(body["seq"]), int(body["source_rows"]), int(body["lakehouse_rows"]), str(body["position"]))
    except (MissingObject, ValueError, KeyError, TypeError):
        return None


def save_checked(store: ObjectStore, table: TableRef, state: CheckedState) -> None:
    store.put(_state_key(table), json.dumps(state.__dict__, indent=1, sort_keys=True).encode())


def written_by_others(current: DeltaTable, since_version: int) -> str | None:
    """Why the table's commits after `since_version` up to the version `current` holds may have changed rows other
    than by the pipeline's applies (None: every one is the pipeline's: an apply carrying its applied seq, or its own
    compaction)."""
    version = current.version()
    if version < since_version:
        return f"its Delta table was made again (version {version} < {since_version})"
    if version == since_version:
        return None
    commits = current.history(limit=version - since_version)
    if len(commits) < version - since_version:
        return "its Delta history since it was last found equal is no longer there"
    for commit in commits:
        if APPLIED_SEQ_KEY not in commit and COMPACTION_KEY not in commit:
            return f"version {commit.get('version', '?')} ({commit.get('operation', '?')}) was not written by the pipeline"
        if (commit.get("operationParameters") or {}).get("mode") == "Overwrite":  # rows not from the change log
            return f"version {commit.get('version', '?')} replaced every row (a snapshot or a rewrite)"
    return None


def changed_since(lakehouse: Lakehouse, table: TableRef, seq: int, shape: TableShape) -> set[tuple[Any, ...]] | str:
    """The keys (typed as the source's) of every change in the table's change log after `seq`, before and after
    images; or why every row must be compared instead."""
    log = lakehouse.open(CHANGES, table)
    if log is None:
        return "it has no change log"
    key = list(shape.primary_key)
    names = [f.name for f in pa.schema(log.schema().to_arrow())]
    if any(k not in names for k in key):
        return "its change log lacks a key column"
    access, log_key = lakehouse.file_access(), lakehouse.table_key(CHANGES, table)
    rows = read_rows_after(access, log_key, log, seq, [*key, "_cdc_op", "_cdc_before"])
    ops = set(pc.unique(rows.column("_cdc_op")).to_pylist())
    if ops - set(ROW_OPS):
        return f"a {', '.join(sorted(ops - set(ROW_OPS)))} of it was applied since"
    by_name = {c.name: c for c in shape.columns}
    types = [arrow_type(by_name[k]) for k in key]
    before = rows.column("_cdc_before").combine_chunks()
    keys: set[tuple[Any, ...]] = set()
    try:
        keys.update(zip(*(rows.column(k).cast(t).to_pylist() for k, t in zip(key, types, strict=True)), strict=True))
        if rows.num_rows:
            old = [pc.struct_field(before, k).cast(t) for k, t in zip(key, types, strict=True)]
            valid = pc.is_valid(before)
            keys.update(zip(*(o.filter(valid).to_pylist() for o in old), strict=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError):
        return "its changed keys do not convert to the source's key types"
    return keys


def _narrowing(lakehouse: Lakehouse, reasons: dict[TableRef, str], cascaded: dict[TableRef, set[tuple] | None]):  # noqa: ANN202 (consistency.Narrowing)
    def narrow(table: TableRef, current: DeltaTable, applied_seq: int | None, shape: TableShape) -> set[tuple[Any, ...]] | None:
        state = load_checked(lakehouse.store, table)
        if state is None:
            reasons[table] = "never found equal row for row yet"
            return None
        why = written_by_others(current, state.version)
        keys = changed_since(lakehouse, table, state.seq, shape) if why is None else why
        if isinstance(keys, str):
            reasons[table] = keys
            return None
        if table in cascaded:  # rows a parent's change may have cascaded to, with no row event of their own
            reached = cascaded[table]
            if reached is None:
                reasons[table] = "a cascade from a parent reached it"
                return None
            keys |= reached
        if len(keys) > max(FEW_KEYS, MOST_ROWS * row_count(current)):
            reasons[table] = f"{len(keys)} keys changed: most of its rows"
            return None
        return keys

    return narrow


def cascaded_since_checked(
    settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef]
) -> dict[TableRef, set[tuple] | None]:
    """The child rows (by table, their keys) that the tables' deletes and key updates since each was last found
    equal reached through cascading foreign keys, on a source that does not log cascades: the rows that changed
    without a row event, which the check compares too (verification/cascades.py)."""
    conn = source.connect(settings.url)
    try:
        if source.preflight(conn, settings.url, settings.server_id).logs_foreign_key_cascades:
            return {}
        known = set(known_tables(lakehouse.store))
        fks = [fk for fk in foreign_keys(conn, known) if fk.parent in tables]
    finally:
        conn.close()
    if not fks:
        return {}
    logged: dict[TableRef, pa.Table] = {}
    for parent in {fk.parent for fk in fks}:
        log = lakehouse.open(CHANGES, parent)
        state = load_checked(lakehouse.store, parent)
        if log is None:
            continue
        columns = sorted({c for fk in fks if fk.parent == parent for c in fk.parent_columns})
        since = state.seq if state is not None else 0
        access, log_key = lakehouse.file_access(), lakehouse.table_key(CHANGES, parent)
        logged[parent] = read_rows_after(access, log_key, log, since, ["_cdc_op", "_cdc_before", *columns])
    shapes = load_schemas(lakehouse.store, load_checkpoint(lakehouse.store))
    return cascaded_keys(lakehouse, fks, parents_before_logged(logged, fks), shapes)


def _save_passed(lakehouse: Lakehouse, comparisons: list[ConsistentComparison]) -> None:
    """The checked state of each table found equal, saved on the pool (a write and its syncs to disk, or a PUT, each)."""
    passed = [
        (c.table, CheckedState(c.lake_version, c.checked_seq, c.source_rows, c.lakehouse_rows, c.position))
        for c in comparisons
        if c.ok and not c.not_compared and c.lake_version is not None and c.checked_seq is not None
    ]
    for_each_table(passed, lambda checked: save_checked(lakehouse.store, *checked))


def compare_every_row(settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef]) -> list[ConsistentComparison]:
    """The full comparison (every row of each table), on its own cadence; a table found equal gets its checked
    state, from which the checks after applies compare only what changed."""
    comparisons = comparing_all_but_quarantined(lakehouse, tables, lambda kept: compare_many(settings, lakehouse, kept))
    _save_passed(lakehouse, comparisons)
    return comparisons


def compare_changed(settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef]) -> list[ConsistentComparison]:
    """The check after an apply: each table's keys changed since it was last found equal, and its row counts;
    every row where that cannot be trusted (see the module docstring), and again every row for a table whose
    changed keys or counts differ, so that the result names the keys that differ."""
    reasons: dict[TableRef, str] = {}
    cascaded = cascaded_since_checked(settings, lakehouse, tables)
    tables = tables + sorted((t for t in cascaded if t not in tables), key=str)
    comparisons = comparing_all_but_quarantined(
        lakehouse, tables, lambda kept: compare_many(settings, lakehouse, kept, _narrowing(lakehouse, reasons, cascaded))
    )
    again = [c.table for c in comparisons if c.scope == CHANGED_KEYS and not c.ok and not c.not_compared]
    if again:
        redone = {c.table: c for c in compare_many(settings, lakehouse, again)}
        for table in again:
            reasons[table] = "its changed keys or row counts differed"
        comparisons = [redone.get(c.table, c) for c in comparisons]
    for c in comparisons:
        if c.scope == EVERY_ROW and c.table in reasons:
            c.scope = f"{EVERY_ROW}: {reasons[c.table]}"
    _save_passed(lakehouse, comparisons)
    return comparisons
