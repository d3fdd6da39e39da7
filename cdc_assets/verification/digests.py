"""Where a large table may differ from its source, found by key range without moving its rows: a digest per range.

A repair of a 10M-row table that drifted in a few rows should not bring 10M rows over the network to find them.
Here the source computes the row count and the sum of a CRC-32 of every row's text of each key range (one query per
range, a range scan of the primary key, spread over a few connections so the server's cores share the work), and
the same is computed from the lakehouse's rows; only the ranges whose digests differ are cut again into parts of
a few hundred rows and digested again, and only the parts that still differ are looked at row by row
(repair/run.py). The text of a value is one both sides write the same byte for byte: MySQL's own text of
the value (`CAST(… AS CHAR)`, text converted to utf8mb4, bytes as hex), a number's, a time's or hex followed by a
comma (which none of them holds) and any other text prefixed by its length, NULL told apart, so no two rows share a
text unless their values are equal. The lakehouse's texts are written by DuckDB
over each chunk of rows (its formatting of integers, decimals, dates, times of day and bytes is MySQL's), and by
Arrow for the few types DuckDB would write otherwise. A Delta data file never changes once written, so each file's
rows' keys and CRC-32s are kept once computed (lake/file_digests.py, named after the file and the table's columns)
and a later repair writes texts only for the files written since. The ranges are cut from the data files' key
statistics, so the source starts digesting at once, while the lakehouse's keys and kept CRC-32s are read and the
texts of the files without them written.

The ranges need not be read at one consistent point: a digest only narrows where to look. A range found equal
while its rows changed in flight holds, on the lakehouse's side, rows the source then held, and the changes in
flight bring both to the same rows when they are applied (an image replaces a row whatever it held); the rows
that are looked at are compared again at one point (consistency.compare_to_repair).

Only a table keyed by one integer column, with no FLOAT or DOUBLE column (whose text differs between the server
and Python), and no column policy (whose values are made in Python), is digested; any other is compared row by
row. A range whose digests differ for any reason (a value whose text the two sides write differently included)
is only compared row by row: a digest never decides that rows are equal on its own without a difference being
possible to miss but by a CRC-32 sum coinciding.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pymysql
from deltalake import DeltaTable

from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.mysql_types import BINARY_TYPES, INTEGER_TYPES, PRINTED_BINARY_TYPES, TEXT_TYPES, ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import file_actions, files_read_alone, read_query_chunks
from cdc_assets.lake.file_digests import (
    FileDigestWriter,
    load_file_digests,
    remove_file_digests,
    remove_objects,
)
from cdc_assets.lake.files import conformed, read_files
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.rows import quote_identifier, quoted_table
from cdc_assets.stages.current.apply import quote
from cdc_assets.stages.current.rows import DELETED_COLUMN, live_rows
from cdc_assets.verification.changed_keys import written_by_others

ROWS_PER_RANGE = 20_000  # rows a range holds, about: a query of its own on the source
ROWS_PER_PART = 500  # rows a part of a differing range holds, about: what one differing part costs to compare row by row
STREAM_ROWS = 200_000  # lakehouse rows hashed at a time
TEXT_WORKERS = 2  # groups of STREAM_ROWS rows whose texts are written at once
SOURCE_CONNECTIONS = 4  # connections the source's digests are shared out over: more than a server's two cores, as a
# range scan also waits on reading its pages
STATISTICS_POINTS = 4  # points a range's worth of a data file's rows is spread over, to cut ranges by statistics
_UNDIGESTED = ("float", "double")
_UTF8 = ("utf8mb4", "utf8mb3", "utf8")  # charsets whose bytes are utf8mb4's


def digestible(shape: TableShape, policy: ColumnPolicy) -> bool:
    """Whether the table's rows have a text both sides write alike and a key the server can cut into ranges."""
    if len(shape.primary_key) != 1 or policy.touches(shape):
        return False  # a column policy's values are made in Python (core/column_policy), not on the server
    key = next(c for c in shape.columns if c.name == shape.primary_key[0])
    return key.type in INTEGER_TYPES and not any(c.type in _UNDIGESTED for c in shape.columns)


