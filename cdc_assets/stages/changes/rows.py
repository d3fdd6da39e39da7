"""The rows of the change logs (`changes/<schema>/<table>`), as plain Arrow: raw rows typed per table version,
schemas unified across versions, values cast to a wider type. Used by the change-log stage in the run's
process and by its Spark job on the executors, so both write the same rows."""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import sorted_rows, where, whole
from cdc_assets.core.mysql_types import arrow_schema, decode_image
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import plain_type

SEQ_TYPE = pa.int64()


COMMIT_TS_TYPE = pa.timestamp("us", tz="UTC")


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


def build_change_table(version: TableShape, rows: pa.Table) -> pa.Table:
    """Typed change-log rows of one table version from keyed generic rows (see spark_resources.transforms).

    Source columns hold the row after the change, or the deleted row for a delete; `_cdc_before`
    holds the row before an update or delete.
    """
    columns = list(version.columns)
    source = arrow_schema(columns)
    after = rows.column("after")
    removed = after.null_count  # deletes' and repair_deletes': the row that goes
    if not removed:  # the images as they are: a choice between them copies every value
        image = decode_image(columns, after)
    elif removed == rows.num_rows:
        image = decode_image(columns, rows.column("before"))
    else:
        image = decode_image(columns, pc.if_else(pc.is_null(after), rows.column("before"), after))
    before = decode_image(columns, rows.column("before"))
    arrays = [image.field(i) for i in range(len(columns))]
    arrays += [
        whole(rows.column("op")),
        whole(rows.column("seq")).cast(SEQ_TYPE),
        whole(rows.column("commit_ts")).cast(COMMIT_TS_TYPE),
        whole(rows.column("gtid")),
        whole(rows.column("batch")),
        before,
        whole(rows.column("key")),
        whole(rows.column("before_key")),
    ]
    schema = pa.schema(list(source) + change_log_metadata_fields(source))
    return pa.Table.from_arrays(arrays, schema=schema)


def unified_type(old: pa.DataType, new: pa.DataType) -> pa.DataType:
    """A type that holds every value of both: the change log's column type after a MODIFY COLUMN.

    Widening keeps the wider numeric type; anything else falls back to text, which every value has, except with
    binary on either side: bytes that are not UTF-8 have no text, so the fallback there is binary, which holds
    every value too (a text as its UTF-8 bytes, any other value as the bytes of its text).
    """
    if old == new:
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):  # a before-image: fields named case-insensitively,
        fields = {f.name.lower(): (f.name, f.type) for f in old}  # as the newer image names them
        for f in new:
            key = f.name.lower()
            fields[key] = (f.name, unified_type(fields[key][1], f.type) if key in fields else f.type)
        return pa.struct([pa.field(name, t) for name, t in fields.values()])
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
    if pa.types.is_binary(old) or pa.types.is_binary(new):
        return pa.binary()
    return pa.string()


MAX_DECIMAL_PRECISION = 38


