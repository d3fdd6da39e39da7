"""Per-table change logs: `changes/<schema>/<table>`, one row per row change (CONTRACT §4).

Each table gets one atomic Delta append per run, holding only changes newer than what the table
already has (its highest `_cdc_seq`), so re-processing a batch after a crash adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdc_assets.lakehouse import CHANGES, Lakehouse, TableRef
from cdc_assets.mysql_types import arrow_schema, decode_image
from cdc_assets.raw_batch import TableVersion

SEQ_TYPE = pa.int64()
COMMIT_TS_TYPE = pa.timestamp("us", tz="UTC")
MAX_SEQ_KEY = "cdc_max_seq"
DDL_COLUMN = "_cdc_ddl"  # on schema-change rows (_cdc_op create, alter, drop): what the DDL did, as JSON


def change_log_metadata_fields(source: pa.Schema) -> list[pa.Field]:
    return [
        pa.field("_cdc_op", pa.string(), nullable=False),
        pa.field("_cdc_seq", SEQ_TYPE, nullable=False),
        pa.field("_cdc_commit_ts", COMMIT_TS_TYPE, nullable=False),
        pa.field("_cdc_gtid", pa.string()),
        pa.field("_cdc_batch", pa.string(), nullable=False),
        pa.field("_cdc_before", pa.struct(list(source))),
        pa.field("_cdc_key", pa.string()),
        pa.field("_cdc_before_key", pa.string()),
    ]


# delta-rs writes min/max statistics of wide decimals wrongly (clamped to the int64 range, or rounded
# through a float), and readers then skip files that hold matching rows. Such columns get no statistics.
MAX_DECIMAL_PRECISION_WITH_STATS = 15


def _has_safe_stats(f: pa.Field) -> bool:
    if pa.types.is_decimal(f.type):
        return f.type.precision <= MAX_DECIMAL_PRECISION_WITH_STATS
    return not (pa.types.is_struct(f.type) or pa.types.is_list(f.type))


# A table is appended to or merged into by every run that touches it: a checkpoint every 10 commits (not 100)
# keeps opening it to reading at most 10 commit files, and its small files are compacted once there are 32.
CHECKPOINT_INTERVAL = 10
SMALL_FILES_BEFORE_COMPACTION = 32
CHANGE_LOG_FILE_BYTES = 16 * 1024 * 1024


def table_configuration(schema: pa.Schema) -> dict[str, str]:
    """Delta table properties of change logs and current state: statistics only on columns delta-rs records
    correctly, and frequent checkpoints."""
    names = [f"`{f.name.replace('`', '``')}`" for f in schema if _has_safe_stats(f)]
    return {"delta.dataSkippingStatsColumns": ",".join(names), "delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}


def compact_small_files(table: DeltaTable, target_bytes: int) -> bool:
    """Bin a table's small files (one per append or merge) into files of `target_bytes` once there are
    SMALL_FILES_BEFORE_COMPACTION of them, so reads do not open ever more files; a commit of its own, without
    data change (readers and the `cdc_*` commit metadata are unaffected). Whether it compacted."""
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
    if (pc.sum(pc.less(sizes, target_bytes // 2)).as_py() or 0) < SMALL_FILES_BEFORE_COMPACTION:
        return False
    table.optimize.compact(target_size=target_bytes)
    return True


def build_change_table(version: TableVersion, rows: pa.Table) -> pa.Table:
    """Typed change-log rows of one table version from keyed generic rows (see spark_resources.transforms).

    Source columns hold the row after the change, or the deleted row for a delete; `_cdc_before`
    holds the row before an update or delete.
    """
    columns = list(version.columns)
    source = arrow_schema(columns)
    is_delete = pc.equal(rows.column("op"), "delete")
    image = decode_image(columns, pc.if_else(is_delete, rows.column("before"), rows.column("after")))
    before = decode_image(columns, rows.column("before"))
    arrays = [image.field(i) for i in range(len(columns))]
    arrays += [
        rows.column("op").combine_chunks(),
        rows.column("seq").combine_chunks().cast(SEQ_TYPE),
        rows.column("commit_ts").combine_chunks().cast(COMMIT_TS_TYPE),
        rows.column("gtid").combine_chunks(),
        rows.column("batch").combine_chunks(),
        before,
        rows.column("key").combine_chunks(),
        rows.column("before_key").combine_chunks(),
    ]
    schema = pa.schema(list(source) + change_log_metadata_fields(source))
    return pa.Table.from_arrays(arrays, schema=schema)


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain_type(t.value_type))
    return t


def _plain(rows: pa.Table) -> pa.Table:
    return rows.cast(pa.schema([f.with_type(_plain_type(f.type)) for f in rows.schema]))


def read_query(table: DeltaTable, sql: str, name: str = "t") -> pa.Table:
    """A SQL query over a Delta table (delta-rs), with view types turned into plain Arrow types."""
    return _plain(pa.table(QueryBuilder().register(name, table).execute(sql).read_all()))


def read_query_chunks(table: DeltaTable, sql: str, name: str, rows_per_chunk: int) -> Iterator[pa.Table]:
    """`read_query` streamed: about `rows_per_chunk` rows at a time, for results too large to hold at once."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in QueryBuilder().register(name, table).execute(sql):
        record = pa.record_batch(batch)
        pending.append(record)
        held += record.num_rows
        if held >= rows_per_chunk:
            yield _plain(pa.Table.from_batches(pending))
            pending, held = [], 0
    if pending:
        yield _plain(pa.Table.from_batches(pending))


