"""Data files of the lakehouse's Delta tables, written and read in any process (the run's, or a Spark executor)
through pyarrow's own filesystems, so executors reach a local directory or S3 without Hadoop's S3 jars; and
the run process's commit of files written elsewhere, in one Delta commit.

A Spark task writes a table's rows as Parquet files under the table's directory and returns each file's Delta
add action (path, size, statistics); the run process commits the adds (and the removes of the files they
replace) with delta-rs. A file no commit names is invisible to every reader; a crash between the write and
the commit leaves only such files, which the next run's commit does not name either.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import S3Retries
from cdc_assets.lake.delta import (
    MAX_DECIMAL_PRECISION_WITH_STATS,
    fenced,
    file_actions,
    file_paths,
    files_past,
    files_read_alone,
    long_value_columns,
    plain_schema,
    read_query,
    read_query_chunks,
    seq_commit,
    seq_landed,
)

FILE_ROWS = 1_000_000  # rows per data file written by a task, at most
ROW_GROUP_ROWS = 128 * 1024

# What a task returns for each file it wrote: the table, and the fields of its Delta add action.
FILE_ACTION_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),  # the table's text form (names.TableRef)
        pa.field("path", pa.string(), nullable=False),  # relative to the table's directory
        pa.field("size", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("stats", pa.string(), nullable=False),  # Delta statistics, JSON
        pa.field("modification_time", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class FileAccess:
    """How any process reaches the lakehouse's files: its location and, on S3, delta-rs's storage options
    (endpoint, region, keys). Plain and picklable, so a Spark task gets it with its closure; never printed."""

    location: str  # a local directory or s3://bucket/prefix
    storage_options: tuple[tuple[str, str], ...] = ()
    retries: S3Retries = S3Retries()

    def __repr__(self) -> str:  # the options hold credentials
        return f"FileAccess({self.location!r})"

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    def filesystem(self) -> pafs.FileSystem:
        if not self.is_s3:
            return pafs.LocalFileSystem()
        options = dict(self.storage_options)
        endpoint = options.get("AWS_ENDPOINT_URL", "")
        scheme, _, host = endpoint.partition("://")
        return pafs.S3FileSystem(
            access_key=options.get("AWS_ACCESS_KEY_ID"),
            secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
            session_token=options.get("AWS_SESSION_TOKEN"),
            region=options.get("AWS_REGION"),
            endpoint_override=host or None,
            scheme=scheme or "https",
            connect_timeout=self.retries.timeout_seconds,
            request_timeout=self.retries.timeout_seconds,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=self.retries.max_attempts),
        )

    def path(self, key: str) -> str:
        """The filesystem path of a lakehouse key (`current/s/t/part-….parquet`)."""
        if self.is_s3:
            return f"{self.location[len('s3://') :].rstrip('/')}/{key}"
        return f"{self.location.rstrip('/')}/{key}"


# -- statistics ------------------------------------------------------------------------------------------------


def _bound(value: Any, kind: pa.DataType, upper: bool) -> Any:
    """A JSON value for a statistic: exact, or widened outward (timestamps to whole milliseconds, as Delta
    readers expect them), so a reader that skips files by them never skips a matching row."""
    if pa.types.is_timestamp(kind):
        moment: dt.datetime = value
        millis = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
        if upper and millis != moment:
            millis += dt.timedelta(milliseconds=1)
        text = millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}"
        return text + "Z" if kind.tz else text
    if pa.types.is_date(kind):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return value


def _has_stats(kind: pa.DataType) -> bool:
    if pa.types.is_decimal(kind):
        return kind.precision <= MAX_DECIMAL_PRECISION_WITH_STATS
    return (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
    )


def delta_stats(rows: pa.Table, long: Iterable[str] = ()) -> str:
    """Delta statistics of a data file's rows: row count, and min, max and null count of each column a reader
    can skip files by (integers, text, booleans, dates, timestamps, narrow decimals), but the `long` columns
    (`lake.delta.long_value_columns`: a statistic would hold a copy of their longest values)."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    left_out = set(long)
    for field in rows.schema:
        if not _has_stats(field.type) or field.name in left_out:
            continue
        column = rows.column(field.name)
        nulls[field.name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        minimum[field.name] = _bound(low.as_py(), field.type, upper=False)
        maximum[field.name] = _bound(high.as_py(), field.type, upper=True)
    return json.dumps(
        {"numRecords": rows.num_rows, "minValues": minimum, "maxValues": maximum, "nullCount": nulls},
        ensure_ascii=False,
    )


# -- writing and reading on any process ------------------------------------------------------------------------


def write_files(
    access: FileAccess, table_key: str, table_text: str, rows: Iterable[pa.Table], piece_bytes: int | None = None
) -> Iterator[dict]:
    """The rows as Parquet files under the table's directory, FILE_ROWS at most each; one add action per file
    (FILE_ACTION_SCHEMA's fields). Each file is complete before its action is returned.

    With `piece_bytes` (rows in key order: current state's pieces, stages.current.rows.CURRENT_PIECE_BYTES), files of
    that size to under twice it instead, each a stretch of consecutive rows: the first file, of FIRST_PIECE_ROWS,
    tells the bytes a row takes."""
    fs = access.filesystem()
    if not access.is_s3:
        fs.create_dir(access.path(table_key), recursive=True)
    pending: list[pa.Table] = []
    held = 0
    per_file = FILE_ROWS if piece_bytes is None else FIRST_PIECE_ROWS

    def flush(data: pa.Table) -> dict:
        data = data.combine_chunks()  # one row group a ROW_GROUP_ROWS, whatever the slices it was put together from
        name = f"part-{uuid.uuid4().hex}-c000.zstd.parquet"
        path = access.path(f"{table_key}/{name}")
        long = long_value_columns(data)
        statistics = [n for n in data.column_names if n not in long] if long else True
        with fs.open_output_stream(path) as out:
            pq.write_table(data, out, compression="zstd", row_group_size=ROW_GROUP_ROWS, write_statistics=statistics)
        size = fs.get_file_info(path).size
        return {
            "table": table_text,
            "path": name,
            "size": size,
            "rows": data.num_rows,
            "stats": delta_stats(data, long),
            "modification_time": int(time.time() * 1000),
        }

    def joined() -> pa.Table:
        return pa.concat_tables(pending).combine_chunks() if len(pending) > 1 else pending[0]

    written = 0
    for part in rows:
        if not part.num_rows:
            continue
        pending.append(part)
        held += part.num_rows
        if piece_bytes is None:
            if held >= FILE_ROWS:
                yield flush(joined())
                pending, held = [], 0
            continue
        while held >= 2 * per_file:  # what stays after this file is a file's worth at least
            data, size = joined(), per_file
            action = flush(data.slice(0, size))
            written += 1
            if written == 1:  # aim at the middle of [piece, 2 x piece)
                per_file = max(1, int(1.5 * piece_bytes * action["rows"] / max(action["size"], 1)))
            yield action
            pending, held = [data.slice(size)], data.num_rows - size
    if pending:
        yield flush(joined())


FIRST_PIECE_ROWS = 2048


def read_files(
    access: FileAccess, table_key: str, paths: Iterable[str], columns: list[str] | None = None, batch_rows: int | None = None
) -> Iterator[pa.Table]:
    """The rows of some of a table's data files (paths relative to its directory), a row group at a time (or at
    most `batch_rows` rows at a time); of `columns`, those each file has (an older file may lack a column added since)."""
    fs = access.filesystem()
    for name in paths:
        with fs.open_input_file(access.path(f"{table_key}/{name}")) as source:
            parquet = pq.ParquetFile(source)
            wanted = None if columns is None else [c for c in columns if c in parquet.schema_arrow.names]
            if batch_rows is not None:
                for batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
                    yield pa.Table.from_batches([batch])
                continue
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=wanted)


