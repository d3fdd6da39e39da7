"""The change-log stage on Spark, with no row passing through the run process.

Spark tasks read the raw batches' data files from the lakehouse themselves (pyarrow's filesystems: a local
directory or S3, no Hadoop jars), key the changes in one job over every table, type them per table and write
each table's new change-log files; the run process gets back only the files' add actions and commits them,
one Delta commit per table (cdc_assets/stages/changes/run.py).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import DELETE, INSERT, UPDATE
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.files import FILE_ACTION_SCHEMA, FILE_ROWS, FileAccess, write_files
from cdc_assets.lake.layout import CHANGES, RAW
from cdc_assets.lake.raw_batches import RAW_ROWS_SCHEMA
from cdc_assets.stages.changes.keys import keyed_changes
from cdc_assets.stages.changes.rows import conform_to_log, rows_for_tables, typed_changes, with_batch
from spark_resources.transforms import MAX_TASKS, item_tasks, sees_its_cores, spark_schema, task_count

# Keying over the generic form of a change (table, `_cdc_seq`, operation, row images as canonical texts, keys as JSON
# texts), so one job covers every table whatever its columns: the read tasks key each slice with the function the
# Arrow engine calls (stages.changes.keys.keyed_changes), so a key has one text whichever engine wrote the log.

RAW_WITH_BATCH = pa.schema(list(RAW_ROWS_SCHEMA) + [pa.field("batch", pa.string(), nullable=False)])
KEYED_RAW = RAW_WITH_BATCH.append(pa.field("key", pa.string())).append(pa.field("before_key", pa.string()))
WRITTEN_SCHEMA = pa.schema(
    list(FILE_ACTION_SCHEMA)
    + [
        pa.field("max_seq", pa.int64(), nullable=False),
        pa.field("inserts", pa.int64(), nullable=False),
        pa.field("updates", pa.int64(), nullable=False),
        pa.field("deletes", pa.int64(), nullable=False),
    ]
)
READ_SLICE_ROWS = 100_000


@dataclass(frozen=True)
class ChangeLogTargets:
    """What the tasks need to write each table's change-log files: its directory, the `_cdc_seq` it has
    already taken in, and the schema its files take (the log's, unified with this run's versions)."""

    access: FileAccess
    watermarks: dict[str, int | None]  # table text -> the change log's highest `_cdc_seq`
    schemas: dict[str, pa.Schema]  # table text -> the schema the new files take
    versions: dict[tuple[str, int], TableShape]
    ddl: dict[tuple[str, int], str]


def _read_raw(
    access: FileAccess, starts: dict[str, str | None], table_keys: pa.Table, statements: pa.Table | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task's reader of raw batches: each batch's data file, checked against its manifest's SHA-256 and
    read a row group at a time, with the rows of the wanted tables after each one's start, keyed; an item that is
    slice i of n of its batch takes only the tables `table_slice` puts in slice i. The task given the STATEMENTS
    item yields the statements' rows (keyed in the run process)."""

    def read(tasks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs = access.filesystem()
        for task in tasks:
            names, files, digests, slices, of = (
                task.column(c).to_pylist() for c in ("batch", "data_file", "sha256", "slice", "slices")
            )
            for batch, data_file, digest, piece, pieces in zip(names, files, digests, slices, of, strict=True):
                if batch == STATEMENTS:
                    yield from statements.to_batches() if statements is not None else ()
                    continue
                wanted = {t: start for t, start in starts.items() if table_slice(t, pieces) == piece}
                if not wanted:  # a slice none of the run's tables falls in
                    continue
                path = access.path(f"{RAW}/{batch}/{data_file}")
                check = hashlib.sha256()
                with fs.open_input_stream(path) as source:
                    while block := source.read(1 << 20):
                        check.update(block)
                if check.hexdigest() != digest:
                    raise CdcUserError(
                        f"Raw batch {batch} is corrupt (its data does not match the manifest's SHA-256): "
                        f"restore raw/{batch}/ from a backup."
                    )
                with fs.open_input_file(path) as source:
                    parquet = pq.ParquetFile(source)
                    for part in parquet.iter_batches(batch_size=READ_SLICE_ROWS):
                        rows = rows_for_tables(with_batch(pa.Table.from_batches([part]), batch), wanted)
                        yield from keyed_changes(rows.cast(RAW_WITH_BATCH), table_keys).to_batches()

    return read


_TASKS = pa.schema(
    [
        ("batch", pa.string()),
        ("data_file", pa.string()),
        ("sha256", pa.string()),
        ("slice", pa.int32()),
        ("slices", pa.int32()),
    ]
)
STATEMENTS = ""  # the read tasks' item that stands for the statements' rows, not for a raw batch
DIRECT_MAX_BATCHES = 4  # a run of at most this many raw batches writes the change logs from its read tasks


def table_slice(table: str, slices: int) -> int:
    """Which of `slices` slices of a batch a table's rows are read in (the same in every process: CRC-32)."""
    return zlib.crc32(table.encode()) % slices if slices > 1 else 0


def _read_items(batches: list[tuple[str, str, str]], slices: int, statements: pa.Table | None) -> pa.Table:
    """The read tasks' items: each batch (name, data file, data SHA-256) as `slices` slices of its tables, and
    STATEMENTS when there are any."""
    items = [(*batch, piece, slices) for batch in batches for piece in range(slices)]
    if statements is not None and statements.num_rows:
        items.append((STATEMENTS, "", "", 0, 1))
    return pa.table({n: [item[i] for item in items] for i, n in enumerate(_TASKS.names)}, schema=_TASKS)


def _write_logs(targets: ChangeLogTargets) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task's writer: its share of the keyed changes typed per table, past each log's watermark, written as
    files of FILE_ROWS rows at most; one add action (and counts) per file."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        held: dict[str, list[pa.Table]] = {}
        counts: dict[str, int] = {}

        def flush(table: str) -> Iterator[pa.RecordBatch]:
            parts, held[table], counts[table] = held[table], [], 0
            if not parts:
                return
            rows = pa.concat_tables(parts).sort_by("_cdc_seq")
            ops = rows.column("_cdc_op")
            for action in write_files(targets.access, f"{CHANGES}/{TableRef.parse(table).path}", table, [rows]):
                action.update(
                    max_seq=int(pc.max(rows.column("_cdc_seq")).as_py()),
                    inserts=int(pc.sum(pc.equal(ops, INSERT)).as_py() or 0),
                    updates=int(pc.sum(pc.equal(ops, UPDATE)).as_py() or 0),
                    deletes=int(pc.sum(pc.equal(ops, DELETE)).as_py() or 0),
                )
                yield pa.RecordBatch.from_pylist([action], schema=WRITTEN_SCHEMA)

        for batch in batches:
            rows = pa.Table.from_batches([batch])
            names = pc.binary_join_element_wise(rows.column("schema"), rows.column("table"), "\x00")
            for joined in pc.unique(names).to_pylist():
                schema_name, table_name = joined.split("\x00")
                table = str(TableRef(schema_name, table_name))
                typed = typed_changes(rows.filter(pc.equal(names, joined)), targets.versions, targets.ddl)
                watermark = targets.watermarks.get(table)
                if watermark is not None:
                    typed = typed.filter(pc.greater(typed.column("_cdc_seq"), watermark))
                if not typed.num_rows:
                    continue
                held.setdefault(table, []).append(conform_to_log(typed, targets.schemas[table]))
                counts[table] = counts.get(table, 0) + typed.num_rows
                if counts[table] >= FILE_ROWS:
                    yield from flush(table)
        for table in list(held):
            yield from flush(table)

    return write


def write_change_logs(
    spark: SparkSession,
    batches: list[tuple[str, str, str]],
    starts: dict[str, str | None],
    statement_rows: pa.Table | None,
    table_keys: pa.Table,
    targets: ChangeLogTargets,
) -> list[dict]:
    """Read and key the raw rows of `batches` (name, data file, data SHA-256) for the tables in `starts`, with the
    statements' rows (keyed here: one per DDL or TRUNCATE), then type and write each table's new change-log files,
    all on the executors; returns the files' add actions with their counts (the only rows the run process sees).

    A run of a few batches (DIRECT_MAX_BATCHES: an incremental sync's, a continuous cycle's) is one job whose read
    tasks write what they read: each batch is read by as many tasks as fill the executors' share of the job, each
    taking a slice of its tables (`table_slice`), so a table's rows of one batch land in one file. A larger run's
    read tasks hand their rows on through a shuffle by table, so each table gets its files from one task however
    many batches hold its rows; the shuffle is a job of its own and moves every row through the JVMs twice, the
    price of not multiplying small files."""
    statements = None
    if statement_rows is not None and statement_rows.num_rows:
        statements = keyed_changes(statement_rows.cast(RAW_WITH_BATCH), table_keys).cast(KEYED_RAW)
    read = _read_raw(targets.access, starts, table_keys, statements)
    write = _write_logs(targets)
    if len(batches) <= DIRECT_MAX_BATCHES:
        # a Connect session reads each batch in one task (item_tasks gives it as many as the server's cores)
        slices = min(len(starts), task_count(spark, MAX_TASKS) // max(1, len(batches))) if sees_its_cores(spark) else 1
        written = item_tasks(spark, _read_items(batches, max(1, slices), statements), lambda t: write(read(t)), WRITTEN_SCHEMA)
    else:
        keyed = item_tasks(spark, _read_items(batches, 1, statements), read, KEYED_RAW)
        parallelism = task_count(spark, len(targets.schemas))  # a few tasks per core, each writing many tables
        written = keyed.repartition(parallelism, "schema", "table").mapInArrow(write, spark_schema(WRITTEN_SCHEMA))
    return [row.asDict() for row in written.collect()]

