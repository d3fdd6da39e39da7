"""Current-state tables: `current/<schema>/<table>`, one row per source row (CONTRACT §4, §6).

A run applies, per key, only the newest pending change (chosen by one Spark job over all tables):
upserts write the row, deletes remove it, a key-changing update does both. A change not newer
than the row's `_cdc_seq` is ignored, so replaying changes is a no-op.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from cdc_assets.change_log import (
    COMMIT_TS_TYPE,
    DDL_COLUMN,
    SEQ_TYPE,
    compact_small_files,
    max_seq,
    open_table,
    read_query,
    table_configuration,
)
from cdc_assets.ddl import Default, SchemaChange, TableShape
from cdc_assets.errors import CdcUserError
from cdc_assets.lakehouse import CHANGES, CURRENT, Lakehouse, TableRef
from cdc_assets.mysql_types import ColumnSpec, arrow_schema, arrow_type, decode_column, format_time
from cdc_assets.raw_batch import TableVersion

APPLIED_SEQ_KEY = "cdc_applied_seq"
META_COLUMNS = ("_cdc_seq", "_cdc_commit_ts")


def quote(name: str) -> str:
    """A SQL identifier for delta-rs predicates (case and odd characters preserved)."""
    return '"' + name.replace('"', '""') + '"'


DUP_COLUMN = "_cdc_dup"  # keyless tables: 0, 1, 2 ... among identical rows, so each row has a key of its own
DUP_TYPE = pa.int32()


def current_schema(version: TableVersion) -> pa.Schema:
    source = arrow_schema(list(version.columns))
    meta = [pa.field("_cdc_seq", SEQ_TYPE), pa.field("_cdc_commit_ts", COMMIT_TS_TYPE)]
    if not version.primary_key:
        meta.append(pa.field(DUP_COLUMN, DUP_TYPE))
    return pa.schema(list(source) + meta)


def current_configuration(schema: pa.Schema) -> dict[str, str]:
    """Table properties of a current-state table: safe statistics and the file size merges keep to."""
    return {**table_configuration(schema), "delta.targetFileSize": str(CURRENT_FILE_BYTES)}


def sorted_by_key(rows: pa.Table, key: list[str] | tuple[str, ...]) -> pa.Table:
    """Rows in primary-key order, in one Arrow batch, so the files written from them hold disjoint key ranges
    (delta-rs deals separate batches out to its writers in turn: their files would interleave)."""
    ordered = rows.sort_by([(k, "ascending") for k in key]) if key and rows.num_rows else rows
    return ordered.combine_chunks()


def number_duplicates(rows: pa.Table, columns: list[str]) -> pa.Array:
    """`_cdc_dup` for rows of a keyless table: the ordinal of each row among the rows identical to it."""
    counts: dict[tuple, int] = {}
    ordinals = []
    for values in zip(*(rows.column(c).to_pylist() for c in columns), strict=True) if rows.num_rows else []:
        ordinals.append(counts.get(values, 0))
        counts[values] = ordinals[-1] + 1
    return pa.array(ordinals, DUP_TYPE)


# Current-state files roll over at this size, for full rewrites and merges alike (`delta.targetFileSize`).
# Written sorted by primary key, each file then covers a narrow key range, and a merge rewrites only the
# files whose range holds a changed key: its cost follows how far the changes spread, not the table's size.
CURRENT_FILE_BYTES = 4 * 1024 * 1024

MAX_CHANGES_PER_MERGE = 200_000  # changes read and merged at once: bounds memory when a table has millions pending
SCHEMA_OPS = ("create", "alter", "drop")


@dataclass
class PendingTable:
    """Changes of one table not yet applied to its current state.

    When there are more than MAX_CHANGES_PER_MERGE, `changes` holds only their `_cdc_seq`, `_cdc_op`,
    `_cdc_commit_ts` and `_cdc_ddl` (`index_only`), and each part of at most that many changes is read
    when it is applied (`bounds`, `load`).
    """

    table: TableRef
    version: TableVersion
    changes: pa.Table
    applied_seq: int | None
    index_only: bool = False
    bounds: tuple[int, int] | None = None  # the first and last `_cdc_seq` of a part still to be read

    def load(self, lakehouse: Lakehouse) -> PendingTable:
        """This part with its rows read from the change log (itself when they are there already)."""
        if self.bounds is None:
            return self
        low, high = self.bounds
        log = open_table(lakehouse.table_uri(CHANGES, self.table), lakehouse.storage_options())
        assert log is not None
        ops = ", ".join(f"'{op}'" for op in SCHEMA_OPS)
        sql = f"SELECT * FROM changes WHERE _cdc_seq >= {low} AND _cdc_seq <= {high} AND _cdc_op NOT IN ({ops})"
        return PendingTable(self.table, self.version, read_query(log, sql, "changes"), self.applied_seq)

    @property
    def truncate_seq(self) -> int | None:
        """`_cdc_seq` of the last pending TRUNCATE: every row written before it goes."""
        seqs = self.changes.filter(pc.equal(self.changes.column("_cdc_op"), "truncate")).column("_cdc_seq")
        return None if len(seqs) == 0 else int(pc.max(seqs).as_py())


def read_pending(
    lakehouse: Lakehouse, table: TableRef, version: TableVersion, dropped_seq: int | None = None
) -> PendingTable | None:
    """Changes newer than the current-state table's applied `_cdc_seq`, or None when it is up to date.

    A table whose current state was dropped has taken in everything up to its DROP (`dropped_seq`).
    """
    options = lakehouse.storage_options()
    log = open_table(lakehouse.table_uri(CHANGES, table), options)
    log_max = max_seq(log)
    applied = max_seq(open_table(lakehouse.table_uri(CURRENT, table), options), APPLIED_SEQ_KEY)
    if applied is None:
        applied = dropped_seq
    if log is None or log_max is None or (applied is not None and log_max <= applied):
        return None
    where = "" if applied is None else f" WHERE _cdc_seq > {int(applied)}"
    if (  # the file statistics' bound first; the exact count only when the bound is too high
        _pending_at_most(log, applied) <= MAX_CHANGES_PER_MERGE
        or read_query(log, f"SELECT count(*) AS n FROM changes{where}", "changes").column(0)[0].as_py()
        <= MAX_CHANGES_PER_MERGE
    ):
        return PendingTable(table, version, read_query(log, f"SELECT * FROM changes{where}", "changes"), applied)
    names = [f.name for f in log.schema().fields]
    index = ["_cdc_seq", "_cdc_op", "_cdc_commit_ts"] + ([DDL_COLUMN] if DDL_COLUMN in names else [])
    changes = read_query(log, f"SELECT {', '.join(index)} FROM changes{where}", "changes")
    if DDL_COLUMN not in names:
        changes = changes.append_column(DDL_COLUMN, pa.nulls(changes.num_rows, pa.string()))
    return PendingTable(table, version, changes, applied, index_only=True)


def _pending_at_most(log: DeltaTable, applied: int | None) -> int:
    """An upper bound of the changes past `applied`, from the files' statistics (no data read): the rows of
    every file whose highest `_cdc_seq` is past it."""
    actions = pa.table(log.get_add_actions(flatten=True))
    if not actions.num_rows:
        return 0
    records = actions.column("num_records")
    if applied is not None and "max._cdc_seq" in actions.column_names:
        newer = pc.fill_null(pc.greater(actions.column("max._cdc_seq"), applied), True)
        records = pc.filter(records, newer)
    return int(pc.sum(records).as_py() or 0)


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


def _open_or_create(lakehouse: Lakehouse, pending: PendingTable) -> DeltaTable:
    """The table's current state, created empty (with its statistics settings) the first time."""
    uri = lakehouse.table_uri(CURRENT, pending.table)
    options = lakehouse.storage_options()
    target = open_table(uri, options)
    if target is None:
        schema = current_schema(pending.version)
        target = DeltaTable.create(
            uri, schema=schema, storage_options=options, configuration=current_configuration(schema)
        )
    return target


