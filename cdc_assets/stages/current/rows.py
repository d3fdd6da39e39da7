"""The rows of the current-state tables (`current/<schema>/<table>`), as plain Arrow: their schema and table
properties, the numbering of a keyless table's identical rows, and the rows an ALTER TABLE leaves. Used by
the current-state stage and snapshots in the run's process and by their Spark jobs on the executors."""

from __future__ import annotations

import bisect
import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import hashable
from cdc_assets.core.errors import TableUserError
from cdc_assets.core.mysql_charsets import python_codec
from cdc_assets.core.mysql_conversions import MARIADB, Conversion, InexactConversion
from cdc_assets.core.mysql_types import (
    INTEGER_TYPES,
    TEXT_TYPES,
    ColumnSpec,
    arrow_schema,
    arrow_type,
    binary_array,
    decode_column,
    encode_column,
)
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import DEFAULT_CURRENT_FILE_KB
from cdc_assets.core.shapes import Default, SchemaChange, TableShape
from cdc_assets.lake.delta import table_configuration
from cdc_assets.stages.changes.rows import COMMIT_TS_TYPE, SEQ_TYPE

DUP_COLUMN = "_cdc_dup"  # keyless tables: 0, 1, 2 ... among identical rows, so each row has a key of its own


DUP_TYPE = pa.int32()

# CDC_SOFT_DELETES: a deleted row stays, flagged, with the delete's seq and time; NULL (a row written before soft
# deletes were turned on) counts as live
DELETED_COLUMN = "_cdc_deleted"
LIVE_ROWS = f"{DELETED_COLUMN} IS NOT TRUE"


def live_rows(rows: pa.Table) -> pa.Table:
    """The rows not marked deleted (`LIVE_ROWS` on rows in hand): a soft-deleted row is not in the current state."""
    if DELETED_COLUMN not in rows.column_names:
        return rows
    return rows.filter(pc.invert(pc.fill_null(rows.column(DELETED_COLUMN), False)))


def live_rows_sql(columns: list[str], select: str = "*") -> str:
    """A query of a current-state table (registered as `current`) for its live rows: without the soft-deleted."""
    where = f" WHERE {LIVE_ROWS}" if DELETED_COLUMN in columns else ""
    return f"SELECT {select} FROM current{where}"


def current_schema(version: TableShape) -> pa.Schema:
    source = arrow_schema(list(version.columns))
    meta = [pa.field("_cdc_seq", SEQ_TYPE), pa.field("_cdc_commit_ts", COMMIT_TS_TYPE)]
    if not version.primary_key:
        meta.append(pa.field(DUP_COLUMN, DUP_TYPE))
    return pa.schema(list(source) + meta)


def current_configuration(schema: pa.Schema) -> dict[str, str]:
    """Table properties of a current-state table: safe statistics and the file size merges keep to."""
    return {**table_configuration(schema), "delta.targetFileSize": str(CURRENT_FILE_BYTES)}


def number_duplicates(rows: pa.Table, columns: list[str]) -> pa.Array:
    """`_cdc_dup` for rows of a keyless table: the ordinal of each row among the rows identical to it."""
    counts: dict[tuple, int] = {}
    ordinals = []
    for values in zip(*(rows.column(c).to_pylist() for c in columns), strict=True) if rows.num_rows else []:
        values = hashable(values)  # a VECTOR's list as a tuple
        ordinals.append(counts.get(values, 0))
        counts[values] = ordinals[-1] + 1
    return pa.array(ordinals, DUP_TYPE)


# Current-state files roll over at this size, for full rewrites and merges alike (`delta.targetFileSize`).
# Written sorted by primary key, each file then covers a narrow key range, and a merge rewrites only the
# files whose range holds a changed key: its cost follows how far the changes spread, not the table's size.
CURRENT_FILE_BYTES = 4 * 1024 * 1024

