"""The project's Delta toolkit over delta-rs: opening and querying tables, the seq every CDC commit records,
fencing of concurrent writers, table properties and small-file compaction. Plain functions over DeltaTable."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import ColumnProperties, CommitProperties, DeltaTable, QueryBuilder, WriterProperties
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import Transaction

from cdc_assets.core import failpoints, work_tally
from cdc_assets.core.errors import CdcUserError
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY

MAX_SEQ_KEY = "cdc_max_seq"  # a change log's highest `_cdc_seq` taken in
APPLIED_SEQ_KEY = "cdc_applied_seq"  # the `_cdc_seq` up to which a current-state table has taken changes in
SEED_SEQ_KEY = "cdc_seed_seq"  # the `_cdc_seq` of the snapshot that last seeded a history table (stages.history.run)
HISTORY_SEQ_KEY = "cdc_history_seq"  # the `_cdc_seq` up to which a history table has taken changes in
COMMIT_TOKEN_KEY = "cdc_commit"  # commit metadata: a token naming one CDC commit (see seq_landed)
LANDED_LOOKBACK = 20  # commits looked at for a landed commit: a lost answer is retried at once
_last_commit = threading.local()
COMPACTION_KEY = "cdc_compaction"  # commit metadata of the pipeline's own compactions (they change no row)


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


def table_configuration(schema: pa.Schema) -> dict[str, str]:
    """Delta table properties of change logs and current state: statistics only on columns delta-rs records
    correctly, and frequent checkpoints."""
    names = [f"`{f.name.replace('`', '``')}`" for f in schema if _has_safe_stats(f)]
    return {"delta.dataSkippingStatsColumns": ",".join(names), "delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}


# Parquet statistics (a file's min and max of a column) of text and binary values longer than this are not written:
# finding the min and max copies each value twice (delta-rs took 5 times the memory of a 60 MB value, 3 times
# without them), and a statistic of a long value helps no reader skip a file.
STATS_VALUE_BYTES = 4096
_NO_STATISTICS = ColumnProperties(statistics_enabled="NONE")
_STATISTICS = ColumnProperties(statistics_enabled="PAGE")


def _longest_value(values: pa.ChunkedArray | pa.Array) -> int:
    """The longest text or binary value of a column, or of any such field of a struct column (a before-image)."""
    kind = values.type
    if pa.types.is_struct(kind):
        return max((_longest_value(pc.struct_field(values, i)) for i in range(kind.num_fields)), default=0)
    if not (pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)):
        return 0
    return int(pc.max(pc.binary_length(values)).as_py() or 0) if len(values) else 0


def long_value_columns(rows: pa.Table) -> list[str]:
    """The columns of `rows` holding a text or binary value longer than STATS_VALUE_BYTES (in a struct column: in
    one of its fields): no statistics are written for them."""
    return [name for name, column in zip(rows.column_names, rows.columns, strict=True) if _longest_value(column) > STATS_VALUE_BYTES]


def writer_properties(rows: pa.Table) -> WriterProperties | None:
    """delta-rs's writer settings for `rows`: its own (None) for ordinary rows; when a column holds a value longer
    than STATS_VALUE_BYTES, the same settings (snappy, statistics truncated to 64 characters) but no statistics
    for such columns and for nested ones (delta-rs cannot name a struct's field; the Delta log keeps no statistics
    of struct columns anyway: `table_configuration`)."""
    long = set(long_value_columns(rows))
    if not long:
        return None
    return WriterProperties(
        compression="SNAPPY",
        statistics_truncate_length=64,
        default_column_properties=_NO_STATISTICS,
        column_properties={
            f.name: _STATISTICS for f in rows.schema if f.name not in long and not pa.types.is_nested(f.type)
        },
    )


def file_actions(table: DeltaTable) -> pa.Table:
    """The table's add actions (`path`, `size_bytes`, `num_records`, ...) with their statistics as one struct column
    each (`min`, `max`, `null_count`): several times cheaper than a column per table column and statistic
    (`get_add_actions(flatten=True)`, 1.1 ms against 0.16 ms for a table of 11 columns), which only a reader of
    several columns' bounds needs (stages.current.rows.file_ranges). A run reads them a few times per table it touches."""
    return pa.table(table.get_add_actions(flatten=False))


def file_paths(table: DeltaTable) -> list[str]:
    """The table's data files, relative to its directory (from `file_actions`)."""
    return file_actions(table).column("path").to_pylist()


