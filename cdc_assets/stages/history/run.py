"""The history stage: each selected table's SCD2 history (`history/<schema>/<table>`) moved forward by its change
log's rows past the history's own seq, in the apply run that updates its current state, under the same lock.

Exactly once as current state is: the commit records the highest `_cdc_seq` it took in (`cdc_history_seq`, as
commit metadata and a Delta app transaction), a run reads only changes above it, and the run's progress moves
only after the history commit. A crash before the commit leaves the history at its last seq; the next run (the
table's progress has not moved, so it is applied again) takes the same changes in once.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc_assets.core import failpoints
from cdc_assets.core.mysql_types import arrow_schema
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import (
    HISTORY_SEQ_KEY,
    SEED_SEQ_KEY,
    compact_small_files,
    fenced,
    max_seq,
    plain_type,
    read_query,
    seq_commit,
    seq_landed,
    table_configuration,
)
from cdc_assets.lake.files import read_table_chunks
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE, CURRENT, HISTORY
from cdc_assets.lake.state import EarlierLakehouse, load_earlier, load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.rows import COMMIT_TS_TYPE, DDL_COLUMN, SEQ_TYPE, conform_to_log
from cdc_assets.stages.current.rows import CURRENT_FILE_BYTES
from cdc_assets.stages.history.rows import (
    DELETED,
    IS_CURRENT,
    KEY,
    VALID_FROM,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_SEQ,
    Versions,
    advance,
    at_types,
    history_columns,
    history_schema,
    schema_changes,
    shape_at,
    source_fields,
    start,
    version_rows,
)

CHANGES_PER_COMMIT = 200_000  # changes taken into a history at once (as current state's merges): bounds memory


def keep_history(lakehouse: Lakehouse, table: TableRef, log: Any | None = None, through: int | None = None) -> str:
    """Take the table's changes past its history's seq (up to `through`, when given) into its history table;
    returns what was done."""
    changes_log = lakehouse.open(CHANGES, table)
    latest = load_progress(lakehouse.store, CHANGES_STAGE, str(table)).shape
    if changes_log is None or latest is None:
        return "no change log"
    history = lakehouse.open(HISTORY, table)
    done = max_seq(history, HISTORY_SEQ_KEY)
    log_max = max_seq(changes_log)
    if log_max is None or (done is not None and min(log_max, through if through is not None else log_max) <= done):
        return "up to date"
    after = ("" if done is None else f" AND _cdc_seq > {int(done)}") + (
        "" if through is None else f" AND _cdc_seq <= {int(through)}"
    )
    seqs = read_query(changes_log, f"SELECT _cdc_seq FROM changes WHERE true{after} ORDER BY _cdc_seq", "changes")
    if not seqs.num_rows:
        return "up to date"
    names = pa.schema(changes_log.schema().to_arrow()).names
    ddl = f"SELECT * FROM changes WHERE {DDL_COLUMN} IS NOT NULL{after}" if DDL_COLUMN in names else None
    events = schema_changes(read_query(changes_log, ddl, "changes")) if ddl else []
    shape = shape_at(events, None, latest)
    if not shape.primary_key and not any(c.after is not None and c.after.primary_key for _, c in events):
        if log is not None:
            log.warning(
                f"{table} has no primary key: its history is not kept (CDC_HISTORY_TABLES covers keyed tables)."
            )
        return "not kept: no primary key"
    earlier = load_earlier(lakehouse.store)
    if through is None and log is not None:
        gap = _gap(table, history, earlier)
        if gap is not None:
            log.warning(f"{gap}; run `cdc-lakehouse snapshot {table}` so that it takes in the table's rows as they are")
    state = None
    opened = closed = 0
    column = seqs.column("_cdc_seq")
    for offset in range(0, len(column), CHANGES_PER_COMMIT):  # bounded memory: one commit per part, each exactly once
        window = column.slice(offset, CHANGES_PER_COMMIT)
        low, high = int(window[0].as_py()), int(window[-1].as_py())
        sql = f"SELECT * FROM changes WHERE _cdc_seq >= {low} AND _cdc_seq <= {high}"
        changes = read_query(changes_log, sql, "changes")
        columns = history_columns(changes.schema, pa.schema(history.schema().to_arrow()) if history else None)
        changes = at_types(changes, columns)
        schema = history_schema(columns)
        if state is None:
            seed = history.transaction_version(SEED_SEQ_KEY) if history is not None else None
            if earlier is not None and earlier.holds(seed):
                seed = None  # an earlier lakehouse's seed: its versions are not this one's to fix
            state = start(_open_versions(history, schema) if history is not None else [], shape, seed)
        else:  # the versions the last part left open are in the table now: closing one updates it there
            state = Versions(state.open, state.key, state.keyless, state.seed)
        state = advance(state, columns, changes)
        rows = version_rows(state.closed + state.opened, schema)
        opened, closed = opened + len(state.opened), closed + len(state.closed)
        if not rows.num_rows:
            continue
        failpoints.hit("history.before_commit")
        _commit(lakehouse, table, history, rows, high)
        history = lakehouse.open(HISTORY, table)
    return f"{opened} versions opened, {closed} closed"


def _gap(table: TableRef, history: Any, earlier: EarlierLakehouse | None) -> str | None:
    """What the table's history cannot know, when its newest change is an earlier lakehouse's (this one was begun
    again after that one's checkpoint was purged: lake/state.EarlierLakehouse), as the start of a sentence; else
    None."""
    done = max_seq(history, HISTORY_SEQ_KEY)
    if earlier is None or not earlier.holds(done):
        return None
    sql = f"SELECT max({VALID_FROM}) AS opened, max({VALID_TO}) AS closed FROM history"
    times = [t for t in read_query(history, sql, "history").to_pylist()[0].values() if t is not None]
    when = f", committed {max(times):%Y-%m-%d %H:%M:%S} UTC" if times else ""
    return (
        f"{table}: its history cannot know the changes between its last one (seq {done}{when}) and {earlier.start}, "
        "where capture began again (that binlog was purged before capture read it), so a version open then ends at "
        "the first change or snapshot after the gap that finds its row changed or gone, not when it really ended, "
        "and a row that came and went inside the gap has no version"
    )


def history_gap(lakehouse: Lakehouse, table: TableRef, seq: int) -> str | None:
    """The sentence a snapshot at `seq` that seeds the table's history says when the history's newest change is an
    earlier lakehouse's (see `_gap`), else None. Read before the seed, which moves the history past the gap."""
    if table not in lakehouse.history:
        return None
    gap = _gap(table, lakehouse.open(HISTORY, table), load_earlier(lakehouse.store))
    return None if gap is None else f"{gap}; this snapshot (seq {seq}) opens the versions of the rows it found."


def _open_versions(history: Any, schema: pa.Schema) -> list[dict[str, Any]]:
    """The history's current versions, at the types of `schema` (a column the change log widened, widened)."""
    rows = read_query(history, f"SELECT * FROM history WHERE {IS_CURRENT}", "history")
    return _conformed(rows, schema).to_pylist()


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """History rows with exactly `schema`'s columns and types (a column new to them is NULL; one renamed in case
    alone is found under its old name)."""
    return conform_to_log(rows, schema)


def _commit(
    lakehouse: Lakehouse,
    table: TableRef,
    history: Any,
    rows: pa.Table,
    new_seq: int,
    key: str = HISTORY_SEQ_KEY,
    also: dict[str, int] | None = None,
    append: bool = False,
) -> None:
    """One Delta commit: versions closed (updated in place), opened (inserted) and dropped (`is_dropped`:
    deleted), recording `new_seq` under `key` (and the app transactions `also`)."""
    where = lakehouse.table_key(HISTORY, table)
    commit = seq_commit(key, new_seq, also=also)
    # a commit whose answer was lost but that landed is not an error (see lake.delta.fenced)
    landed = seq_landed(lakehouse.table_uri(HISTORY, table), lakehouse.storage_options(), key, new_seq)
    rows = rows.sort_by([(KEY, "ascending"), (VALID_FROM_SEQ, "ascending")])
    dropped = pc.fill_null(pc.equal(rows.column(VALID_TO_SEQ), rows.column(VALID_FROM_SEQ)), False)
    if history is None:
        with fenced(where, landed):
            write_deltalake(
                lakehouse.table_uri(HISTORY, table),
                rows.filter(pc.invert(dropped)),
                mode="append",
                storage_options=lakehouse.storage_options(),
                configuration=table_configuration(rows.schema),
                commit_properties=commit,
            )
        return
    existing = pa.schema(history.schema().to_arrow())
    retyped = any(f.name in existing.names and plain_type(existing.field(f.name).type) != f.type for f in rows.schema)
    lowered = {n.lower() for n in existing.names}
    renamed = any(f.name not in existing.names and f.name.lower() in lowered for f in rows.schema)
    if retyped or renamed:  # a column's type widened, or renamed in case alone: the history is rewritten, once
        whole = _conformed(read_query(history, "SELECT * FROM history", "history"), rows.schema)
        ids = pc.binary_join_element_wise(whole.column(KEY), pc.cast(whole.column(VALID_FROM_SEQ), pa.string()), "|")
        replaced = pc.binary_join_element_wise(rows.column(KEY), pc.cast(rows.column(VALID_FROM_SEQ), pa.string()), "|")
        kept = whole.filter(pc.invert(pc.is_in(ids, value_set=replaced)))
        with fenced(where, landed):
            write_deltalake(
                history,
                pa.concat_tables([kept, rows.filter(pc.invert(dropped))]),
                mode="overwrite",
                schema_mode="overwrite",
                commit_properties=commit,
            )
        return
    if append:  # only versions new to the table
        with fenced(where, landed):
            write_deltalake(history, rows, mode="append", schema_mode="merge", commit_properties=commit)
        return
    with fenced(where, landed):
        history.merge(
            rows,
            predicate=f"t.{KEY} = s.{KEY} AND t.{VALID_FROM_SEQ} = s.{VALID_FROM_SEQ}",
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            streamed_exec=False,
            commit_properties=commit,
        ).when_matched_delete(
            f"s.{VALID_TO_SEQ} = s.{VALID_FROM_SEQ}"
        ).when_matched_update_all().when_not_matched_insert_all(
            f"s.{VALID_TO_SEQ} IS NULL OR s.{VALID_TO_SEQ} <> s.{VALID_FROM_SEQ}"
        ).execute()
    compact_small_files(history, CURRENT_FILE_BYTES)


SEED_ROWS_PER_COMMIT = 200_000  # loaded rows compared with the open versions, and committed, at once
SEED_PART_KEY = "cdc_history_seed_part"  # app transaction of a seed's commits before its last one


def seed_history(
    lakehouse: Lakehouse, shape: TableShape, seq: int, taken_at: dt.datetime, log: Any | None = None
) -> str:
    """A snapshot's rows, just loaded into the table's current state at `seq` (taken at `taken_at`), as its
    history's versions at that seq: a version opens for each row new or changed, the open version of a changed
    row closes, and the open version of a key the snapshot no longer has closes as deleted. The change log's
    versions up to `seq` are taken in first (`keep_history(through=seq)`), so a history turned on before keeps
    its past. The rows are read back from current state SEED_ROWS_PER_COMMIT at a time, each part a commit; the
    last one records `seq` as the history's seq (HISTORY_SEQ_KEY) and as its seed (SEED_SEQ_KEY), so a seed
    stopped part-way is done again from what it committed (each row's version is then found unchanged), and a
    seed done is not done twice. Returns what was done."""
    table = shape.table
    if table not in lakehouse.history:
        return "not kept"
    if not shape.primary_key:
        if log is not None:
            log.warning(
                f"{table} has no primary key: its history is not kept (CDC_HISTORY_TABLES covers keyed tables)."
            )
        return "not kept: no primary key"
    keep_history(lakehouse, table, log, through=seq)
    history = lakehouse.open(HISTORY, table)
    done = max_seq(history, HISTORY_SEQ_KEY)
    if history is not None and done == seq and history.transaction_version(SEED_SEQ_KEY) == seq:
        return "seeded already"
    if done is not None and done > seq:
        if log is not None:
            log.warning(
                f"{table}: its history already holds changes after the snapshot's seq {seq} (a sync ran while the "
                f"snapshot read it): the history is not seeded from the snapshot, it goes on from its change log."
            )
        return "not seeded: the history is past the snapshot"
    current = lakehouse.open(CURRENT, table)
    if current is None:
        return "no current state"
    schema = history_schema(_seed_columns(lakehouse, table, shape, history))
    sources = [f.name for f in schema if not f.name.startswith("_cdc_")]
    source_schema = pa.schema([schema.field(name) for name in sources])
    empty = schema.empty_table()
    opened = (
        _conformed(read_query(history, f"SELECT * FROM history WHERE {IS_CURRENT}", "history"), schema)
        if history is not None
        else empty
    )
    open_keys = opened.column(KEY).combine_chunks()
    seen: list[pa.Array] = []
    held: list[pa.Table] = []  # versions not committed yet: a commit once SEED_ROWS_PER_COMMIT are held
    collide = False  # whether one of them replaces a version in the table (else they are appended)
    new = changed = 0
    for part in _parts(lakehouse, table, current):
        rows = _conformed(part, source_schema)
        keys = _key_texts(rows, shape.primary_key)
        seen.append(keys)
        at = pc.index_in(keys, value_set=open_keys)
        matched = pc.is_valid(at)
        before = opened.take(at)  # NULL rows where no version is open
        same = matched
        for name in sources:
            same = pc.and_(same, _same(rows.column(name), before.column(name)))
        differs = pc.invert(same)
        fresh = _with_validity(rows.filter(differs).append_column(KEY, keys.filter(differs)), seq, taken_at)
        ends = before.filter(pc.and_(matched, pc.invert(same)))
        collide = collide or ends.num_rows > 0
        ends = ends.filter(pc.not_equal(ends.column(VALID_FROM_SEQ), seq))  # one opened at this seq is replaced
        new, changed = new + fresh.num_rows, changed + ends.num_rows
        held += [_shaped(_closed(ends, seq, taken_at, False), schema), _shaped(fresh, schema)]
        if sum(t.num_rows for t in held) >= SEED_ROWS_PER_COMMIT:
            _commit_seed(lakehouse, table, pa.concat_tables(held), seq, last=False, append=not collide)
            held, collide = [], False
    everywhere = pa.concat_arrays(seen) if seen else pa.array([], pa.string())
    gone = opened.filter(pc.invert(pc.is_in(open_keys, value_set=everywhere)))
    final = pa.concat_tables([empty, *held, _shaped(_closed(gone, seq, taken_at, True), schema)])
    _commit_seed(lakehouse, table, final, seq, last=True, append=not collide and not gone.num_rows)
    return f"seeded at seq {seq}: {new} versions opened, {changed} changed and {gone.num_rows} deleted closed"


def _parts(lakehouse: Lakehouse, table: TableRef, current: Any) -> Iterator[pa.Table]:
    """The current state's rows, SEED_ROWS_PER_COMMIT at a time (file by file: `read_table_chunks`)."""
    access, key = lakehouse.file_access(), lakehouse.table_key(CURRENT, table)
    for chunk in read_table_chunks(access, key, current, SEED_ROWS_PER_COMMIT):
        for offset in range(0, chunk.num_rows, SEED_ROWS_PER_COMMIT):
            yield chunk.slice(offset, SEED_ROWS_PER_COMMIT)


def _commit_seed(lakehouse: Lakehouse, table: TableRef, rows: pa.Table, seq: int, last: bool, append: bool) -> None:
    """A seed's commit: the last records `seq` as the history's seq and seed; `append` when no row replaces or
    closes a version in the table (a first seed's new versions: no MERGE, which would read the table)."""
    failpoints.hit("history.before_seed_commit")
    history = lakehouse.open(HISTORY, table)
    if last:
        _commit(lakehouse, table, history, rows, seq, also={SEED_SEQ_KEY: seq}, append=append)
    else:
        _commit(lakehouse, table, history, rows, seq, key=SEED_PART_KEY, append=append)


def _seed_columns(lakehouse: Lakehouse, table: TableRef, shape: TableShape, history: Any) -> list[pa.Field]:
    """The seeded history's source columns: the change log's and the history's (every column the table had, at a
    type holding both: history_columns), then the snapshot's columns neither knows."""
    changes_log = lakehouse.open(CHANGES, table)
    known = [pa.schema(t.schema().to_arrow()) for t in (changes_log, history) if t is not None]
    columns = history_columns(*known) if len(known) == 2 else source_fields(known[0]) if known else []
    names = {f.name for f in columns}
    columns += [f.with_nullable(True) for f in arrow_schema(list(shape.columns)) if f.name not in names]
    return [pa.field(f.name, plain_type(f.type)) for f in columns]


def _key_texts(rows: pa.Table, key: tuple[str, ...]) -> pa.Array:
    """`_cdc_key` of each row, exactly as history_rows.key_text writes it."""
    if len(key) == 1 and pa.types.is_integer(rows.schema.field(key[0]).type):  # the common case, in Arrow
        return pc.binary_join_element_wise("[", pc.cast(rows.column(key[0]), pa.string()), "]", "").combine_chunks()
    values = zip(*(rows.column(k).to_pylist() for k in key), strict=True)
    return pa.array([json.dumps(list(v), default=str, ensure_ascii=False) for v in values], pa.string())


def _same(a: pa.ChunkedArray | pa.Array, b: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Row by row: equal values, NULL equal to NULL."""
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    try:
        equal = pc.equal(a, b)
    except pa.ArrowNotImplementedError:  # a type with no kernel: compared as Python values
        equal = pa.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    return pc.or_(both_null, pc.fill_null(equal, False))


def _with_validity(rows: pa.Table, seq: int, taken_at: dt.datetime) -> pa.Table:
    """Loaded rows as versions open from the snapshot."""
    n = rows.num_rows
    for name, values in (
        (VALID_FROM, pa.array([taken_at] * n, COMMIT_TS_TYPE)),
        (VALID_TO, pa.nulls(n, COMMIT_TS_TYPE)),
        (VALID_FROM_SEQ, pa.array([seq] * n, SEQ_TYPE)),
        (VALID_TO_SEQ, pa.nulls(n, SEQ_TYPE)),
        (IS_CURRENT, pa.array([True] * n)),
        (DELETED, pa.array([False] * n)),
    ):
        rows = rows.drop_columns([name]) if name in rows.column_names else rows
        rows = rows.append_column(name, values)
    return rows


def _shaped(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    return rows.select(schema.names).cast(schema)


def _closed(versions: pa.Table, seq: int, taken_at: dt.datetime, deleted: bool) -> pa.Table:
    """Open versions closed by the snapshot at `seq` (one opened at `seq` itself is thereby dropped)."""
    n = versions.num_rows
    updates = {
        VALID_TO: pa.array([taken_at] * n, versions.schema.field(VALID_TO).type),
        VALID_TO_SEQ: pa.array([seq] * n, versions.schema.field(VALID_TO_SEQ).type),
        IS_CURRENT: pa.array([False] * n),
        DELETED: pa.array([deleted] * n),
    }
    for name, values in updates.items():
        versions = versions.set_column(versions.schema.get_field_index(name), name, values)
    return versions