def cast_column(values: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array:
    """`values` as `target` (struct fields by name, missing ones NULL), for unified_type's targets."""
    if isinstance(values, pa.ChunkedArray):
        values = whole(values)
    if values.type == target:
        return values
    if pa.types.is_struct(target):  # fields found case-insensitively: a column renamed in case alone is one
        names = {f.name.lower(): f.name for f in values.type}
        children = [
            cast_column(values.field(names[f.name.lower()]), f.type) if f.name.lower() in names
            else pa.nulls(len(values), f.type)
            for f in target
        ]  # fmt: skip
        return pa.StructArray.from_arrays(children, fields=list(target), mask=pc.is_null(values))
    if pa.types.is_string(target) and pa.types.is_list(values.type):  # a VECTOR modified to another type: as JSON
        return pa.array([None if v is None else json.dumps(v) for v in values.to_pylist()], target)
    if pa.types.is_binary(target) and not pa.types.is_string(values.type):  # the bytes of its text (unified_type)
        return pc.cast(cast_column(values, pa.string()), target)
    if pa.types.is_binary(values.type) and not pa.types.is_string(target):  # the text those bytes are, read back
        return pc.cast(pc.cast(values, pa.string()), target)
    # text to binary: its UTF-8 bytes; binary to text only when the bytes are UTF-8 (a text's, taken back), else
    # ArrowInvalid: never a value with bytes replaced
    return pc.cast(values, target)


def conformed_schema(existing: pa.Schema, incoming: pa.Schema) -> pa.Schema | None:
    """The change log's schema with every column both have at a type holding both, and named as `incoming` (newer)
    names it: a column renamed in case alone is the same column of a Delta table, which takes the source's new
    name (None: no change needed)."""
    changed = False
    fields = []
    by_lower = {f.name.lower(): f for f in incoming}
    for f in existing:
        other = by_lower.get(f.name.lower())
        if other is not None and (other.type != f.type or other.name != f.name):
            fields.append(f.with_type(unified_type(f.type, other.type)).with_name(other.name))
            changed = changed or fields[-1].type != f.type or other.name != f.name
        else:
            fields.append(f)
    return pa.schema(fields) if changed else None


def unified_schema(schemas: list[pa.Schema]) -> pa.Schema:
    """Schemas of several versions of one source table's change log, oldest first, as one: columns are unioned in
    the order they appear, named as the last schema that has them names them (Delta's column names are
    case-insensitive: a column renamed in case alone is one), and a column whose type changed takes `unified_type`."""
    fields: dict[str, tuple[str, pa.DataType]] = {}
    for schema in schemas:
        for f in schema:
            key = f.name.lower()
            fields[key] = (f.name, unified_type(fields[key][1], f.type) if key in fields else f.type)
    return pa.schema([pa.field(name, t) for name, t in fields.values()])


def _column_named(rows: pa.Table, name: str) -> pa.ChunkedArray | None:
    """`rows`' column `name`, or the one named so in another letter case (a column renamed in case alone)."""
    if name in rows.column_names:
        return rows.column(name)
    lowered = name.lower()
    return next((rows.column(n) for n in rows.column_names if n.lower() == lowered), None)


def change_log_schema(shape: TableShape, with_ddl: bool = False) -> pa.Schema:
    """The schema of a table version's change-log rows (build_change_table's)."""
    source = arrow_schema(list(shape.columns))
    ddl = [pa.field(DDL_COLUMN, pa.string())] if with_ddl else []
    return pa.schema(list(source) + change_log_metadata_fields(source) + ddl)


def log_target_schema(existing: pa.Schema | None, incoming: pa.Schema) -> tuple[pa.Schema, bool]:
    """The schema a change log takes to hold `incoming` rows too, and whether its existing rows must be
    rewritten for it (a column's type changed: MODIFY COLUMN)."""
    if existing is None:
        return incoming, False
    current = pa.schema([f.with_type(plain_type(f.type)) for f in existing])
    retyped = conformed_schema(current, incoming)
    return unified_schema([retyped or current, incoming]), retyped is not None


def conform_to_log(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Change-log rows in the schema the log's files take (columns they lack NULL, types widened)."""
    columns = [(f, _column_named(rows, f.name)) for f in schema]
    return pa.Table.from_arrays(
        [cast_column(c, f.type) if c is not None else pa.nulls(rows.num_rows, f.type) for f, c in columns],
        schema=schema,
    )


def concat_unified(tables: list[pa.Table]) -> pa.Table:
    """Tables of several versions of one source table as one: columns are unioned (missing ones NULL) and
    a column whose type changed takes `unified_type`."""
    schema = unified_schema([t.schema for t in tables])
    return pa.concat_tables(
        [
            conform_to_log(t, schema)
            for t in tables
        ]
    )


def with_batch(rows: pa.Table, batch: str) -> pa.Table:
    """Raw rows with the name of the batch they came from (`_cdc_batch` of the change log)."""
    return rows.append_column("batch", pa.array([batch] * rows.num_rows, pa.string()))


def named_as(rows: pa.Table, names: Iterable[str]) -> pa.Table:
    """`rows` with its columns, and the fields of its before-images, named as `names` names them in another letter
    case. Delta's (and Spark's) column names are case-insensitive, so a source column renamed in case alone (MariaDB's
    `MODIFY COLUMN C` of `c`) stays one column of a change log, under the name `names` gives it."""
    by_lower = {n.lower(): n for n in names}

    def named(name: str) -> str:
        return by_lower.get(name.lower(), name)

    columns = []
    for field, column in zip(rows.schema, rows.columns, strict=True):
        if pa.types.is_struct(field.type) and any(named(f.name) != f.name for f in field.type):
            fields = [f.with_name(named(f.name)) for f in field.type]
            chunks = [
                pa.StructArray.from_arrays(
                    [chunk.field(i) for i in range(len(fields))], fields=fields, mask=chunk.is_null() if chunk.null_count else None
                )
                for chunk in column.chunks
            ]
            column = pa.chunked_array(chunks, pa.struct(fields))
        columns.append(column)
    if [named(n) for n in rows.column_names] == rows.column_names and all(c is o for c, o in zip(columns, rows.columns, strict=True)):
        return rows
    return pa.Table.from_arrays(columns, names=[named(n) for n in rows.column_names])


def typed_changes(rows: pa.Table, versions: dict[tuple[str, int], TableShape], ddl: dict[tuple[str, int], str]) -> pa.Table:
    """One table's keyed generic rows as change-log rows, whatever number of table versions they span, in
    `_cdc_seq` order. A schema change's row carries the change in `_cdc_ddl` (JSON: statement, action, shapes
    before and after, column renames, defaults), so the change log says what happened between its versions."""
    typed = []
    pairs = pc.unique(
        pc.binary_join_element_wise(rows.column("batch"), rows.column("table_version").cast(pa.string()), "\x1f")
    )
    for pair in pairs.to_pylist():
        batch, version_id = pair.split("\x1f")
        mask = pc.and_(pc.equal(rows.column("batch"), batch), pc.equal(rows.column("table_version"), int(version_id)))
        part = build_change_table(versions[(batch, int(version_id))], where(rows, mask))
        if (batch, int(version_id)) in ddl:
            part = part.append_column(DDL_COLUMN, pa.array([ddl[(batch, int(version_id))]] * part.num_rows, pa.string()))
        typed.append(part)
    # a column renamed in case alone takes its newest name in every part
    if len(typed) > 1:
        newest = max(typed, key=lambda part: pc.max(part.column("_cdc_seq")).as_py() or 0).column_names
        typed = [named_as(part, newest) for part in typed]
    return sorted_rows(concat_unified(typed), "_cdc_seq")


def rows_for_tables(rows: pa.Table, starts: dict[str, str | None]) -> pa.Table:
    """Rows of the wanted tables in batches after each table's own start."""
    names = list(starts)
    refs = [TableRef.parse(n) for n in names]
    # joined with NUL, which no identifier holds: names with dots stay apart
    joined = pc.binary_join_element_wise(rows.column("schema"), rows.column("table"), "\x00")
    index = pc.index_in(joined, pa.array([f"{t.schema}\x00{t.table}" for t in refs], pa.string()))
    start_after = pc.take(pa.array([starts[n] or "" for n in names], pa.string()), index)
    wanted = pc.and_(pc.is_valid(index), pc.greater(rows.column("batch"), start_after))
    return where(rows, pc.fill_null(wanted, False))