def row_count(table: DeltaTable) -> int:
    """Rows of a Delta table, from the log's file statistics (no data read)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0


def open_table(uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    try:
        return DeltaTable(uri, storage_options=storage_options)
    except TableNotFoundError:
        return None


def max_seq(table: DeltaTable | None, metadata_key: str = MAX_SEQ_KEY) -> int | None:
    """The highest `_cdc_seq` a table has taken in: from its latest CDC commit, else from file statistics."""
    if table is None:
        return None
    for commit in table.history(limit=20):
        if metadata_key in commit:
            return int(commit[metadata_key])
    actions = pa.table(table.get_add_actions(flatten=True))
    if "max._cdc_seq" in actions.column_names and actions.num_rows:
        value = pc.max(actions.column("max._cdc_seq")).as_py()
        return None if value is None else int(value)
    return None


def unified_type(old: pa.DataType, new: pa.DataType) -> pa.DataType:
    """A type that holds every value of both: the change log's column type after a MODIFY COLUMN.

    Widening keeps the wider numeric type; anything else falls back to text, which every value has.
    """
    if old == new:
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = {f.name: f.type for f in old}
        for f in new:
            fields[f.name] = unified_type(fields[f.name], f.type) if f.name in fields else f.type
        return pa.struct([pa.field(name, t) for name, t in fields.items()])
    ints = [t for t in (old, new) if pa.types.is_integer(t)]
    if len(ints) == 2:
        return old if old.bit_width >= new.bit_width else new
    decimals = [t for t in (old, new) if pa.types.is_decimal(t)]
    if decimals and len(decimals) + len(ints) == 2:
        digits = max(t.precision - t.scale if pa.types.is_decimal(t) else 20 for t in (old, new))
        scale = max(t.scale for t in decimals)
        if digits + scale <= MAX_DECIMAL_PRECISION:
            return pa.decimal128(digits + scale, scale)
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return pa.float64()
    if pa.types.is_timestamp(old) and pa.types.is_timestamp(new) and old.tz == new.tz:
        return old
    if pa.types.is_binary(old) and pa.types.is_binary(new):
        return pa.binary()
    return pa.string()


MAX_DECIMAL_PRECISION = 38


def cast_column(values: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array:
    """`values` as `target` (struct fields by name, missing ones NULL), for unified_type's targets."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if values.type == target:
        return values
    if pa.types.is_struct(target):
        names = [f.name for f in values.type]
        children = [
            cast_column(values.field(f.name), f.type) if f.name in names else pa.nulls(len(values), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=pc.is_null(values))
    if pa.types.is_string(target) and pa.types.is_binary(values.type):
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()], target)
    return pc.cast(values, target)