def read_table_chunks(access: FileAccess, table_key: str, table: DeltaTable, rows_per_chunk: int) -> Iterator[pa.Table]:
    """Every row of a Delta table, about `rows_per_chunk` at a time, in the table's schema now (plain Arrow types),
    for tables too large to hold at once. File by file through pyarrow where each file holds its rows as the table
    shows them, not through delta-rs's query engine: its scan keeps what it read of each file's metadata for the
    life of the process (about 30 KB a file: 95 MB for a 10M-row current state of 3,183 files, benchmarks/README.md)."""
    if not files_read_alone(table):
        yield from read_query_chunks(table, "SELECT * FROM t", "t", rows_per_chunk)
        return
    schema = plain_schema(table)
    paths = file_paths(table)
    pending: list[pa.Table] = []
    held = 0
    for rows in read_files(access, table_key, paths, batch_rows=rows_per_chunk):
        pending.append(conformed(rows, schema))
        held += rows.num_rows
        if held >= rows_per_chunk:
            yield pa.concat_tables(pending)
            pending, held = [], 0
    if pending:
        yield pa.concat_tables(pending)


def read_rows_after(
    access: FileAccess, table_key: str, table: DeltaTable, seq: int | None, columns: list[str] | None = None
) -> pa.Table:
    """The rows of a table with a `_cdc_seq` past `seq` (every row when None), of `columns` (all when None), in the
    table's schema now (plain Arrow types), as `SELECT … WHERE _cdc_seq > seq` through delta-rs's query engine gives
    them, in no particular order. Read through pyarrow from only the files whose highest `_cdc_seq` (their statistics)
    is past `seq`: a query's set-up alone costs about what reading a small change log's new rows does, and a run
    reads them a few times per table it touches (issue 45)."""
    if not files_read_alone(table):
        picked = "*" if columns is None else ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
        where = "" if seq is None else f' WHERE "_cdc_seq" > {int(seq)}'
        return read_query(table, f"SELECT {picked} FROM t{where}", "t")
    schema = plain_schema(table)
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    paths = files_past(file_actions(table), seq).column("path").to_pylist()
    wanted = None if columns is None else list({*columns, "_cdc_seq"})
    parts = [
        conformed(rows, schema) if seq is None else _past(rows, seq, schema)
        for rows in read_files(access, table_key, paths, wanted)
    ]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _past(rows: pa.Table, seq: int, schema: pa.Schema) -> pa.Table:
    return conformed(rows.filter(pc.greater(rows.column("_cdc_seq"), seq)), schema)


def conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows of an older file in a table's schema now: columns it lacks are NULL, types widened as the log's."""
    from cdc_assets.lake.delta import plain_types  # view types from delta-rs queries become plain ones

    rows = plain_types(rows)
    arrays = [
        rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def put_object(access: FileAccess, key: str, data: bytes) -> None:
    """A small object written whole or not at all, from any process: on S3 a single PUT appears only when
    complete; locally a hidden temporary file (which the store's listings skip) is renamed into place."""
    fs = access.filesystem()
    path = access.path(key)
    if access.is_s3:
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    parent, _, name = path.rpartition("/")
    fs.create_dir(parent, recursive=True)
    temporary = f"{parent}/.{name}.{uuid.uuid4().hex}"
    with fs.open_output_stream(temporary) as out:
        out.write(data)
    fs.move(temporary, path)


# -- committing in the run process -----------------------------------------------------------------------------


def add_actions(rows: Iterable[dict], data_change: bool = True) -> list[AddAction]:
    """Add actions of files a task wrote (FILE_ACTION_SCHEMA rows); `data_change` False for a compaction."""
    return [
        AddAction(r["path"], int(r["size"]), {}, int(r["modification_time"]), data_change, r["stats"]) for r in rows
    ]


def remove_actions(table: DeltaTable, paths: Iterable[str], data_change: bool = True) -> list[RemoveAction]:
    """Remove actions of some of the table's files (paths relative to its directory), with their sizes."""
    wanted = set(paths)
    actions = file_actions(table)
    now = int(time.time() * 1000)
    return [
        RemoveAction(path, data_change, now, size)
        for path, size in zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True)
        if path in wanted
    ]