def _value_sql(col: ColumnSpec) -> str:
    """The column's value as the text of a digest, on the server."""
    name = quote_identifier(col.name)
    if col.type in BINARY_TYPES or col.type == "vector":
        if col.type == "geometry":  # the lakehouse keeps the WKB without MySQL's 4-byte SRID prefix
            return f"HEX(SUBSTRING({name}, 5))"
        return f"HEX({name})"
    if col.type in ("bit", "year"):
        return f"CAST({name} AS SIGNED)"  # BIT(64)'s top bit set: negative, as the lakehouse's long holds it
    if col.type in INTEGER_TYPES or col.type in ("decimal", "date", "datetime", "timestamp", "time"):
        return name  # its text is CAST(… AS CHAR)'s, made implicitly by IFNULL: the cast costs the server a quarter
    if col.type in PRINTED_BINARY_TYPES:
        return f"CAST({name} AS CHAR)"
    if col.type in TEXT_TYPES and col.type != "json" and col.charset in _UTF8:
        return name  # its bytes are utf8mb4's already: a conversion would cost the server a tenth of its digest
    return f"CONVERT({name} USING utf8mb4)"


_DELIMITED = (*INTEGER_TYPES, *BINARY_TYPES, "vector", "bit", "year", "decimal", "date", "datetime", "timestamp", "time")


def _self_delimited(col: ColumnSpec) -> bool:
    """Whether the column's text never holds a comma (digits, signs, dates, hex), so a comma can end it and no
    length need frame it: the server's cheaper text for most columns."""
    return col.type in _DELIMITED


def row_text_sql(shape: TableShape) -> str:
    """Each row's digest text, as a SQL expression: a value whose text holds no comma written followed by one (`N,`
    for NULL), any other as its byte length, a colon and its text (`-` for NULL)."""
    parts = []
    for col in shape.columns:
        value = _value_sql(col)
        if _self_delimited(col):
            parts.append(f"IFNULL({value}, 'N'), ','")
        else:
            parts.append(f"IF({quote_identifier(col.name)} IS NULL, '-', CONCAT(LENGTH({value}), ':', {value}))")
    return "CONCAT(" + ", ".join(parts) + ")"


def _duckdb_value(col: ColumnSpec, t: pa.DataType, name: str) -> str | None:
    """The column's value as the text of a digest, as a DuckDB expression over its Arrow values (None: a type left
    to `_value_texts`)."""
    if col.type == "vector":
        return None
    if pa.types.is_integer(t) or pa.types.is_string(t):
        return f"{name}::VARCHAR"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"{name}::VARCHAR"  # every digit of the scale, as MySQL prints it (a zero too)
    if pa.types.is_binary(t):
        return f"hex({name})"
    if pa.types.is_date32(t):
        return f"strftime({name}, '%Y-%m-%d')"
    if pa.types.is_timestamp(t) and t.unit == "us":  # tz-aware ones are handed over in UTC, without their zone
        if not col.fsp:
            return f"strftime({name}, '%Y-%m-%d %H:%M:%S')"
        return f"left(strftime({name}, '%Y-%m-%d %H:%M:%S.%f'), {20 + col.fsp})"
    return None


def row_texts(shape: TableShape, rows: pa.Table) -> pa.Array:
    """Each row's digest text (binary), as `row_text_sql` writes it on the server."""
    columns: dict[str, pa.Array] = {}
    parts = []
    for n, col in enumerate(shape.columns):
        values = rows.column(col.name).combine_chunks()
        if pa.types.is_timestamp(values.type) and values.type.tz is not None:
            values = pc.cast(values, pa.timestamp(values.type.unit))  # its UTC wall time, as the server's session
        name = f"c{n}"
        value = _duckdb_value(col, values.type, name)
        if value is None:
            values, value = pc.cast(_value_texts(col, values), pa.string()), name
        columns[name] = values
        if _self_delimited(col):
            parts.append(f"coalesce({value}, 'N') || ','")
        else:
            parts.append(f"coalesce(strlen({value})::VARCHAR || ':' || {value}, '-')")
    if not parts:
        return pa.array([b""] * rows.num_rows, pa.binary())
    with duckdb.connect() as con:
        con.register("rows", pa.table(columns))
        texts = con.sql(f"SELECT concat({', '.join(parts)}) AS t FROM rows").arrow().read_all().column("t")
    return pc.cast(texts.combine_chunks(), pa.binary())