# A keyed table's current state on Arrow is kept in pieces of at least this size and under twice it, each a
# disjoint key range: the snapshot writes them, and a merge (stages/current/apply.py) rewrites only the pieces
# whose range holds a changed key and writes them back as pieces again. One changed key then costs the rewrite
# of about this much (3,000 rows of a six-column table), however large the table: at 1,000 changes/s with one
# table in 21 of 10M rows, changed at uniformly random keys, a 4 MB file (100k rows) per changed key made each
# cycle of the continuous mode slower than the changes came. Compaction bins only fragments under a quarter of
# this (deletes thinned them), never the pieces (benchmarks/README.md, continuous mode). CDC_CURRENT_FILE_KB sets
# it: the stages take it from the lakehouse they are given (lake.store.Lakehouse.current_piece_bytes).
CURRENT_PIECE_BYTES = int(DEFAULT_CURRENT_FILE_KB * 1024)




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
    rows: pa.Table, change: SchemaChange, after: TableShape, commit_ts: dt.datetime, table: TableRef
) -> pa.Table:
    """Current-state rows of the table before an ALTER, as the ALTER leaves them: renamed columns keep
    their values, dropped ones go, added ones take their default, modified ones are converted as the server that
    ran the ALTER converted them (`convert_column`)."""
    schema = current_schema(after)
    before = {c.name: c for c in change.before.columns} if change.before is not None else {}
    arrays = []
    for spec in after.columns:
        old = None if spec.name in change.defaults else change.renames.get(spec.name, spec.name)
        if old is not None and old in rows.column_names:
            try:
                converted = convert_column(
                    rows.column(old), before.get(old), spec, change.flavor, commit_ts, change.by_policy
                )
                arrays.append(converted)
            except InexactConversion as exc:
                raise TableUserError(
                    f"{table}: column {old} cannot be converted to {spec.type.upper()} exactly as the source's ALTER "
                    f"TABLE did ({exc}): run `cdc-lakehouse snapshot {table}` to load the table again."
                ) from exc
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TableUserError(
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
    if DELETED_COLUMN in rows.column_names:  # soft-deleted rows stay soft-deleted
        arrays.append(rows.column(DELETED_COLUMN))
        schema = schema.append(pa.field(DELETED_COLUMN, pa.bool_()))
    return pa.Table.from_arrays(
        [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays], schema=schema
    )


def convert_column(
    values: pa.ChunkedArray | pa.Array,
    old: ColumnSpec | None,
    new: ColumnSpec,
    flavor: str | None = None,
    commit_ts: dt.datetime | None = None,
    by_policy: bool = False,
) -> pa.Array:
    """A column's values after MODIFY COLUMN, converted to the new type as the server converts them
    (core.mysql_conversions: an ENUM's index to a number, a number's text to a text, a text parsed as a number,
    fractional seconds cut by MariaDB and rounded by MySQL, …). `flavor` is the server's (MariaDB's rules when
    unknown), `commit_ts` the ALTER's time (a TIME becomes a DATETIME on its day). Raises InexactConversion where
    the lakehouse cannot know the server's result. A column policy's alter (`by_policy`) makes each value the
    canonical text the policy hashes or masks (its clear value until the policy's rewrite)."""
    target = arrow_type(new)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if old is None or old == new:
        return values.cast(target)
    if by_policy and pa.types.is_string(target):
        return pa.array(encode_column(old, values), pa.string())
    day = (commit_ts.astimezone(dt.UTC) if commit_ts.tzinfo else commit_ts).date() if commit_ts else dt.date(1970, 1, 1)
    conversion = Conversion(old, new, flavor or MARIADB, day)
    unchanged = _unchanged(values, conversion, target)
    if unchanged is not None:
        return unchanged
    if conversion.converts():
        converted = conversion.values(values.to_pylist())
        return binary_array(converted) if pa.types.is_binary(target) else pa.array(converted, target)
    # types the conversions do not know (GEOMETRY, VECTOR, UUID, …): text and bytes in their charsets, else a cast
    if pa.types.is_binary(target) and pa.types.is_string(values.type) and old.type in TEXT_TYPES:
        return _recoded(values, None if old.type == "json" else old.charset, to_text=False)
    if pa.types.is_string(target) and pa.types.is_binary(values.type) and new.type in TEXT_TYPES:
        return _recoded(values, None if new.type == "json" else new.charset, to_text=True)
    return pc.cast(values, target)


def _unchanged(values: pa.Array, conversion: Conversion, target: pa.DataType) -> pa.Array | None:
    """The values of a MODIFY that changes none of them, cast at Arrow's speed (no Python object per value): an
    integer, decimal or double widened, a text or bytes given more room in the same charset, a date made a
    DATETIME, more fractional digits. None: the values go through the server's rules one by one."""
    old, new = conversion.old, conversion.new
    if old.type in INTEGER_TYPES and new.type in INTEGER_TYPES:
        wider = pa.types.is_integer(target) or pa.types.is_decimal(target)
        low, high = _integer_range(old)
        new_low, new_high = _integer_range(new)
        return values.cast(target) if wider and new_low <= low and high <= new_high else None
    if old.type == "decimal" and new.type == "decimal" and pa.types.is_decimal(target) and pa.types.is_decimal(values.type):
        widened = (new.scale or 0) >= (old.scale or 0) and target.precision - target.scale >= values.type.precision - values.type.scale
        return values.cast(target) if widened and not (new.unsigned and not old.unsigned) else None
    if (old.type, new.type) in (("float", "double"), ("float", "float"), ("double", "double")) and not new.unsigned:
        return values.cast(target)
    if old.type == "date" and new.type == "datetime":
        return values.cast(target)
    if old.type == new.type and old.type in ("datetime", "timestamp") and new.fsp >= old.fsp:
        return values.cast(target)
    same_charset = (old.charset or "utf8mb4") == (new.charset or "utf8mb4")
    roomier = new.length is None or (old.length is not None and old.length <= new.length)
    if old.type in ("varchar", "text", "char") and new.type in ("varchar", "text") and same_charset and roomier:
        return values
    if old.type in ("varbinary", "blob", "binary") and new.type in ("varbinary", "blob") and roomier:
        return values
    return None


def _integer_range(spec: ColumnSpec) -> tuple[int, int]:
    bits = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}[spec.type]
    return (0, (1 << bits) - 1) if spec.unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def _recoded(values: pa.Array, charset: str | None, to_text: bool) -> pa.Array:
    """Text to binary or back as MySQL's ALTER TABLE converts them, for the types the conversions do not know: a
    text becomes its bytes in its column's charset, bytes become the text they are in the new column's charset.
    Raises ArrowInvalid for bytes that are no text of that charset, never a text with bytes replaced."""
    codec = python_codec(charset)
    if codec in ("utf8", "utf-8"):  # Arrow's own UTF-8 cast, with no Python object per value
        return pc.cast(values, pa.string() if to_text else pa.binary())
    if codec is None:
        raise pa.ArrowInvalid(f"no codec here for the {charset} charset")
    try:
        if to_text:
            return pa.array([None if v is None else v.decode(codec) for v in values.to_pylist()], pa.string())
        return binary_array([None if v is None else v.encode(codec) for v in values.to_pylist()])
    except (UnicodeError, LookupError) as exc:
        raise pa.ArrowInvalid(f"a value is not {charset} text ({exc})") from exc


