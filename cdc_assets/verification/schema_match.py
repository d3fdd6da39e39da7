"""Whether each current-state table has its source table's columns, order and Delta types (docs/lakehouse.md: Lakehouse layout; Types (MySQL → Delta))."""

import pyarrow as pa

from cdc_assets.core.mysql_types import arrow_type
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import plain_schema
from cdc_assets.lake.layout import CURRENT, CURRENT_STAGE
from cdc_assets.lake.state import load_checkpoint, load_progress, load_registry, load_schemas
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.rows import source_shapes


def schema_difference(source_fields: list[pa.Field], current: pa.Schema) -> str | None:
    """What is wrong with `current` against the source's columns, or None when it matches."""
    names = current.names
    source_names = [f.name for f in source_fields]
    if names[: len(source_names)] != source_names:
        return f"columns are {names[: len(source_names)]}, the source has {source_names}"
    extra = [n for n in names[len(source_names) :] if not n.startswith("_cdc_")]
    if extra:
        return f"columns {extra} are not in the source"
    wrong = [
        f"{f.name} is {current.field(f.name).type}, expected {f.type}"
        for f in source_fields
        if current.field(f.name).type != f.type
    ]
    return "; ".join(wrong) or None


def _fields(shape: TableShape) -> list[pa.Field]:
    return [pa.field(c.name, arrow_type(c)) for c in shape.columns]


def _change_in_flight(lakehouse: Lakehouse, name: str, table: TableRef, source_fields: list[pa.Field]) -> bool:
    """Whether the source's columns may differ from the current state's because a change of them is on its way:
    the source's differ from those capture knows at its checkpoint (a DDL after it), or changes captured for the
    table are not all applied yet. Asked only of a table that differs, so a run pays nothing when all match."""
    store = lakehouse.store
    known = load_schemas(store, load_checkpoint(store)).get(table)
    if known is not None and _fields(known) != source_fields:
        return True
    last = load_registry(store).get(name, {}).get("last_batch")
    applied = load_progress(store, CURRENT_STAGE, name).batch
    return last is not None and (applied is None or applied < last)


def schema_differences(settings: SourceSettings, lakehouse: Lakehouse, tables: list[str]) -> dict[str, str]:
    """Per table with a problem, one sentence about it. A table whose source columns changed in flight (a DDL
    after the capture this run applied, or captured and not yet applied) is left out, as the row comparison
    leaves it out: the run that applies the change checks it."""
    refs = [TableRef.parse(name) for name in tables]
    conn = source.connect(settings.url)
    try:
        policy = settings.column_policy  # the lakehouse's columns are the source's under the column policy
        shapes = {t: policy.lake_shape(s) if s is not None else None for t, s in source_shapes(conn, refs).items()}
    finally:
        conn.close()
    opened = for_each_table(refs, lambda t: lakehouse.open(CURRENT, t))
    problems = {}
    for name, table, dt in zip(tables, refs, opened, strict=True):
        shape = shapes[table]
        if shape is None:
            if dt is not None:
                problems[name] = "the table no longer exists in the source"
            continue
        if dt is None:
            problems[name] = "there is no current-state table yet"
            continue
        current = plain_schema(dt)
        problem = schema_difference(_fields(shape), current)
        if problem and not _change_in_flight(lakehouse, name, table, _fields(shape)):
            problems[name] = problem
    return problems