def _value_texts(col: ColumnSpec, values: pa.Array) -> pa.Array:
    """The column's values as the text of a digest (binary), in Arrow: the types `_duckdb_value` leaves."""
    t = values.type
    if col.type == "vector":
        texts = [None if v is None else np.asarray(v, "<f4").tobytes().hex().upper().encode() for v in values.to_pylist()]
        return pa.array(texts, pa.binary())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([None if v is None else v.hex().upper().encode() for v in values.to_pylist()], pa.binary())
    if pa.types.is_timestamp(t):  # MySQL prints as many fraction digits as the column declares
        whole = pc.cast(pc.floor_temporal(values, unit="second"), pa.timestamp("s", tz=t.tz))
        text = pc.strftime(whole, format="%Y-%m-%d %H:%M:%S")
        if col.fsp:
            micros = np.mod(pc.fill_null(pc.cast(values, pa.int64()), 0).to_numpy(), 1_000_000)
            digits = pc.utf8_slice_codeunits(pc.utf8_lpad(pa.array(micros).cast(pa.string()), 6, "0"), 0, col.fsp)
            text = pc.binary_join_element_wise(text, digits, ".")
        return pc.cast(text, pa.binary())
    if pa.types.is_decimal(t):  # Arrow writes a zero of some scale as 0E-10; MySQL as 0.0000000000
        return pa.array([None if v is None else format(v, "f").encode() for v in values.to_pylist()], pa.binary())
    return pc.cast(pc.cast(values, pa.string()), pa.binary())


Part = tuple[int | None, int | None]  # keys from low (None: unbounded) up to, not including, high (None: unbounded)
Digests = dict[int, tuple[int, int]]  # part number -> (rows, sum of their CRC-32s); parts without rows left out
DIGEST_TEXT_FORMAT = "1"  # changed whenever `row_texts` writes a text otherwise: digest rows kept before are not read


def _as_numbers(keys: pa.Array) -> np.ndarray:
    if _unsigned(keys.type):
        return pc.cast(keys, pa.uint64()).to_numpy(zero_copy_only=False)
    return pc.cast(keys, pa.int64()).to_numpy(zero_copy_only=False)