def max_of(actions: pa.Table, column: str) -> pa.ChunkedArray | None:
    """Each file's highest `column` value in `file_actions`, or None when the files hold no statistics of it."""
    if "max" not in actions.column_names:
        return None
    bounds = actions.schema.field("max").type
    if not pa.types.is_struct(bounds) or bounds.get_field_index(column) < 0:
        return None
    return pc.struct_field(actions.column("max"), column)


def files_past(actions: pa.Table, seq: int | None) -> pa.Table:
    """The rows of `file_actions` whose file may hold a `_cdc_seq` past `seq`: its highest is past it, or the file has
    no statistic of it (all of them when `seq` is None). A file wholly at or before `seq` is never read for it."""
    seqs = max_of(actions, "_cdc_seq")
    if seq is None or seqs is None:
        return actions
    return actions.filter(pc.fill_null(pc.greater(seqs, seq), True))


def small_files(table: DeltaTable, target_bytes: int) -> list[tuple[str, int]]:
    """The table's files under half of `target_bytes` (path, size), once there are SMALL_FILES_BEFORE_COMPACTION of
    them; none before: the one rule of when a table is compacted, for both engines."""
    actions = file_actions(table)
    paths, sizes = actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()
    small = [(p, s) for p, s in zip(paths, sizes, strict=True) if s < target_bytes // 2]
    return small if len(small) >= SMALL_FILES_BEFORE_COMPACTION else []


def compact_small_files(table: DeltaTable, target_bytes: int, failpoint: str | None = None) -> bool:
    """Bin a table's small files (one per append or merge) into files of `target_bytes` once there are
    SMALL_FILES_BEFORE_COMPACTION of them, so reads do not open ever more files; a commit of its own, without
    data change (readers and the `cdc_*` commit metadata are unaffected). Whether it compacted. `failpoint` is
    passed right before the compaction's commit is started."""
    if not small_files(table, target_bytes):
        return False
    if failpoint is not None:
        failpoints.hit(failpoint)
    table.optimize.compact(
        target_size=target_bytes, commit_properties=CommitProperties(custom_metadata={COMPACTION_KEY: "true"})
    )
    return True


def plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(plain_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(plain_type(t.value_type))
    return t


def plain_types(rows: pa.Table) -> pa.Table:
    return rows.cast(pa.schema([f.with_type(plain_type(f.type)) for f in rows.schema]))


def plain_schema(table: DeltaTable) -> pa.Schema:
    """A Delta table's schema now, in plain Arrow types (as `plain_types` gives its rows)."""
    return pa.schema([f.with_type(plain_type(f.type)) for f in pa.schema(table.schema().to_arrow())])


def read_query(table: DeltaTable, sql: str, name: str = "t") -> pa.Table:
    """A SQL query over a Delta table (delta-rs), with view types turned into plain Arrow types."""
    return plain_types(pa.table(QueryBuilder().register(name, table).execute(sql).read_all()))


def read_query_chunks(table: DeltaTable, sql: str, name: str, rows_per_chunk: int) -> Iterator[pa.Table]:
    """`read_query` streamed: about `rows_per_chunk` rows at a time, for results too large to hold at once."""
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in QueryBuilder().register(name, table).execute(sql):
        record = pa.record_batch(batch)
        pending.append(record)
        held += record.num_rows
        if held >= rows_per_chunk:
            yield plain_types(pa.Table.from_batches(pending))
            pending, held = [], 0
    if pending:
        yield plain_types(pa.Table.from_batches(pending))


def files_read_alone(table: DeltaTable) -> bool:
    """Whether each data file holds its rows as the table shows them: no deletion vector hides some, no column is
    read by another name, no value lives in the file's path."""
    protocol = table.protocol()
    features = set(protocol.reader_features or []) | set(protocol.writer_features or [])
    mapped = table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none"
    return "deletionVectors" not in features and not mapped and not table.metadata().partition_columns


def row_count(table: DeltaTable) -> int:
    """Rows of a Delta table, from the log's file statistics (no data read)."""
    actions = file_actions(table)
    return int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0


def open_table(uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    try:
        with work_tally.timed(work_tally.DELTA_OPENS):
            return DeltaTable(uri, storage_options=storage_options)
    except TableNotFoundError:
        return None


def seq_commit(key: str, seq: int, exact: bool = False, also: dict[str, int] | None = None) -> CommitProperties:
    """Commit properties that record `seq` under `key` in a way no later commit can hide: as commit metadata
    (for people reading the history) and as a Delta app transaction (`txn` action), which the table's state
    keeps whatever commits follow (OPTIMIZE, property changes, checkpoints, log clean-up). The app transaction
    also fences writers: a commit carrying it fails ("Concurrent transaction") when another commit with the
    same app id landed after the version this writer read, so a writer whose lock expired mid-write cannot
    add what the run that took over has added. `exact`: the commit takes the version after the one read, or
    fails (no rebase onto commits made since: see lake.files.commit_files). `also`: more app transactions the
    commit records (e.g. the seq a history was seeded at)."""
    _last_commit.token = uuid.uuid4().hex  # names this commit, so a retry that meets it knows it (`seq_landed`)
    return CommitProperties(
        custom_metadata={key: str(seq), COMMIT_TOKEN_KEY: _last_commit.token}
        | {k: str(v) for k, v in (also or {}).items()},
        app_transactions=[Transaction(key, int(seq))] + [Transaction(k, int(v)) for k, v in (also or {}).items()],
        max_commit_retries=0 if exact else None,
    )


def seq_landed(uri: str, storage_options: dict[str, str] | None, key: str, seq: int) -> Callable[[], bool]:
    """Whether the commit this thread last made with `seq_commit(key, seq)` is in the table at `uri` after all:
    the table records `seq` under the app transaction `key` and one of its newest commits carries that commit's
    token (another writer's commit of the same seq is not this one: the fence stays)."""

    def landed() -> bool:
        token = getattr(_last_commit, "token", None)
        table = open_table(uri, storage_options)
        if token is None or table is None or table.transaction_version(key) != seq:
            return False
        return any(commit.get(COMMIT_TOKEN_KEY) == token for commit in table.history(LANDED_LOOKBACK))

    return landed


COMMIT_KINDS = {  # a fenced commit's kind of work, by the layer its table key begins with (lake.layout)
    CHANGES: work_tally.CHANGE_LOG_COMMITS,
    CURRENT: work_tally.CURRENT_STATE_COMMITS,
    HISTORY: work_tally.HISTORY_COMMITS,
}


@contextmanager
def fenced(what: str, landed: Callable[[], bool] | None = None) -> Iterator[None]:
    """A commit refused because another writer committed the same app transaction since this writer read the
    table (see `seq_commit`), or removed a file this commit removes, ends the run with one sentence: nothing
    was written twice.

    `landed` (see `seq_landed`) tells the one refusal that is a success: the object store applied this very commit
    but its answer was lost, and the client's retry of the conditional PUT met the commit it had made itself. The
    table then records this commit's seq, and the block ends normally.

    Each block is one commit of `what`'s layer in the process's work tally (`core.work_tally`)."""
    try:
        with work_tally.timed(COMMIT_KINDS.get(what.split("/", 1)[0], work_tally.OTHER_COMMITS)):
            yield
    except CommitFailedError as exc:
        if "concurrent transaction" in str(exc).lower() and landed is not None and landed():
            return
        if "Concurrent transaction" in str(exc):
            raise CdcUserError(
                f"Another run committed to {what} while this run was writing it (this run's lock had expired and "
                "was taken over): this run stopped without writing anything twice; run it again once the other has "
                "finished."
            ) from exc
        if "concurrent transaction" in str(exc).lower():  # a MERGE whose files another commit replaced or added to
            raise CdcUserError(
                f"Another writer (an OPTIMIZE or another run) changed files of {what} while this run was rewriting "
                "them: this run committed nothing; run it again."
            ) from exc
        raise


def max_seq(table: DeltaTable | None, metadata_key: str = MAX_SEQ_KEY) -> int | None:
    """The highest `_cdc_seq` a table has taken in, as its newest CDC commit recorded it (`seq_commit`).

    Tables written before app transactions carry it only in commit metadata, found by walking the history.
    A change log may fall back to its rows' statistics (every change it took in is a row of it); a current
    state may not: its newest change can be a delete, whose seq no row holds.
    """
    if table is None:
        return None
    version = table.transaction_version(metadata_key)
    if version is not None:
        return int(version)
    for commit in table.history():
        if metadata_key in commit:
            return int(commit[metadata_key])
    if metadata_key != MAX_SEQ_KEY:
        return None
    actions = file_actions(table)
    seqs = max_of(actions, "_cdc_seq")
    if seqs is not None and actions.num_rows:
        value = pc.max(seqs).as_py()
        return None if value is None else int(value)
    return None