def file_ranges(actions: pa.Table, key: list[str]) -> list[dict[str, Any]]:
    """Each file's path and the min and max of each key column its statistics give (None: none), from a Delta
    table's add actions (`get_add_actions(flatten=True)`). Each statistics column is read once, whole (indexing a
    column row by row cost 0.15 s a cycle for a table of a few hundred files)."""
    columns = set(actions.column_names)
    paths = actions.column("path").to_pylist()
    values = {
        (side, name): actions.column(f"{side}.{name}").to_pylist() if f"{side}.{name}" in columns else [None] * len(paths)
        for side in ("min", "max")
        for name in key
    }
    return [
        {"path": path, **{side: {name: values[side, name][i] for name in key} for side in ("min", "max")}}
        for i, path in enumerate(paths)
    ]


def touched_by(keys: pa.Table, ranges: list[dict[str, Any]]) -> set[str]:
    """The files (of `ranges`: path, and per key column the min and max their statistics give, None when
    unknown) whose key range holds one of `keys`. A file without a bound for a column may hold any key."""
    ordered = _disjoint_ranges(keys, ranges)
    if ordered is not None:  # one lookup per key instead of a pass over the keys per file (thousands of files)
        starts = [low for low, _, _ in ordered]
        found: set[str] = set()
        for key in pc.unique(keys.column(0)).to_pylist():
            at = bisect.bisect_right(starts, key) - 1
            if at >= 0 and key <= ordered[at][1]:
                found.add(ordered[at][2])
        return found
    found = set()
    for file in ranges:
        mask = None
        for name in keys.column_names:
            column = keys.column(name)
            for bound, test in ((file["min"].get(name), pc.greater_equal), (file["max"].get(name), pc.less_equal)):
                if bound is None:
                    continue
                term = test(column, pa.scalar(bound, column.type))
                mask = term if mask is None else pc.and_(mask, term)
        if mask is None or pc.any(mask).as_py():
            found.add(file["path"])
    return found


