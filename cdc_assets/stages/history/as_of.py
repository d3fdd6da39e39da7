"""Reads of a table as it was at a point: a commit time or a `_cdc_seq` (`table_as_of`).

From the table's history table when CDC_HISTORY_TABLES keeps one up to that point (one query over the versions
valid then, with the changes it has not taken in yet moved through on top), else by replaying its change log up
to the point through the very function that builds history versions (stages.history.rows), so both ways give the
same rows. A snapshot seeds the history with the rows it loaded, so the history also holds rows that never
passed through the change log (a table loaded by a snapshot may have no change log at all); a replay of the
change log alone misses them.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import arrow_type
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import HISTORY_SEQ_KEY, SEED_SEQ_KEY, max_seq, read_query
from cdc_assets.lake.layout import CHANGES, CHANGES_STAGE, HISTORY
from cdc_assets.lake.state import load_earlier, load_progress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.rows import cast_column
from cdc_assets.stages.history.rows import (
    VALID_FROM,
    VALID_FROM_SEQ,
    VALID_TO,
    VALID_TO_SEQ,
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


def table_as_of(
    lakehouse: Lakehouse,
    table: TableRef | str,
    *,
    at_time: dt.datetime | None = None,
    at_seq: int | None = None,
    from_history: bool | None = None,
) -> pa.Table:
    """The table's rows as they were right after `at_seq`, or after the last change committed at or before
    `at_time` (naive times are UTC): the columns of the table's shape then, in source order, plus `_cdc_seq` and
    `_cdc_commit_ts` of the change that wrote each row, sorted by key. `from_history`: None takes the history
    table when it reaches the point, True requires it, False replays the change log."""
    ref = table if isinstance(table, TableRef) else TableRef.parse(table)
    if (at_time is None) == (at_seq is None):
        raise ValueError("give exactly one of at_time and at_seq")
    log = lakehouse.open(CHANGES, ref)
    history = lakehouse.open(HISTORY, ref)
    latest = load_progress(lakehouse.store, CHANGES_STAGE, str(ref)).shape
    kept = max_seq(history, HISTORY_SEQ_KEY)  # the seq the history has taken changes in up to
    if history is None or kept is None:
        history = None
    if (log is None and history is None) or latest is None:
        raise CdcUserError(
            f"{ref} is not in the lakehouse at {lakehouse} (no change log): check the name (schema.table) and "
            "that `cdc-lakehouse sync` has captured it."
        )
    first, first_ts = _first(log, history)
    point = at_seq if at_seq is not None else _seq_at(log, history, _utc(at_time))
    if point is None or first is None or point < first:
        asked = f"seq {at_seq}" if at_seq is not None else f"{_utc(at_time).isoformat()}"
        raise CdcUserError(
            f"{asked} is before the first change of {ref} in the lakehouse (seq {first}, committed {first_ts}): "
            "ask for a later point."
        )
    events = (
        schema_changes(read_query(log, "SELECT * FROM changes WHERE _cdc_ddl IS NOT NULL", "changes"))
        if log is not None and _has_ddl(log)
        else []
    )
    shape = shape_at(events, point, latest)
    reaches = history is not None and kept is not None and kept >= point
    if from_history and not reaches:
        raise CdcUserError(f"{ref} has no history table reaching seq {point}: add it to CDC_HISTORY_TABLES and sync.")
    if history is not None and kept is not None and from_history is not False:
        base = min(int(point), int(kept))
        where = f"{VALID_FROM_SEQ} <= {base} AND ({VALID_TO_SEQ} IS NULL OR {VALID_TO_SEQ} > {base})"
        versions = read_query(history, f"SELECT * FROM history WHERE {where}", "history")
        if point > kept and log is not None:  # the changes the history has not taken in yet, on top
            changes = read_query(
                log, f"SELECT * FROM changes WHERE _cdc_seq > {base} AND _cdc_seq <= {int(point)}", "changes"
            )
            columns = history_columns(changes.schema, versions.schema)  # the history is never narrowed
            changes = at_types(changes, columns)
            schema = history_schema(columns)
            seed = history.transaction_version(SEED_SEQ_KEY)
            earlier = load_earlier(lakehouse.store)
            state = start(
                _conformed(versions, schema).to_pylist(),
                shape_at(events, base, latest),
                None if earlier is not None and earlier.holds(seed) else seed,  # an earlier lakehouse's: not to fix
            )
            versions = version_rows(advance(state, columns, changes).current(), schema)
    else:
        if log is None:
            raise CdcUserError(f"{ref} has no change log to replay: read it from its history (from_history=None).")
        changes = read_query(log, f"SELECT * FROM changes WHERE _cdc_seq <= {int(point)}", "changes")
        columns = source_fields(changes.schema)
        state = advance(start([], shape_at(events, None, latest)), columns, changes)
        versions = version_rows(state.current(), history_schema(columns))
    return _as_table(versions, shape)


def _first(log: Any, history: Any) -> tuple[int | None, dt.datetime | None]:
    """The first point the lakehouse knows the table at: its first change, or its history's first version."""
    found = []
    if log is not None:
        sql = "SELECT min(_cdc_seq) AS first, min(_cdc_commit_ts) AS first_ts FROM changes"
        found.append(read_query(log, sql, "changes"))
    if history is not None:
        sql = f"SELECT min({VALID_FROM_SEQ}) AS first, min({VALID_FROM}) AS first_ts FROM history"
        found.append(read_query(history, sql, "history"))
    bounds = [(b.column("first")[0].as_py(), b.column("first_ts")[0].as_py()) for b in found]
    bounds = [b for b in bounds if b[0] is not None]
    return min(bounds, key=lambda b: b[0]) if bounds else (None, None)


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """History rows with `schema`'s source columns at its types (a column new to them NULL), then their own
    validity columns."""
    arrays, fields = [], []
    for f in schema:
        if f.name in rows.column_names:
            arrays.append(
                cast_column(rows.column(f.name), f.type) if not f.name.startswith("_cdc_") else rows.column(f.name)
            )
        else:
            arrays.append(pa.nulls(rows.num_rows, f.type))
        fields.append(pa.field(f.name, arrays[-1].type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _has_ddl(log: object) -> bool:
    return "_cdc_ddl" in pa.schema(log.schema().to_arrow()).names  # type: ignore[attr-defined]


def _utc(moment: dt.datetime | None) -> dt.datetime:
    assert moment is not None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def _seq_at(log: Any, history: Any, moment: dt.datetime) -> int | None:
    """The last change committed at or before `moment`: in the change log, or (a snapshot's seed, a table with
    no change log) where the history's versions begin or end."""
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    at = f"arrow_cast('{stamp}', 'Timestamp(Microsecond, Some(\"UTC\"))')"
    found = []
    if log is not None:
        sql = f"SELECT max(_cdc_seq) AS s FROM changes WHERE _cdc_commit_ts <= {at}"
        found.append(read_query(log, sql, "changes").column(0)[0].as_py())
    if history is not None:
        for seq, ts in ((VALID_FROM_SEQ, VALID_FROM), (VALID_TO_SEQ, VALID_TO)):
            sql = f"SELECT max({seq}) AS s FROM history WHERE {ts} <= {at}"
            found.append(read_query(history, sql, "history").column(0)[0].as_py())
    found = [f for f in found if f is not None]
    return max(found) if found else None


def _as_table(versions: pa.Table, shape: TableShape) -> pa.Table:
    """Valid versions as the table's rows then: its columns at their types, the writing change's seq and time."""
    arrays, fields = [], []
    for spec in shape.columns:
        target = arrow_type(spec)
        values = (
            versions.column(spec.name) if spec.name in versions.column_names else pa.nulls(versions.num_rows, target)
        )
        try:
            values = cast_column(values, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            target = values.type  # kept at the change log's wider type
        arrays.append(values)
        fields.append(pa.field(spec.name, target))
    arrays += [versions.column(VALID_FROM_SEQ), versions.column(VALID_FROM)]
    fields += [
        pa.field("_cdc_seq", versions.schema.field(VALID_FROM_SEQ).type),
        pa.field("_cdc_commit_ts", versions.schema.field(VALID_FROM).type),
    ]
    rows = pa.Table.from_arrays(
        [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays], schema=pa.schema(fields)
    )
    order = list(shape.primary_key) or shape.column_names
    return rows.take(pc.sort_indices(rows, [(k, "ascending") for k in order])) if rows.num_rows else rows


def parse_point(text: str) -> tuple[dt.datetime | None, int | None]:
    """`--as-of`: `seq:N` or an ISO 8601 time (naive: UTC), as (at_time, at_seq)."""
    if text.startswith("seq:"):
        number = text[len("seq:") :]
        if number.isdigit():
            return None, int(number)
    else:
        try:
            return dt.datetime.fromisoformat(text), None
        except ValueError:
            pass
    raise CdcUserError(
        f"--as-of {text!r} is not a point: give an ISO time (2026-11-23T10:00:00, UTC unless it has an offset) "
        "or seq:N (a `_cdc_seq`)."
    )


def export_as_of(lakehouse: Lakehouse, table: str, point: str, destination: str) -> int:
    """The table as of `point` (`parse_point`) written to a local Parquet file, whole or not at all (a temporary
    file beside it, renamed into place); returns the rows written."""
    at_time, at_seq = parse_point(point)
    target = Path(destination)
    if target.is_dir() or not target.parent.is_dir() or not os.access(target.parent, os.W_OK):
        raise CdcUserError(
            f"Cannot write {destination}: give --to a file path in an existing, writable directory "
            "(e.g. ./orders.parquet)."
        )
    rows = table_as_of(lakehouse, table, at_time=at_time, at_seq=at_seq)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(rows, temporary)
        os.replace(temporary, target)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise CdcUserError(f"Cannot write {destination} ({exc.strerror}): free space or choose another --to.") from exc
    return rows.num_rows
