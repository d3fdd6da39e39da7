"""Current-state tables: `current/<schema>/<table>`, one row per source row (CONTRACT §4, §6).

A run applies, per key, only the newest pending change (chosen by one Spark job over all tables):
upserts write the row, deletes remove it, a key-changing update does both. A change not newer
than the row's `_cdc_seq` is ignored, so replaying changes is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from cdc_assets.change_log import COMMIT_TS_TYPE, SEQ_TYPE, max_seq, open_table, read_query, stats_configuration
from cdc_assets.lakehouse import CHANGES, CURRENT, Lakehouse, TableRef
from cdc_assets.mysql_types import arrow_schema
from cdc_assets.raw_batch import TableVersion

APPLIED_SEQ_KEY = "cdc_applied_seq"
META_COLUMNS = ("_cdc_seq", "_cdc_commit_ts")


def quote(name: str) -> str:
    """A SQL identifier for delta-rs predicates (case and odd characters preserved)."""
    return '"' + name.replace('"', '""') + '"'


def current_schema(version: TableVersion) -> pa.Schema:
    source = arrow_schema(list(version.columns))
    return pa.schema(list(source) + [pa.field("_cdc_seq", SEQ_TYPE), pa.field("_cdc_commit_ts", COMMIT_TS_TYPE)])


@dataclass
class PendingTable:
    """Changes of one table not yet applied to its current state."""

    table: TableRef
    version: TableVersion
    changes: pa.Table
    applied_seq: int | None


def read_pending(lakehouse: Lakehouse, table: TableRef, version: TableVersion) -> PendingTable | None:
    """Changes newer than the current-state table's applied `_cdc_seq`, or None when it is up to date."""
    options = lakehouse.storage_options()
    log = open_table(lakehouse.table_uri(CHANGES, table), options)
    log_max = max_seq(log)
    applied = max_seq(open_table(lakehouse.table_uri(CURRENT, table), options), APPLIED_SEQ_KEY)
    if log is None or log_max is None or (applied is not None and log_max <= applied):
        return None
    where = "" if applied is None else f" WHERE _cdc_seq > {int(applied)}"
    return PendingTable(table, version, read_query(log, f"SELECT * FROM changes{where}", "changes"), applied)


@dataclass(frozen=True)
class ApplyResult:
    table: TableRef
    changes_in: int
    upserted: int
    deleted: int
    inserted: int
    updated: int
    removed: int
    applied_seq: int


def _rows_for(pending: PendingTable, seqs: pa.Array, image: str) -> pa.Table:
    """Rows of the given changes: the changed row (`image="after"`) or its before-image."""
    columns = [c.name for c in pending.version.columns]
    chosen = pending.changes.filter(pc.is_in(pending.changes.column("_cdc_seq"), value_set=seqs.cast(SEQ_TYPE)))
    if image == "after":
        data = {c: chosen.column(c) for c in columns}
    else:
        before = chosen.column("_cdc_before").combine_chunks()
        data = {c: before.field(c) for c in columns}
    data["_cdc_seq"] = chosen.column("_cdc_seq")
    data["_cdc_commit_ts"] = chosen.column("_cdc_commit_ts")
    data["_cdc_action"] = pa.array(["upsert" if image == "after" else "delete"] * chosen.num_rows, pa.string())
    schema = pa.schema(list(current_schema(pending.version)) + [pa.field("_cdc_action", pa.string())])
    return pa.table(data).cast(schema)


def apply_changes(lakehouse: Lakehouse, pending: PendingTable, latest: pa.Table) -> ApplyResult:
    """Merge the newest change per key (`latest`: key, seq, action for this table) into current state."""
    uri = lakehouse.table_uri(CURRENT, pending.table)
    options = lakehouse.storage_options()
    target = open_table(uri, options)
    if target is None:
        schema = current_schema(pending.version)
        target = DeltaTable.create(
            uri, schema=schema, storage_options=options, configuration=stats_configuration(schema)
        )
    actions = latest.column("action")
    upserts = _rows_for(pending, latest.filter(pc.equal(actions, "upsert")).column("seq"), "after")
    deletes = _rows_for(pending, latest.filter(pc.equal(actions, "delete")).column("seq"), "before")
    source = pa.concat_tables([upserts, deletes])
    new_applied = int(pc.max(pending.changes.column("_cdc_seq")).as_py())

    keys = list(pending.version.primary_key)
    if keys:
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    else:  # no primary key: the whole row is the key
        # each term in parentheses: DataFusion would otherwise parse `a IS NOT DISTINCT FROM b AND c ...` wrongly
        on = " AND ".join(
            f"(t.{quote(c.name)} IS NOT DISTINCT FROM s.{quote(c.name)})" for c in pending.version.columns
        )
    assignments = {quote(f.name): f"s.{quote(f.name)}" for f in current_schema(pending.version)}
    newer = "s._cdc_seq > t._cdc_seq"
    metrics = (
        target.merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(new_applied)}),
        )
        .when_matched_delete(predicate=f"s._cdc_action = 'delete' AND {newer}")
        .when_matched_update(updates=assignments, predicate=f"s._cdc_action = 'upsert' AND {newer}")
        .when_not_matched_insert(updates=assignments, predicate="s._cdc_action = 'upsert'")
        .execute()
    )
    return ApplyResult(
        table=pending.table,
        changes_in=pending.changes.num_rows,
        upserted=upserts.num_rows,
        deleted=deletes.num_rows,
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
        removed=int(metrics.get("num_target_rows_deleted", 0)),
        applied_seq=new_applied,
    )


def read_current(lakehouse: Lakehouse, table: TableRef, columns: list[str] | None = None) -> pa.Table | None:
    """The current-state rows of a table (None when it does not exist yet)."""
    dt = open_table(lakehouse.table_uri(CURRENT, table), lakehouse.storage_options())
    if dt is None:
        return None
    select = "*" if columns is None else ", ".join(quote(c) for c in columns)
    return read_query(dt, f"SELECT {select} FROM current", "current")