def _disjoint_ranges(keys: pa.Table, ranges: list[dict[str, Any]]) -> list[tuple[Any, Any, str]] | None:
    """(min, max, path) of every file sorted by min, when the key is one integer or text column, every file has
    exact bounds of its type (Python compares them as Arrow does) and no two ranges overlap; else None."""
    if keys.num_columns != 1 or not ranges:
        return None
    kind = keys.schema.field(0).type
    python = int if pa.types.is_integer(kind) else str if pa.types.is_string(kind) or pa.types.is_large_string(kind) else None
    if python is None:
        return None
    name = keys.column_names[0]
    ordered = [(f["min"].get(name), f["max"].get(name), f["path"]) for f in ranges]
    if not all(type(low) is python and type(high) is python for low, high, _ in ordered):
        return None
    ordered.sort(key=lambda f: f[0])
    if any(ordered[i][1] >= ordered[i + 1][0] for i in range(len(ordered) - 1)):
        return None
    return ordered


def home_files(keys: pa.Table, ranges: list[dict[str, Any]]) -> set[str]:
    """For keys that no file's range holds (new rows), the file each would join: with a single-column key, the
    file whose range lies just below the key (the first file for a key below them all), so a new row extends a
    file's range instead of opening a file of its own and no two files' ranges overlap. Empty when the key has
    several columns or a file lacks bounds (the new rows then go to files of their own)."""
    if keys.num_columns != 1 or not keys.num_rows or not ranges:
        return set()
    name = keys.column_names[0]
    lows = [(f["min"].get(name), f["max"].get(name), f["path"]) for f in ranges]
    if any(low is None or high is None for low, high, _ in lows):
        return set()
    homes: set[str] = set()
    try:
        lows.sort(key=lambda f: f[0])
        starts = [low for low, _, _ in lows]
        for key in pc.unique(keys.column(0)).to_pylist():
            low, high, path = lows[max(bisect.bisect_right(starts, key) - 1, 0)]
            if not (low <= key <= high):  # outside that file's range: it joins it (inside: it is that file's)
                homes.add(path)
    except TypeError:  # bounds that do not compare with the keys (a statistic's type): new rows go apart
        return set()
    return homes


def range_groups(rows: pa.Table, key: list[str], ranges: list[dict[str, Any]]) -> list[pa.Table]:
    """Merged rows (sorted by key) of the files of `ranges`, cut where one file's key range ends and the next
    one's begins (files whose ranges overlap stay together), so each part is written back within its file's old
    range, widened only by new keys past its ends: files never come to span the ranges of files not rewritten.
    One part for a key of several columns or a file without bounds."""
    if len(key) != 1 or not ranges or not rows.num_rows:
        return [rows]
    name = key[0]
    bounds = [(f["min"].get(name), f["max"].get(name)) for f in ranges]
    if any(low is None or high is None for low, high in bounds):
        return [rows]
    try:
        bounds.sort(key=lambda b: b[0])
        starts = [bounds[0][0]]
        reach = bounds[0][1]
        for low, high in bounds[1:]:
            if low > reach:  # a gap before this file: a new part starts at its first key
                starts.append(low)
            reach = max(reach, high)
        column = rows.column(name)
        cuts = [int(pc.sum(pc.less(column, pa.scalar(low, column.type))).as_py() or 0) for low in starts[1:]]
    except (TypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):  # bounds that do not compare with the keys
        return [rows]
    edges = [0, *cuts, rows.num_rows]
    return [rows.slice(a, b - a) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def pieces(rows: int, row_bytes: float, piece_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of equal slices of `rows` sorted rows, each at least `piece_bytes` (or all of them when
    fewer) and less than twice that, at `row_bytes` bytes a row."""
    per_piece = max(1, int(piece_bytes / max(row_bytes, 1.0)))
    count = max(1, rows // per_piece)
    bounds = [rows * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(count) if bounds[i + 1] > bounds[i]]
