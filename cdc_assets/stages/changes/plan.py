"""What a change-log run takes in, planned from the raw batches' manifests before any row is read, whatever
engine then reads them: the batches, each table version's shape and key positions, the rows of TRUNCATEs and
schema changes, and how each table's progress moves once its changes have landed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import TRUNCATE
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.shapes import TableShape, shape_from_json
from cdc_assets.lake.layout import CHANGES_STAGE
from cdc_assets.lake.quarantine import Quarantine
from cdc_assets.lake.raw_batches import RAW_ROWS_SCHEMA, BatchManifest
from cdc_assets.lake.state import TableProgress, save_progress
from cdc_assets.lake.store import ObjectStore
from cdc_assets.stages.changes.log import AppendResult

TABLE_KEYS_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.string(), nullable=False),
        pa.field("table_version", pa.int32(), nullable=False),
        pa.field("key_idx", pa.list_(pa.int32()), nullable=False),
    ]
)


@dataclass
class ChangesReport:
    batches: list[str] = field(default_factory=list)
    rows_in: int = 0
    appended: dict[str, AppendResult] = field(default_factory=dict)
    seconds: float = 0.0
    quarantined: dict[str, Quarantine] = field(default_factory=dict)  # tables held back this run (lake/quarantine)

    @property
    def rows_out(self) -> int:
        return sum(r.appended for r in self.appended.values())


TRUNCATE_VERSION_IDS = -1


def _statement_row(batch: str, version: TableShape, version_id: int, statement: dict, op: str) -> pa.Table:
    """A TRUNCATE or a schema change as a change at the statement's `_cdc_seq`, with no row image."""
    row = {
        "seq": int(statement["seq"]),
        "schema": version.table.schema,
        "table": version.table.table,
        "table_version": version_id,
        "op": op,
        "gtid": statement.get("gtid"),
        "commit_ts": int(statement.get("commit_ts") or 0) * 1_000_000,
        "before": None,
        "after": None,
    }
    table = pa.Table.from_pylist([row], schema=RAW_ROWS_SCHEMA)
    return table.append_column("batch", pa.array([batch], pa.string()))


Piece = list[tuple[BatchManifest, pa.Table | None, tuple[int | None, int | None]]]


def _in_window(seq: int, window: tuple[int | None, int | None]) -> bool:
    low, high = window
    return (low is None or seq > low) and (high is None or seq <= high)


@dataclass
class ChangePlan:
    """What one transform takes in, before any row is read: the batches whose rows it reads (or slices of one
    already read), the tables' shapes by (batch, version id), each version's key positions, the rows of
    TRUNCATEs and schema changes (one each, made here) and their `_cdc_ddl` texts."""

    reads: list[tuple[BatchManifest, pa.Table | None]] = field(default_factory=list)
    versions: dict[tuple[str, int], TableShape] = field(default_factory=dict)
    ddl: dict[tuple[str, int], str] = field(default_factory=dict)
    keys: list[dict] = field(default_factory=list)
    statement_rows: list[pa.Table] = field(default_factory=list)

    def table_keys(self) -> pa.Table:
        return pa.Table.from_pylist(self.keys, schema=TABLE_KEYS_SCHEMA)


def plan_piece(
    piece: Piece, starts: dict[str, str | None], progress: dict[str, TableProgress], newest: dict[str, TableShape]
) -> ChangePlan:
    """The plan of one piece for the tables in `starts`; `newest` learns each table's newest shape."""
    plan = ChangePlan()
    for manifest, slice_rows, window in piece:
        touched = [(i, v) for i, v in manifest.shapes.items() if str(v.table) in starts]
        truncates = [t for t in manifest.truncates() if t["table"] in starts and _in_window(int(t["seq"]), window)]
        changes = [
            (s, c)
            for s, c in manifest.schema_changes()
            if c["table"] in starts and _in_window(int(c.get("seq", s["seq"])), window)
        ]
        if not touched and not truncates and not changes:
            continue
        if touched:
            plan.reads.append((manifest, slice_rows))
        for version_id, shape in touched:
            plan.versions[(manifest.name, version_id)] = shape
            plan.keys.append({"batch": manifest.name, "table_version": version_id, "key_idx": shape.key_indexes()})
            newest[str(shape.table)] = shape
        statements: list[tuple[str, dict, TableShape | None, dict | None]] = []
        for statement in truncates:
            known = newest.get(statement["table"]) or progress[statement["table"]].shape
            statements.append((TRUNCATE, statement, known, None))
        for statement, change in changes:
            version = shape_from_json(TableRef.parse(change["table"]), change["after"] or change["before"])
            own = {**statement, "seq": change.get("seq", statement["seq"])}
            statements.append((change["action"], own, version, change))
        for index, (op, statement, version, change) in enumerate(statements):
            if version is None:  # a table never seen with a row or a shape: nothing to empty or reshape
                continue
            version_id = TRUNCATE_VERSION_IDS - index  # batch-local ids below every real version's
            plan.versions[(manifest.name, version_id)] = version
            plan.keys.append({"batch": manifest.name, "table_version": version_id, "key_idx": version.key_indexes()})
            plan.statement_rows.append(_statement_row(manifest.name, version, version_id, statement, op))
            if change is not None:
                flavor = {"flavor": manifest.raw["server"]["flavor"]} if manifest.raw.get("server", {}).get("flavor") else {}
                plan.ddl[(manifest.name, version_id)] = json.dumps({"statement": statement["query"], **change, **flavor})
                newest[str(version.table)] = version  # also for a dropped table: its last shape
        for table, shape in manifest.raw.get("schemas", {}).items():
            if table in starts and shape is not None:  # the table's shape at the batch's end
                newest[table] = TableShape.from_json(TableRef.parse(table), shape)
    return plan


def record_progress(
    store: ObjectStore,
    starts: dict[str, str | None],
    progress: dict[str, TableProgress],
    newest: dict[str, TableShape],
    last: str,
) -> None:
    """Progress moves past every batch read up to `last`, also those without changes of the table; the table
    version is the newest whose changes have landed (the caller has checked its lease)."""
    moved = [t for t in starts if starts[t] is None or starts[t] < last]
    for table in moved:
        progress[table] = TableProgress(last, newest.get(table, progress[table].shape))

    def save(table: str) -> None:
        save_progress(store, CHANGES_STAGE, table, progress[table])
        failpoints.hit("changes.progress_partly_saved")

    for_each_table(moved, save)
