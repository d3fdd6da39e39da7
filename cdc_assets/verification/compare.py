"""Row-for-row comparison of two tables of the same columns (the source's and the current state's), and the
sentence that says how they differ. The source side is read with SQL and typed from the server's own text of
each value (source/rows.py), a route independent of the binlog decoding."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from cdc_assets.core.arrow import hashable, sorted_by_key
from cdc_assets.core.names import TableRef
from cdc_assets.lake.state import known_tables
from cdc_assets.lake.store import Lakehouse

MAX_KEYS_SHOWN = 20


@dataclass
class TableDiff:
    """How a current-state table differs from its source table (empty lists: identical)."""

    table: TableRef
    source_rows: int = 0
    lakehouse_rows: int = 0
    missing: list[tuple] = field(default_factory=list)  # keys in the source, not in the lakehouse
    extra: list[tuple] = field(default_factory=list)  # keys in the lakehouse, not in the source
    different: list[tuple] = field(default_factory=list)  # keys whose values differ
    schema_problem: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different or self.schema_problem)

    def describe(self) -> str:
        if self.ok:
            return f"{self.table}: {self.source_rows} rows match"
        if self.schema_problem:
            return f"{self.table}: {self.schema_problem}"
        parts = []
        for label, keys in (("missing", self.missing), ("extra", self.extra), ("different", self.different)):
            if keys:
                shown = ", ".join(_key_text(k) for k in keys[:MAX_KEYS_SHOWN])
                more = f" (+{len(keys) - MAX_KEYS_SHOWN} more)" if len(keys) > MAX_KEYS_SHOWN else ""
                parts.append(f"{len(keys)} {label}: {shown}{more}")
        return f"{self.table}: source {self.source_rows} rows, lakehouse {self.lakehouse_rows} rows; " + "; ".join(
            parts
        )


def _key_text(key: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in key) + ")" if len(key) != 1 else repr(key[0])


def _by_key(table: pa.Table, key: list[str]) -> dict[tuple, list[tuple]]:
    rows: dict[tuple, list[tuple]] = {}
    names = table.column_names
    key_idx = [names.index(k) for k in key]
    for values in zip(*(table.column(n).to_pylist() for n in names), strict=True) if table.num_rows else []:
        rows.setdefault(hashable(tuple(values[i] for i in key_idx)), []).append(hashable(values))
    return rows


def compare_tables(table: TableRef, source: pa.Table, lakehouse: pa.Table, key: list[str]) -> TableDiff:
    """Compare two tables with the same columns, keyed by `key` (all columns when there is no key).

    Both sorted by the key and equal as Arrow tables is the common case, proved without a Python value per
    cell; only tables that differ are compared key by key, to say which keys differ."""
    key = key or source.column_names
    diff = TableDiff(table, source.num_rows, lakehouse.num_rows)
    if source.num_rows == lakehouse.num_rows and sorted_by_key(source, key).equals(sorted_by_key(lakehouse, key)):
        return diff
    left, right = _by_key(source, key), _by_key(lakehouse, key)
    diff.missing = sorted((k for k in left if k not in right), key=repr)
    diff.extra = sorted((k for k in right if k not in left), key=repr)
    diff.different = sorted(
        (k for k in left if k in right and sorted(left[k], key=repr) != sorted(right[k], key=repr)), key=repr
    )
    return diff


def align_current(table: TableRef, source: pa.Table, current: pa.Table) -> pa.Table | TableDiff:
    """Current-state rows in the source's columns, order and types; or the TableDiff saying why they differ."""
    names = source.column_names
    missing_columns = [n for n in names if n not in current.column_names]
    if missing_columns:
        return TableDiff(table, source.num_rows, current.num_rows, schema_problem=f"columns missing: {missing_columns}")
    current = current.select(names)
    if current.schema != source.schema:
        mismatched = [
            f"{f.name}: source {f.type}, lakehouse {current.schema.field(f.name).type}"
            for f in source.schema
            if current.schema.field(f.name).type != f.type
        ]
        if mismatched:
            return TableDiff(
                table, source.num_rows, current.num_rows, schema_problem="types differ: " + "; ".join(mismatched)
            )
        current = current.cast(source.schema)
    return current


def tables_to_verify(lakehouse: Lakehouse, requested: list[str] | None) -> list[TableRef]:
    if requested:
        return [TableRef.parse(t) for t in requested]
    return [TableRef.parse(name) for name in known_tables(lakehouse.store)]
