"""Some rows of each side, picked by primary key: what the equality check after an apply compares.

The source's come from `source.rows.read_source_rows_with_keys` (SELECT … WHERE key IN …, inside the check's
consistent snapshot). The current-state table's come from only those of its files whose key range (their Delta
min/max statistics, as the copy-on-write merge probes them) may hold one of the keys, so a check after a small
apply reads a few files of a large table, not all of them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_assets.core.names import TableRef
from cdc_assets.lake.files import conformed, read_files
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.current.rows import file_ranges, live_rows, touched_by
from cdc_assets.verification.row_hashes import row_bytes


def keys_table(keys: set[tuple[Any, ...]], names: list[str], types: list[pa.DataType]) -> pa.Table:
    """Typed key tuples as a table of the key columns."""
    columns = list(zip(*keys, strict=True)) if keys else [() for _ in names]
    return pa.table({n: pa.array(list(c), t) for n, c, t in zip(names, columns, types, strict=True)})


def with_keys(rows: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows whose key (the columns of `keys`, the same types) is one of `keys`' rows."""
    if not rows.num_rows or not keys.num_rows:
        return rows.schema.empty_table()
    names = keys.column_names
    wanted = row_bytes(keys.cast(pa.schema([rows.schema.field(n) for n in names])), names)
    return rows.filter(pc.is_in(row_bytes(rows, names), value_set=wanted.combine_chunks()))


def lake_rows_with_keys(lakehouse: Lakehouse, table: TableRef, current: DeltaTable, keys: pa.Table) -> tuple[pa.Table, int]:
    """The current-state rows (at `current`'s version, every column) whose key is one of `keys`' rows, and how
    many of the table's files were read for them."""
    schema = pa.schema(current.schema().to_arrow())
    actions = pa.table(current.get_add_actions(flatten=True))
    if not keys.num_rows or not actions.num_rows:
        return schema.empty_table(), 0
    try:
        paths = sorted(touched_by(keys, file_ranges(actions, keys.column_names)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):  # a bound that does not compare: read all
        paths = sorted(actions.column("path").to_pylist())
    access, key = lakehouse.file_access(), lakehouse.table_key(CURRENT, table)
    parts = [with_keys(conformed(rows, schema), keys) for rows in read_files(access, key, paths)]
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    return live_rows(rows), len(paths)  # soft deletes: only live rows are compared
