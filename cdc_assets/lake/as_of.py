"""Reads of a table as it was at a point: a commit time or a `_cdc_seq` (`table_as_of`).

From the table's history table when CDC_HISTORY_TABLES keeps one up to that point (one query over the versions
valid then), else by replaying its change log up to the point through the very function that builds history
versions (lake.history_rows), so both ways give the same rows. Rows loaded by a snapshot and never changed
since are in neither (they never passed through the change log).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import arrow_type
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.change_rows import cast_column
from cdc_assets.lake.delta import HISTORY_SEQ_KEY, max_seq, read_query
from cdc_assets.lake.history_rows import (
    VALID_FROM,
    VALID_FROM_SEQ,
    VALID_TO_SEQ,
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
    latest = load_progress(lakehouse.store, CHANGES_STAGE, str(ref)).shape
    if log is None or latest is None:
        raise CdcUserError(
            f"{ref} is not in the lakehouse at {lakehouse} (no change log): check the name (schema.table) and "
            "that `cdc-lakehouse sync` has captured it."
        )
    bounds = read_query(log, "SELECT min(_cdc_seq) AS first, min(_cdc_commit_ts) AS first_ts FROM changes", "changes")
    first, first_ts = bounds.column("first")[0].as_py(), bounds.column("first_ts")[0].as_py()
    point = at_seq if at_seq is not None else _seq_at(log, _utc(at_time))
    if point is None or first is None or point < first:
        asked = f"seq {at_seq}" if at_seq is not None else f"{_utc(at_time).isoformat()}"
        raise CdcUserError(
            f"{asked} is before the first change of {ref} in the lakehouse (seq {first}, committed {first_ts}): "
            "ask for a later point."
        )
    events = (
        schema_changes(read_query(log, "SELECT * FROM changes WHERE _cdc_ddl IS NOT NULL", "changes"))
        if _has_ddl(log)
        else []
    )
    shape = shape_at(events, point, latest)
    history = lakehouse.open(HISTORY, ref)
    reaches = history is not None and (max_seq(history, HISTORY_SEQ_KEY) or -1) >= point
    if from_history and not reaches:
        raise CdcUserError(f"{ref} has no history table reaching seq {point}: add it to CDC_HISTORY_TABLES and sync.")
    if reaches and from_history is not False:
        assert history is not None
        where = f"{VALID_FROM_SEQ} <= {int(point)} AND ({VALID_TO_SEQ} IS NULL OR {VALID_TO_SEQ} > {int(point)})"
        versions = read_query(history, f"SELECT * FROM history WHERE {where}", "history")
    else:
        changes = read_query(log, f"SELECT * FROM changes WHERE _cdc_seq <= {int(point)}", "changes")
        columns = source_fields(changes.schema)
        state = advance(start([], shape_at(events, None, latest)), columns, changes)
        versions = version_rows(state.current(), history_schema(columns))
    return _as_table(versions, shape)


def _has_ddl(log: object) -> bool:
    return "_cdc_ddl" in pa.schema(log.schema().to_arrow()).names  # type: ignore[attr-defined]


def _utc(moment: dt.datetime | None) -> dt.datetime:
    assert moment is not None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def _seq_at(log: object, moment: dt.datetime) -> int | None:
    """The last change committed at or before `moment`."""
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    sql = f"SELECT max(_cdc_seq) AS s FROM changes WHERE _cdc_commit_ts <= arrow_cast('{stamp}', 'Timestamp(Microsecond, Some(\"UTC\"))')"
    return read_query(log, sql, "changes").column(0)[0].as_py()  # type: ignore[arg-type]


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