def apply_changes(lakehouse: Lakehouse, pending: PendingTable, latest: pa.Table) -> ApplyResult:
    """Merge the newest change per key (`latest`: key, seq, action for this table) into current state."""
    target = open_table(lakehouse.table_uri(CURRENT, pending.table), lakehouse.storage_options())
    actions = latest.column("action")
    upserts = _rows_for(pending, latest.filter(pc.equal(actions, "upsert")).column("seq"), "after")
    deletes = _rows_for(pending, latest.filter(pc.equal(actions, "delete")).column("seq"), "before")
    source = pa.concat_tables([upserts, deletes])
    new_applied = int(pc.max(pending.changes.column("_cdc_seq")).as_py())
    keys = list(pending.version.primary_key)
    if target is None or not target.file_uris():  # a new or empty table: no row to match, each upsert is a new row
        rows = sorted_by_key(upserts.drop_columns(["_cdc_action"]), keys)
        write_deltalake(
            target if target is not None else lakehouse.table_uri(CURRENT, pending.table),
            rows,
            mode="append",
            schema_mode="merge",
            storage_options=None if target is not None else lakehouse.storage_options(),
            configuration=None if target is not None else current_configuration(rows.schema),
            commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(new_applied)}),
        )
        return ApplyResult(
            pending.table, pending.changes.num_rows, upserts.num_rows, deletes.num_rows, rows.num_rows, 0, 0, new_applied
        )

    if keys:
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    else:  # no primary key: the whole row is the key
        # each term in parentheses: DataFusion would otherwise parse `a IS NOT DISTINCT FROM b AND c ...` wrongly
        on = " AND ".join(
            f"(t.{quote(c.name)} IS NOT DISTINCT FROM s.{quote(c.name)})" for c in pending.version.columns
        )
    assignments = {quote(f.name): f"s.{quote(f.name)}" for f in current_schema(pending.version)}
    newer = "s._cdc_seq > t._cdc_seq"
    merge = (
        target.merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            streamed_exec=False,  # lets delta-rs prune target files by the source's key range first
            commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(new_applied)}),
        )
        .when_matched_delete(predicate=f"s._cdc_action = 'delete' AND {newer}")
        .when_matched_update(updates=assignments, predicate=f"s._cdc_action = 'upsert' AND {newer}")
        .when_not_matched_insert(updates=assignments, predicate="s._cdc_action = 'upsert'")
    )
    truncated = pending.truncate_seq
    if truncated is not None:  # in the same commit: the rows written before the TRUNCATE go
        merge = merge.when_not_matched_by_source_delete(predicate=f"t._cdc_seq < {int(truncated)}")
    metrics = merge.execute()
    compact_small_files(target, CURRENT_FILE_BYTES)
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


