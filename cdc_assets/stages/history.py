"""The history stage: each selected table's SCD2 history (`history/<schema>/<table>`) moved forward by its change
log's rows past the history's own seq, in the apply run that updates its current state, under the same lock.

Exactly once as current state is: the commit records the highest `_cdc_seq` it took in (`cdc_history_seq`, as
commit metadata and a Delta app transaction), a run reads only changes above it, and the run's progress moves
only after the history commit. A crash before the commit leaves the history at its last seq; the next run (the
table's progress has not moved, so it is applied again) takes the same changes in once.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.lake.change_rows import DDL_COLUMN, cast_column
from cdc_assets.lake.current_rows import CURRENT_FILE_BYTES
from cdc_assets.lake.delta import (
    HISTORY_SEQ_KEY,
    compact_small_files,
    fenced,
    max_seq,
    plain_type,
    read_query,
    seq_commit,
    seq_landed,
    table_configuration,
)
from cdc_assets.lake.history_rows import (
    IS_CURRENT,
    KEY,
    VALID_FROM_SEQ,
    Versions,
    advance,
    history_schema,
    schema_changes,
    shape_at,
    source_fields,
    start,
    version_rows,
)
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE, HISTORY
from cdc_assets.lake.state import load_progress
from cdc_assets.lake.store import Lakehouse

CHANGES_PER_COMMIT = 200_000  # changes taken into a history at once (as current state's merges): bounds memory


def keep_history(lakehouse: Lakehouse, table: TableRef, log: Any | None = None) -> str:
    """Take the table's changes past its history's seq into its history table; returns what was done."""
    changes_log = lakehouse.open(CHANGES, table)
    latest = load_progress(lakehouse.store, CHANGES_STAGE, str(table)).shape
    if changes_log is None or latest is None:
        return "no change log"
    history = lakehouse.open(HISTORY, table)
    done = max_seq(history, HISTORY_SEQ_KEY)
    log_max = max_seq(changes_log)
    if log_max is None or (done is not None and log_max <= done):
        return "up to date"
    after = "" if done is None else f" AND _cdc_seq > {int(done)}"
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
    state = None
    opened = closed = 0
    column = seqs.column("_cdc_seq")
    for offset in range(0, len(column), CHANGES_PER_COMMIT):  # bounded memory: one commit per part, each exactly once
        window = column.slice(offset, CHANGES_PER_COMMIT)
        low, high = int(window[0].as_py()), int(window[-1].as_py())
        sql = f"SELECT * FROM changes WHERE _cdc_seq >= {low} AND _cdc_seq <= {high}"
        changes = read_query(changes_log, sql, "changes")
        columns = source_fields(changes.schema)
        schema = history_schema(columns)
        if state is None:
            state = start(_open_versions(history, schema) if history is not None else [], shape)
        else:  # the versions the last part left open are in the table now: closing one updates it there
            state = Versions(state.open, state.key, state.keyless)
        state = advance(state, columns, changes)
        rows = version_rows(state.closed + state.opened, schema)
        opened, closed = opened + len(state.opened), closed + len(state.closed)
        if not rows.num_rows:
            continue
        failpoints.hit("history.before_commit")
        _commit(lakehouse, table, history, rows, high)
        history = lakehouse.open(HISTORY, table)
    return f"{opened} versions opened, {closed} closed"


def _open_versions(history: Any, schema: pa.Schema) -> list[dict[str, Any]]:
    """The history's current versions, at the types of `schema` (a column the change log widened, widened)."""
    rows = read_query(history, f"SELECT * FROM history WHERE {IS_CURRENT}", "history")
    return _conformed(rows, schema).to_pylist()


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """History rows with exactly `schema`'s columns and types (a column new to them is NULL)."""
    arrays = [
        cast_column(rows.column(f.name), f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _commit(lakehouse: Lakehouse, table: TableRef, history: Any, rows: pa.Table, new_seq: int) -> None:
    """One Delta commit: versions closed (updated in place) and opened (inserted), recording `new_seq`."""
    where = lakehouse.table_key(HISTORY, table)
    commit = seq_commit(HISTORY_SEQ_KEY, new_seq)
    # a commit whose answer was lost but that landed is not an error (see lake.delta.fenced)
    landed = seq_landed(lakehouse.table_uri(HISTORY, table), lakehouse.storage_options(), HISTORY_SEQ_KEY, new_seq)
    rows = rows.sort_by([(KEY, "ascending"), (VALID_FROM_SEQ, "ascending")])
    if history is None:
        with fenced(where, landed):
            write_deltalake(
                lakehouse.table_uri(HISTORY, table),
                rows,
                mode="append",
                storage_options=lakehouse.storage_options(),
                configuration=table_configuration(rows.schema),
                commit_properties=commit,
            )
        return
    existing = pa.schema(history.schema().to_arrow())
    retyped = any(f.name in existing.names and plain_type(existing.field(f.name).type) != f.type for f in rows.schema)
    if retyped:  # the change log widened a column's type: the history is rewritten at the new types, once
        whole = _conformed(read_query(history, "SELECT * FROM history", "history"), rows.schema)
        ids = pc.binary_join_element_wise(whole.column(KEY), pc.cast(whole.column(VALID_FROM_SEQ), pa.string()), "|")
        replaced = pc.binary_join_element_wise(rows.column(KEY), pc.cast(rows.column(VALID_FROM_SEQ), pa.string()), "|")
        kept = whole.filter(pc.invert(pc.is_in(ids, value_set=replaced)))
        with fenced(where, landed):
            write_deltalake(
                history,
                pa.concat_tables([kept, rows]),
                mode="overwrite",
                schema_mode="overwrite",
                commit_properties=commit,
            )
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
        ).when_matched_update_all().when_not_matched_insert_all().execute()
    compact_small_files(history, CURRENT_FILE_BYTES)