def digest_rows(shape: TableShape, rows: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key and the CRC-32 of its digest text (rows of the current state: `live_rows`)."""
    crcs = np.fromiter(map(zlib.crc32, row_texts(shape, rows).to_pylist()), np.uint32, rows.num_rows)
    return _as_numbers(rows.column(shape.primary_key[0]).combine_chunks()), crcs


@dataclass(frozen=True)
class DataFile:
    path: str  # relative to the table's directory, as the Delta log names it
    name: str  # of its digest rows kept (lake/file_digests.py)


@dataclass
class LakeRows:
    """A current state's rows as its digests need them: every live row's key and CRC-32, and its keys sorted (to cut
    parts at and find a part's keys by)."""

    keys: np.ndarray
    crcs: np.ndarray  # uint32, the CRC-32 of the row of the same place in `keys`
    sorted_keys: np.ndarray
    files: int  # the table's data files (0: read whole through a query)
    files_kept: int  # of them, those whose rows' CRC-32s were kept from an earlier repair


class _Found:
    """Keys and CRC-32s gathered into one pair of arrays as they are read or written (a 10M-row table's: 120 MB),
    grown as needed."""

    def __init__(self, rows: int, key_type: np.dtype) -> None:
        self.keys, self.crcs, self.at = np.empty(rows, key_type), np.empty(rows, np.uint32), 0

    def add(self, keys: np.ndarray, crcs: np.ndarray) -> None:
        end = self.at + len(keys)
        if end > len(self.keys):
            more = max(end, 2 * len(self.keys))
            self.keys, self.crcs = np.resize(self.keys, more), np.resize(self.crcs, more)
        self.keys[self.at : end], self.crcs[self.at : end] = keys, crcs
        self.at = end

    def rows(self, files: int, files_kept: int) -> LakeRows:
        keys, crcs = self.keys[: self.at], self.crcs[: self.at]
        return LakeRows(keys, crcs, np.sort(keys, kind="stable"), files, files_kept)


def _file_identities(lakehouse: Lakehouse, table: TableRef, paths: list[str]) -> dict[str, str]:
    """Each data file's size and modification time as the storage says (one listing of the table's directory): a
    file written again in place, outside Delta, is not taken for the file its digest rows were kept of."""
    access = lakehouse.file_access()
    fs, folder = access.filesystem(), access.path(lakehouse.table_key(CURRENT, table))
    listed = {
        info.base_name: f"{info.size}|{info.mtime_ns}"
        for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        if info.type == pafs.FileType.File
    }
    found = {}
    for path in paths:
        if path not in listed:  # in a folder of its own: asked alone
            info = fs.get_file_info(f"{folder}/{path}")
            listed[path] = f"{info.size}|{info.mtime_ns}" if info.type == pafs.FileType.File else "missing"
        found[path] = listed[path]
    return found


def lake_rows(lakehouse: Lakehouse, table: TableRef, current: DeltaTable, shape: TableShape) -> LakeRows:
    """Every live row's key and CRC-32: those kept of a data file by an earlier repair read back, the others' texts
    written now (the rows of many files together, STREAM_ROWS at a time; each file read once) and kept for the next
    repair. A table whose files a reader cannot take one by one (deletion vectors, mapped column names, partitions)
    is read whole through a query, and nothing is kept of it."""
    schema = pa.schema(current.schema().to_arrow())
    read = pa.schema([schema.field(n) for n in [*shape.column_names, DELETED_COLUMN] if n in schema.names])
    key_type = np.dtype(np.uint64 if _unsigned(read.field(shape.primary_key[0]).type) else np.int64)
    if not files_read_alone(current):
        remove_file_digests(lakehouse.store, table)  # kept while its files could be read one by one: never read now
        found = _Found(0, key_type)
        sql = f"SELECT {', '.join(quote(n) for n in read.names)} FROM current"
        for rows in read_query_chunks(current, sql, "current", STREAM_ROWS):
            found.add(*digest_rows(shape, live_rows(rows)))
        return found.rows(0, 0)
    actions = file_actions(current)  # paths, sizes and times: no statistics
    texts = hashlib.sha256(f"{DIGEST_TEXT_FORMAT}|{shape.columns!r}|{shape.primary_key!r}|{read}".encode()).hexdigest()
    files: list[DataFile] = []
    if actions.num_rows:
        paths = actions.column("path").to_pylist()
        stored = _file_identities(lakehouse, table, paths)
        times = pc.cast(actions.column("modification_time"), pa.int64()).to_pylist()
        logged = zip(actions.column("size_bytes").to_pylist(), times, strict=True)
        for path, (size, when) in zip(paths, logged, strict=True):
            identity = f"{texts}|{path}|{size}|{when}|{stored[path]}"
            files.append(DataFile(path, hashlib.sha256(identity.encode()).hexdigest()[:32]))
    records = sum(n or 0 for n in actions.column("num_records").to_pylist()) if "num_records" in actions.column_names else 0
    found = _Found(records, key_type)  # live rows are at most the records the files hold (grown where not said)

    def take(rows: pa.Table) -> None:
        found.add(_as_numbers(rows.column("key").combine_chunks()), rows.column("crc").to_numpy())

    kept = load_file_digests(lakehouse.store, table, {f.name for f in files}, pa.from_numpy_dtype(key_type), take)
    unkept = [f for f in files if f.name not in kept.names]
    writer = FileDigestWriter(lakehouse.store, table)
    for rows in kept.carried:
        writer.add(rows)
    access, table_key = lakehouse.file_access(), lakehouse.table_key(CURRENT, table)
    pending: list[tuple[DataFile, pa.Table]] = []
    texts_written: deque[tuple[list[tuple[DataFile, pa.Table]], Future[tuple[np.ndarray, np.ndarray]]]] = deque()

    def kept_of(done: list[tuple[DataFile, pa.Table]], keys: np.ndarray, crcs: np.ndarray) -> None:
        numbers = np.repeat(np.arange(len(done), dtype=np.int32), [r.num_rows for _, r in done])
        dictionary = pa.array([f.name for f, _ in done], pa.string())
        names = pa.DictionaryArray.from_arrays(pa.array(numbers), dictionary)
        writer.add(pa.table({"name": names, "key": keys, "crc": crcs}))
        found.add(keys, crcs)

    # the texts of one group of rows are written (DuckDB, outside the GIL) while the next group's files are read
    with ThreadPoolExecutor(TEXT_WORKERS) as pool:

        def submitted() -> None:
            group = list(pending)
            pending.clear()
            texts_written.append((group, pool.submit(digest_rows, shape, pa.concat_tables([r for _, r in group]))))

        def taken_in(waiting: int) -> None:  # the oldest groups' texts taken in, until `waiting` are left
            while len(texts_written) > waiting:
                done, future = texts_written.popleft()
                kept_of(done, *future.result())

        for f in unkept:
            groups = [live_rows(conformed(rows, read)) for rows in read_files(access, table_key, [f.path], read.names)]
            pending.append((f, pa.concat_tables(groups) if groups else read.empty_table()))
            if sum(r.num_rows for _, r in pending) >= STREAM_ROWS:
                submitted()
                taken_in(TEXT_WORKERS)
        if pending:
            submitted()
        taken_in(0)
    writer.flush()
    remove_objects(lakehouse.store, kept.stale)  # after what they held that is still needed is written
    latest = lakehouse.open(CURRENT, table)
    if latest is None or written_by_others(latest, current.version()) is not None:
        remove_file_digests(lakehouse.store, table)  # a rewrite's purge (forget) may have come first
    return found.rows(len(files), len(files) - len(unkept))


def _unsigned(t: pa.DataType) -> bool:
    return pa.types.is_decimal(t) or pa.types.is_unsigned_integer(t)  # BIGINT UNSIGNED: decimal(20,0)


def ranges_by_file_statistics(current: DeltaTable, key: str) -> list[Part] | None:
    """The whole key range cut into parts of about ROWS_PER_RANGE rows from the data files' statistics alone (each
    file's rows taken as spread evenly from its lowest key to its highest), so that the source starts digesting
    before the lakehouse's rows are read (a 10M-row table's kept CRC-32s: most of a second). None when a file has no
    statistics of the key. Where the cuts fall never decides what is found: every key lies in exactly one part on
    both sides, and a part that holds more rows than its share only costs its query more (a differing one is cut
    again by the lakehouse's own keys, `parts_within`)."""
    actions = pa.table(current.get_add_actions(flatten=True))
    columns = (f"min.{key}", f"max.{key}", "num_records")
    if actions.num_rows == 0:
        return [(None, None)]
    if any(c not in actions.column_names for c in columns):
        return None
    files = [f for f in zip(*(actions.column(c).to_pylist() for c in columns), strict=True) if f[2] != 0]
    if any(v is None for f in files for v in f):
        return None
    samples: list[tuple[int, float]] = []  # (key, rows): each file's rows as points evenly within its keys
    for low, high, rows in files:
        low, high = int(low), int(high)
        points = max(1, min(rows * STATISTICS_POINTS // ROWS_PER_RANGE, high - low + 1))
        samples += [(low + (high - low) * (2 * i + 1) // (2 * points), rows / points) for i in range(points)]
    samples.sort()
    edges: list[int | None] = [None]
    held = 0.0
    for point, rows in samples:
        if held >= ROWS_PER_RANGE and (edges[-1] is None or point > edges[-1]):
            edges.append(point)
            held = 0.0
        held += rows
    edges.append(None)
    return list(zip(edges, edges[1:], strict=False))


def parts_of_table(rows: LakeRows) -> list[Part]:
    """The whole key range cut into parts of about ROWS_PER_RANGE of the lakehouse's rows each (its keys sorted as
    runs: a current state's files mostly hold them in order, which a stable sort takes in a fraction of a quicksort's
    time)."""
    return cut(rows.sorted_keys, [(None, None)], ROWS_PER_RANGE)


def parts_within(rows: LakeRows, parts: list[Part]) -> list[Part]:
    """`parts` cut again into parts of about ROWS_PER_PART of the lakehouse's rows each."""
    return cut(rows.sorted_keys, parts, ROWS_PER_PART)


def cut(keys: np.ndarray, parts: list[Part], rows: int) -> list[Part]:
    """Each part cut at every `rows`-th of the sorted `keys` it holds (a part holding none stays whole)."""
    cuts: list[Part] = []
    for low, high in parts:
        held = _within(keys, low, high)
        edges = [low, *(int(k) for k in keys[held.start + rows : held.stop : rows]), high]
        cuts += [(a, b) for a, b in zip(edges, edges[1:], strict=False) if a is None or b is None or a < b]
    return cuts


def _within(sorted_keys: np.ndarray, low: int | None, high: int | None) -> slice:
    """Where the part from `low` up to (not including) `high` lies in `sorted_keys`."""
    first = 0 if low is None else int(np.searchsorted(sorted_keys, low, side="left"))
    end = len(sorted_keys) if high is None else int(np.searchsorted(sorted_keys, high, side="left"))
    return slice(first, end)


def _where(quoted: str, parts: list[Part]) -> str:
    """A WHERE clause keeping the rows of `parts` ('' when a part is unbounded on both sides)."""
    clauses = []
    for low, high in _spans(parts):
        bounds = [f"{quoted} >= {low}" if low is not None else "", f"{quoted} < {high}" if high is not None else ""]
        if not any(bounds):
            return ""
        clauses.append("(" + " AND ".join(b for b in bounds if b) + ")")
    return " WHERE " + " OR ".join(clauses) if clauses else " WHERE FALSE"


def _spans(parts: list[Part]) -> list[Part]:
    """Parts next to each other (one's high the next's low) joined: a whole table's parts are one span."""
    spans: list[Part] = []
    for low, high in parts:
        if spans and spans[-1][1] is not None and spans[-1][1] == low:
            spans[-1] = (spans[-1][0], high)
        else:
            spans.append((low, high))
    return spans


def source_digests(url: MySQLUrl, shape: TableShape, parts: list[Part], connections: int = SOURCE_CONNECTIONS) -> Digests:
    """The source's digest of each part: a query per part (a range scan of the primary key), the parts shared out
    over `connections` connections so the server digests on as many cores."""
    key = quote_identifier(shape.primary_key[0])
    table = quoted_table(shape.table)
    text = row_text_sql(shape)

    def digest(numbers: list[int]) -> Digests:
        found: Digests = {}
        conn = source.connect(url)
        try:
            with conn.cursor(pymysql.cursors.Cursor) as cur:
                for n in numbers:
                    where = _where(key, [parts[n]])
                    cur.execute(f"SELECT COUNT(*), SUM(CRC32({text})) FROM {table}{where}")
                    rows, total = cur.fetchone()
                    if rows:
                        found[n] = (int(rows), int(total))
        finally:
            conn.close()
        return found

    shares = [list(range(i, len(parts), connections)) for i in range(min(connections, len(parts)))]
    with ThreadPoolExecutor(len(shares) or 1) as pool:
        return {n: d for found in pool.map(digest, shares) for n, d in found.items()}


def _part_numbers(keys: np.ndarray, parts: list[Part]) -> np.ndarray:
    """Each key's part (-1: in none): the last whose low is not above it, if the key is below its high."""
    if not parts:
        return np.full(len(keys), -1, np.int64)
    info = np.iinfo(keys.dtype)
    lows = np.array([info.min if low is None else low for low, _ in parts], keys.dtype)
    highs = np.array([info.max if high is None else high for _, high in parts], keys.dtype)
    unbounded = np.array([high is None for _, high in parts])
    numbers = np.searchsorted(lows, keys, side="right") - 1
    inside = numbers >= 0
    clipped = np.maximum(numbers, 0)
    inside &= (keys < highs[clipped]) | unbounded[clipped]
    return np.where(inside, numbers, -1)


def lake_digests(keys: np.ndarray, crcs: np.ndarray, parts: list[Part]) -> Digests:
    """The lakehouse's digest of each part, as `source_digests`, from its rows' keys and CRC-32s (`LakeRows`),
    STREAM_ROWS at a time (a part's number per row is eight bytes)."""
    counts = np.zeros(len(parts), np.int64)
    # the sums of each CRC-32's high and low 16 bits, each exact in float64 for up to 2**37 rows a part (a part cut
    # by statistics may hold far more rows than its share)
    highs, lows = np.zeros(len(parts), np.float64), np.zeros(len(parts), np.float64)
    for start in range(0, len(keys), STREAM_ROWS):
        numbers = _part_numbers(keys[start : start + STREAM_ROWS], parts)
        inside = numbers >= 0
        counts += np.bincount(numbers[inside], minlength=len(parts))
        chunk = crcs[start : start + STREAM_ROWS][inside]
        highs += np.bincount(numbers[inside], weights=chunk >> 16, minlength=len(parts))
        lows += np.bincount(numbers[inside], weights=chunk & 0xFFFF, minlength=len(parts))
    return {n: (int(counts[n]), (int(highs[n]) << 16) + int(lows[n])) for n in range(len(parts)) if counts[n]}


def differing_parts(source: Digests, lake: Digests, parts: list[Part]) -> list[Part]:
    """The parts whose digests differ."""
    return [parts[n] for n in sorted(source.keys() | lake.keys()) if source.get(n) != lake.get(n)]


def keys_in_parts(conn: pymysql.Connection, sorted_keys: np.ndarray, table: TableRef, key: str, parts: list[Part]) -> set[tuple]:
    """Every key either side holds in the parts (the lakehouse's among its `sorted_keys`): the rows to compare one
    by one."""
    if not parts:
        return set()
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        q = quote_identifier(key)
        cur.execute(f"SELECT {q} FROM {quoted_table(table)}{_where(q, parts)}")
        found = {(row[0],) for row in cur.fetchall()}
    for low, high in parts:
        found |= {(int(k),) for k in sorted_keys[_within(sorted_keys, low, high)]}
    return found


@dataclass
class Narrowed:
    """Where a table may differ from its source, by its digests."""

    keys: set[tuple]  # every key of the parts that still differed: the only rows that can differ
    ranges: int  # the key ranges the table was cut into
    differing: int  # of those, the ranges whose digests differed
    source_rows: int
    lake_rows: int
    files: int = 0  # the lakehouse's data files digested
    files_kept: int = 0  # of them, those whose rows' CRC-32s were kept from an earlier repair

    def describe(self) -> str:
        kept = f"; {self.files_kept} of {self.files} data files' digests kept from an earlier repair" if self.files else ""
        return f"{self.differing} of {self.ranges} key ranges differed by their digests{kept}"


def narrowed(
    url: MySQLUrl, conn: pymysql.Connection, lakehouse: Lakehouse, table: TableRef, current: DeltaTable, shape: TableShape
) -> Narrowed:
    """The keys that may differ: the table's ranges digested on both sides at once (cut by the data files'
    statistics, so the source starts first; by the lakehouse's keys where a file has none), the ranges that differ
    cut into parts and digested again, and the keys of the parts that still differ."""
    ranges = ranges_by_file_statistics(current, shape.primary_key[0])
    with ThreadPoolExecutor(1) as pool:
        theirs = pool.submit(source_digests, url, shape, ranges) if ranges is not None else None
        lake = lake_rows(lakehouse, table, current, shape)
        if theirs is None:
            ranges = parts_of_table(lake)
            theirs = pool.submit(source_digests, url, shape, ranges)
        assert ranges is not None
        ours = lake_digests(lake.keys, lake.crcs, ranges)
        theirs_now = theirs.result()
        differing = differing_parts(theirs_now, ours, ranges)
    rows = (sum(n for n, _ in theirs_now.values()), sum(n for n, _ in ours.values()))
    parts = parts_within(lake, differing) if differing else []
    if parts:
        parts = differing_parts(source_digests(url, shape, parts), lake_digests(lake.keys, lake.crcs, parts), parts)
    keys_found = keys_in_parts(conn, lake.sorted_keys, shape.table, shape.primary_key[0], parts)
    return Narrowed(keys_found, len(ranges), len(differing), *rows, lake.files, lake.files_kept)