def _conformed(existing: pa.Schema, incoming: pa.Schema) -> pa.Schema | None:
    """The change log's schema with every column both have at a type holding both (None: no change needed)."""
    changed = False
    fields = []
    for f in existing:
        if f.name in incoming.names and incoming.field(f.name).type != f.type:
            fields.append(f.with_type(unified_type(f.type, incoming.field(f.name).type)))
            changed = changed or fields[-1].type != f.type
        else:
            fields.append(f)
    return pa.schema(fields) if changed else None


def _conform_change_log(
    uri: str, existing: DeltaTable, incoming: pa.Schema, options: dict[str, str] | None
) -> pa.Schema:
    """Rewrite the change log in one commit when a column's type changed (a MODIFY COLUMN): its rows are
    cast to a type that holds old and new values alike, so every version stays readable in one table."""
    current = pa.schema([f.with_type(_plain_type(f.type)) for f in pa.schema(existing.schema().to_arrow())])
    target = _conformed(current, incoming)
    if target is None:
        return current
    rows = read_query(existing, "SELECT * FROM changes", "changes")
    rewritten = pa.Table.from_arrays([cast_column(rows.column(f.name), f.type) for f in target], schema=target)
    write_deltalake(
        uri,
        rewritten,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=options,
        commit_properties=CommitProperties(custom_metadata={MAX_SEQ_KEY: str(max_seq(existing))}),
    )
    existing.update_incremental()  # the caller appends through this object next
    return target


def concat_unified(tables: list[pa.Table]) -> pa.Table:
    """Tables of several versions of one source table as one: columns are unioned (missing ones NULL) and
    a column whose type changed takes `unified_type`."""
    fields: dict[str, pa.DataType] = {}
    for table in tables:
        for f in table.schema:
            fields[f.name] = unified_type(fields[f.name], f.type) if f.name in fields else f.type
    schema = pa.schema([pa.field(name, t) for name, t in fields.items()])
    return pa.concat_tables(
        [
            pa.Table.from_arrays(
                [
                    cast_column(t.column(f.name), f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                    for f in schema
                ],
                schema=schema,
            )
            for t in tables
        ]
    )


@dataclass(frozen=True)
class AppendResult:
    table: TableRef
    appended: int
    inserts: int
    updates: int
    deletes: int
    max_seq: int | None


def append_changes(lakehouse: Lakehouse, table: TableRef, changes: pa.Table) -> AppendResult:
    """Append the changes newer than the change log's highest `_cdc_seq`, atomically."""
    uri = lakehouse.table_uri(CHANGES, table)
    options = lakehouse.storage_options()
    existing = open_table(uri, options)
    watermark = max_seq(existing)
    if watermark is not None and changes.num_rows:
        changes = changes.filter(pc.greater(changes.column("_cdc_seq"), pa.scalar(watermark, SEQ_TYPE)))
    if changes.num_rows == 0:
        return AppendResult(table, 0, 0, 0, 0, watermark)
    changes = changes.sort_by("_cdc_seq")
    if existing is not None:
        schema = _conform_change_log(uri, existing, changes.schema, options)
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
    write_deltalake(
        existing if existing is not None else uri,  # the table object: not loaded a second time
        changes,
        mode="append",
        schema_mode="merge",
        configuration=table_configuration(changes.schema) if existing is None else None,
        storage_options=options,
        commit_properties=CommitProperties(custom_metadata={MAX_SEQ_KEY: str(new_max)}),
    )
    if existing is not None:
        compact_small_files(existing, CHANGE_LOG_FILE_BYTES)
    ops = changes.column("_cdc_op")
    return AppendResult(
        table,
        changes.num_rows,
        inserts=pc.sum(pc.equal(ops, "insert")).as_py() or 0,
        updates=pc.sum(pc.equal(ops, "update")).as_py() or 0,
        deletes=pc.sum(pc.equal(ops, "delete")).as_py() or 0,
        max_seq=new_max,
    )
