"""Per-table change logs: `changes/<schema>/<table>`, one row per row change (docs/lakehouse.md: Lakehouse layout).

Each table gets one atomic Delta append per run, holding only changes newer than what the table
already has (its highest `_cdc_seq`), so re-processing a batch after a crash adds nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core import failpoints
from cdc_assets.core.arrow import sorted_rows, where
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import DELETE, INSERT, UPDATE
from cdc_assets.lake.delta import (
    MAX_SEQ_KEY,
    compact_small_files,
    fenced,
    max_seq,
    plain_schema,
    read_query,
    seq_commit,
    seq_landed,
    table_configuration,
    writer_properties,
)
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.rows import SEQ_TYPE, cast_column, conform_to_log, conformed_schema, named_as

CHANGE_LOG_FILE_BYTES = 16 * 1024 * 1024  # change-log files are compacted to this size


def _conform_change_log(
    uri: str, existing: DeltaTable, incoming: pa.Schema, options: dict[str, str] | None
) -> pa.Schema:
    """Rewrite the change log in one commit when a column's type changed (a MODIFY COLUMN): its rows are
    cast to a type that holds old and new values alike, so every version stays readable in one table; or when a
    column was renamed in case alone: the log takes the source's new name."""
    current = plain_schema(existing)
    target = conformed_schema(current, incoming)
    if target is None:
        return current
    rows = read_query(existing, "SELECT * FROM changes", "changes")
    rewritten = conform_to_log(rows, target)
    write_deltalake(
        uri,
        rewritten,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=options,
        commit_properties=seq_commit(MAX_SEQ_KEY, max_seq(existing) or 0),
        writer_properties=writer_properties(rewritten),
    )
    failpoints.hit("changes.log_rewritten")
    existing.update_incremental()  # the caller appends through this object next
    return target


@dataclass(frozen=True)
class AppendResult:
    table: TableRef
    appended: int
    inserts: int
    updates: int
    deletes: int
    max_seq: int | None

    def __add__(self, later: AppendResult) -> AppendResult:
        """Two appends to one table in a run, as one."""
        return AppendResult(
            later.table,
            self.appended + later.appended,
            self.inserts + later.inserts,
            self.updates + later.updates,
            self.deletes + later.deletes,
            later.max_seq,
        )


def append_changes(lakehouse: Lakehouse, table: TableRef, changes: pa.Table) -> AppendResult:
    """Append the changes newer than the change log's highest `_cdc_seq`, atomically."""
    uri = lakehouse.table_uri(CHANGES, table)
    options = lakehouse.storage_options()
    existing = lakehouse.open(CHANGES, table)
    watermark = max_seq(existing)
    if watermark is not None and changes.num_rows:
        changes = where(changes, pc.greater(changes.column("_cdc_seq"), pa.scalar(watermark, SEQ_TYPE)))
    if changes.num_rows == 0:
        return AppendResult(table, 0, 0, 0, 0, watermark)
    changes = sorted_rows(changes, "_cdc_seq")
    if existing is not None:
        schema = _conform_change_log(uri, existing, changes.schema, options)
        changes = named_as(changes, schema.names)
        changes = pa.Table.from_arrays(
            [
                cast_column(changes.column(f.name), schema.field(f.name).type)
                if f.name in schema.names
                else changes.column(f.name)
                for f in changes.schema
            ],
            names=changes.column_names,
        )
    new_max = int(pc.max(changes.column("_cdc_seq")).as_py())
    failpoints.hit("changes.before_commit")
    with fenced(lakehouse.table_key(CHANGES, table), seq_landed(uri, options, MAX_SEQ_KEY, new_max)):
        write_deltalake(
            existing if existing is not None else uri,  # the table read for the watermark: fenced from its version
            changes,
            mode="append",
            schema_mode="merge",
            configuration=table_configuration(changes.schema) if existing is None else None,
            storage_options=options,
            commit_properties=seq_commit(MAX_SEQ_KEY, new_max),
            writer_properties=writer_properties(changes),
        )
    if existing is not None:
        compact_small_files(existing, CHANGE_LOG_FILE_BYTES, failpoint="changes.compacting")
    ops = changes.column("_cdc_op")
    return AppendResult(
        table,
        changes.num_rows,
        inserts=pc.sum(pc.equal(ops, INSERT)).as_py() or 0,
        updates=pc.sum(pc.equal(ops, UPDATE)).as_py() or 0,
        deletes=pc.sum(pc.equal(ops, DELETE)).as_py() or 0,
        max_seq=new_max,
    )