def commit_files(
    existing: DeltaTable | None,
    uri: str,
    storage_options: dict[str, str] | None,
    what: str,
    schema: pa.Schema,
    adds: list[AddAction],
    removes: list[RemoveAction],
    seq_key: str,
    seq: int,
    configuration: dict[str, str],
    overwrite: bool = False,
) -> None:
    """One Delta commit of files written elsewhere, recording `seq` as the table's app transaction (fenced from
    the version `existing` was read at, see lake.delta.seq_commit).

    An append commits the adds and the removes together; columns `schema` has and the table has not are added
    first, in a commit of their own (NULL in every row until then: nothing a reader can tell). An overwrite
    replaces every file of the table by the adds and the table's schema by `schema` (a column's type changed).
    A table that does not exist yet is created by the commit, with `configuration`.

    A commit that replaces files (removes, or an overwrite) was computed from the files of the version
    `existing` was read at, so it is made at exactly the next version (no silent rebase: delta-rs' conflict
    check lets a remove of a file an OPTIMIZE already compacted through, and the compacted copy of its rows
    would then stay beside their rewrite). When another commit took that version, the commit goes on from the
    newest version only if that still holds every file it replaces; else the run stops with one sentence."""
    with fenced(what, seq_landed(uri, storage_options, seq_key, seq)):
        if existing is None:
            create_table_with_add_actions(
                uri,
                Schema.from_arrow(schema),
                adds,
                mode="append",
                configuration=configuration,
                storage_options=storage_options,
                commit_properties=seq_commit(seq_key, seq),
            )
            return
        if not overwrite:
            have = {f.name for f in existing.schema().fields}
            added = [f for f in schema if f.name not in have]
            if added:
                existing.alter.add_columns(Schema.from_arrow(pa.schema(added)).fields)
        replaces = overwrite or bool(removes)
        # what the version read holds, taken only when a commit was refused (each is a pass over the table's log)
        read_files: set[str] | None = None
        read_seq: int | None = None
        for _ in range(MAX_REBASES + 1):
            try:
                if overwrite:
                    existing.create_write_transaction(
                        adds, mode="overwrite", schema=schema, commit_properties=seq_commit(seq_key, seq, exact=True)
                    )
                else:
                    existing.create_write_transaction(
                        [*removes, *adds], mode="append", schema=existing.schema(),
                        commit_properties=seq_commit(seq_key, seq, exact=replaces),
                    )  # fmt: skip
                return
            except CommitFailedError:
                if not replaces:
                    raise
                if read_files is None:  # a refused commit leaves `existing` at the version it was read at
                    read_files, read_seq = _file_paths(existing), existing.transaction_version(seq_key)
                read_version = existing.version()
                existing.update_incremental()
                if existing.version() == read_version:  # no other commit: not a race
                    raise
                if existing.transaction_version(seq_key) != read_seq:  # the run that took over this one's lock
                    raise CommitFailedError("Concurrent transaction: another run recorded its seq") from None
                now = _file_paths(existing)
                kept = now == read_files if overwrite else {r.path for r in removes} <= now
                if not kept:
                    raise CdcUserError(
                        f"Another writer (an OPTIMIZE or another run) changed files of {what} while this run was "
                        "rewriting them: this run committed nothing; run it again."
                    ) from None
                read_files = now
        raise CdcUserError(f"{what} kept changing while this run committed to it: run it again.")


MAX_REBASES = 5  # commits of others (property changes, checkpoints) a replacing commit goes on past


def _file_paths(table: DeltaTable) -> set[str]:
    return set(file_paths(table))