def _images(changes: pa.Table, columns: list[str], image: str, weight: int) -> pa.Table:
    """Row images of changes with a weight: +1 for each row an insert or update writes, -1 for each it removes."""
    if image == "after":
        chosen = changes.filter(pc.is_in(changes.column("_cdc_op"), pa.array(["insert", "update"])))
        data = {c: chosen.column(c) for c in columns}
    else:
        chosen = changes.filter(pc.is_in(changes.column("_cdc_op"), pa.array(["delete", "update"])))
        before = chosen.column("_cdc_before").combine_chunks()
        data = {c: before.field(c) for c in columns}
    data["_cdc_weight"] = pa.array([weight] * chosen.num_rows, pa.int64())
    data["_cdc_seq"] = chosen.column("_cdc_seq")
    data["_cdc_commit_ts"] = chosen.column("_cdc_commit_ts")
    return pa.table(data)


def apply_keyless_changes(lakehouse: Lakehouse, pending: PendingTable) -> ApplyResult:
    """Apply a keyless table's changes with duplicates kept as the source keeps them.

    Per distinct row, the pending changes add or remove copies (an update removes one copy of its
    before-image and adds one of its after-image); the current state then holds exactly that many
    copies, told apart by `_cdc_dup`. A TRUNCATE first empties the table: only changes after it count.
    """
    schema = current_schema(pending.version)
    target = _open_or_create(lakehouse, pending)
    columns = [c.name for c in pending.version.columns]
    truncated = pending.truncate_seq
    changes = pending.changes
    if truncated is not None:
        changes = changes.filter(pc.greater(changes.column("_cdc_seq"), truncated))
    moves = pa.concat_tables([_images(changes, columns, "after", 1), _images(changes, columns, "before", -1)])
    net = moves.group_by(columns, use_threads=False).aggregate(
        [("_cdc_weight", "sum"), ("_cdc_seq", "max"), ("_cdc_commit_ts", "max")]
    )
    existing: dict[tuple, int] = {}
    if truncated is None and net.num_rows:
        current = read_query(target, f"SELECT {', '.join(quote(c) for c in columns)} FROM current", "current")
        for values in zip(*(current.column(c).to_pylist() for c in columns), strict=True) if current.num_rows else []:
            existing[values] = existing.get(values, 0) + 1
    inserts: list[dict] = []
    deletes: list[dict] = []
    for row in net.to_pylist():
        values = tuple(row[c] for c in columns)
        have = existing.get(values, 0)
        want = max(have + int(row["_cdc_weight_sum"]), 0)
        image = {c: row[c] for c in columns}
        meta = {"_cdc_seq": row["_cdc_seq_max"], "_cdc_commit_ts": row["_cdc_commit_ts_max"]}
        inserts += [{**image, **meta, DUP_COLUMN: n, "_cdc_action": "upsert"} for n in range(have, want)]
        deletes += [{**image, **meta, DUP_COLUMN: n, "_cdc_action": "delete"} for n in range(want, have)]
    source_schema = pa.schema(list(schema) + [pa.field("_cdc_action", pa.string())])
    source = pa.Table.from_pylist(inserts + deletes, schema=source_schema)
    new_applied = int(pc.max(pending.changes.column("_cdc_seq")).as_py())
    same_row = " AND ".join(f"(t.{quote(c)} IS NOT DISTINCT FROM s.{quote(c)})" for c in columns)
    merge = (
        target.merge(
            source,
            predicate=f"{same_row} AND t.{DUP_COLUMN} = s.{DUP_COLUMN}",
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            streamed_exec=False,  # lets delta-rs prune target files by the source's key range first
            commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(new_applied)}),
        )
        .when_matched_delete(predicate="s._cdc_action = 'delete'")
        # a copy written again after a TRUNCATE matches its old self: it takes the new change's seq and time
        .when_matched_update(
            updates={"_cdc_seq": "s._cdc_seq", "_cdc_commit_ts": "s._cdc_commit_ts"},
            predicate="s._cdc_action = 'upsert'",
        )
        .when_not_matched_insert(
            updates={quote(f.name): f"s.{quote(f.name)}" for f in schema}, predicate="s._cdc_action = 'upsert'"
        )
    )
    if truncated is not None:
        merge = merge.when_not_matched_by_source_delete(predicate=f"t._cdc_seq < {int(truncated)}")
    metrics = merge.execute()
    compact_small_files(target, CURRENT_FILE_BYTES)
    return ApplyResult(
        table=pending.table,
        changes_in=pending.changes.num_rows,
        upserted=len(inserts),
        deleted=len(deletes),
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=0,
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


# -- schema changes -------------------------------------------------------------------------------------------


def version_of_shape(shape: TableShape) -> TableVersion:
    return TableVersion(0, shape.table, shape.columns, shape.primary_key)


def applied_seq(lakehouse: Lakehouse, table: TableRef) -> int | None:
    """The `_cdc_seq` up to which the table's current state has taken changes in (None: no table)."""
    return max_seq(open_table(lakehouse.table_uri(CURRENT, table), lakehouse.storage_options()), APPLIED_SEQ_KEY)


def _default_column(spec: ColumnSpec, default: Default | None, rows: int, commit_ts: dt.datetime) -> pa.Array:
    """An added column's values in the rows that were there before it (see ddl.Default)."""
    target = arrow_type(spec)
    if default is None or default.kind == "unknown" or (default.kind == "value" and default.text is None):
        return pa.nulls(rows, target)
    if default.kind == "now":
        moment = commit_ts.replace(tzinfo=None)
        text = {"date": moment.date().isoformat(), "time": moment.time().isoformat()}.get(
            spec.type, moment.isoformat(sep=" ", timespec="microseconds")
        )
    else:
        text = default.text
    return decode_column(spec, pa.array([text] * rows, pa.string()))


def reshape_rows(
    rows: pa.Table, change: SchemaChange, after: TableVersion, commit_ts: dt.datetime, table: TableRef
) -> pa.Table:
    """Current-state rows of the table before an ALTER, as the ALTER leaves them: renamed columns keep
    their values, dropped ones go, added ones take their default, modified ones are converted."""
    schema = current_schema(after)
    before = {c.name: c for c in change.before.columns} if change.before is not None else {}
    arrays = []
    for spec in after.columns:
        old = None if spec.name in change.defaults else change.renames.get(spec.name, spec.name)
        if old is not None and old in rows.column_names:
            try:
                arrays.append(convert_column(rows.column(old), before.get(old), spec))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise CdcUserError(
                    f"{table}: column {old} cannot be converted to {arrow_type(spec)} as the source's ALTER TABLE did "
                    f"({exc}): run `cdc-lakehouse snapshot {table}` to load the table again."
                ) from exc
        else:
            arrays.append(_default_column(spec, change.defaults.get(spec.name), rows.num_rows, commit_ts))
    arrays += [rows.column("_cdc_seq"), rows.column("_cdc_commit_ts")]
    if not after.primary_key:
        if DUP_COLUMN in rows.column_names:
            arrays.append(rows.column(DUP_COLUMN))
        else:
            arrays.append(number_duplicates(rows, [c.name for c in after.columns]))
    return pa.Table.from_arrays(
        [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays], schema=schema
    )


def _truncated_time(text: str | None, fsp: int) -> str | None:
    """A TIME text at fewer or more fractional digits: extra digits are cut, as MariaDB's ALTER TABLE does."""
    if text is None:
        return None
    negative = text.startswith("-")
    clock, _, fraction = text.lstrip("-").partition(".")
    hours, minutes, seconds = (int(p) for p in clock.split(":"))
    unit = 10 ** (6 - fsp)
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int((fraction or "0").ljust(6, "0")[:6]) // unit * unit
    return format_time(dt.timedelta(microseconds=-micros if negative else micros), fsp)


def convert_column(values: pa.ChunkedArray | pa.Array, old: ColumnSpec | None, new: ColumnSpec) -> pa.Array:
    """A column's values after MODIFY COLUMN, converted to the new type as the server converts them:
    fractional seconds beyond the new precision are cut (MariaDB), decimals are rounded to the new scale."""
    target = arrow_type(new)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if old is None or old == new:
        return values.cast(target)
    if new.type == "time" and old.type == "time":
        return pa.array([_truncated_time(v, new.fsp) for v in values.to_pylist()], pa.string())
    if new.type in ("datetime", "timestamp") and pa.types.is_timestamp(values.type) and new.fsp < old.fsp:
        unit = 10 ** (6 - new.fsp)
        cut = [None if v is None else v.replace(microsecond=v.microsecond // unit * unit) for v in values.to_pylist()]
        return pa.array(cut, values.type).cast(target)
    if new.type == "decimal" and pa.types.is_decimal(values.type) and (new.scale or 0) < values.type.scale:
        values = pc.round(values, ndigits=new.scale or 0, round_mode="half_away_from_zero")
    return pc.cast(values, target)


def _replace_current(
    lakehouse: Lakehouse, table: TableRef, rows: pa.Table, seq: int, key: tuple[str, ...] = ()
) -> None:
    """The table's current state replaced by `rows` in one Delta commit that records `seq` as applied."""
    uri = lakehouse.table_uri(CURRENT, table)
    options = lakehouse.storage_options()
    write_deltalake(
        uri,
        sorted_by_key(rows, key),
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=options,
        configuration=current_configuration(rows.schema),
        commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(seq)}),
    )


def apply_schema_change(lakehouse: Lakehouse, change: SchemaChange, seq: int, commit_ts: dt.datetime) -> str:
    """Apply one table's schema change at `seq` to its current state; returns what was done.

    Idempotent: a current state that has taken in `seq` already is left alone, so a repeat after a
    crash changes nothing twice.
    """
    table = change.table
    applied = applied_seq(lakehouse, table)
    if applied is not None and applied >= seq:
        return "already applied"
    if change.action == "drop":
        if applied is None:
            return "no current state"
        lakehouse.store.delete_table(f"{CURRENT}/{table.schema}/{table.table}")
        return "dropped" if change.renamed_to is None else f"renamed to {change.renamed_to}"
    if change.after is None:  # a shape only the row events will tell (CREATE TABLE ... SELECT, LIKE an unknown)
        return "shape unknown"
    after = version_of_shape(change.after)
    if change.action == "create":
        rows = None
        if change.renamed_from is not None:
            rows = read_current(lakehouse, change.renamed_from)
        if rows is None:
            rows = current_schema(after).empty_table()
        else:
            rows = reshape_rows(rows, SchemaChange(table, "alter", change.after, change.after), after, commit_ts, table)
        _replace_current(lakehouse, table, rows, seq, after.primary_key)
        return f"created from {change.renamed_from}" if change.renamed_from else "created"
    if applied is None:
        return "no current state"
    rows = read_current(lakehouse, table)
    assert rows is not None
    _replace_current(lakehouse, table, reshape_rows(rows, change, after, commit_ts, table), seq, after.primary_key)
    return "altered"
