"""The child rows a parent's changes reach through cascading foreign keys, found in the lakehouse's current state.

On a server that does not log cascades (`source.server.logs_foreign_key_cascades`: MariaDB, MySQL before 9.6), a
parent's delete or key update changes child rows (ON DELETE / ON UPDATE CASCADE, SET NULL) with no row event. The
lakehouse still holds those child rows as they were, so they are found there: the child rows whose foreign key
holds a value a parent row had before its delete or update, then, recursively, their own children. Their keys are
what the check after an apply compares besides the keys the binlog changed, and what `sync` repairs right after
its capture (repair/run.py), so the children end as the source holds them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import hashable
from cdc_assets.core.mysql_types import decode_image
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import DELETE, UPDATE
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.raw_batches import BatchManifest, read_rows
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source.foreign_keys import ForeignKey
from cdc_assets.stages.current.apply import quote

MAX_DEPTH = 16  # levels of children followed (InnoDB itself stops cascading at 15)

Rows = list[dict[str, Any]]  # rows as dicts of the columns some foreign key references


def parents_before_changes(lakehouse: Lakehouse, batches: Iterable[BatchManifest], fks: list[ForeignKey]) -> dict[TableRef, Rows]:
    """The rows parents had before the batches deleted them or changed a column a foreign key references: what
    their children may have cascaded from."""
    referenced: dict[TableRef, set[str]] = {}
    for fk in fks:
        referenced.setdefault(fk.parent, set()).update(fk.parent_columns)
    found: dict[TableRef, Rows] = {}
    for manifest in batches:
        parents = {v: shape for v, shape in manifest.shapes.items() if shape.table in referenced}
        if not parents:
            continue
        rows = read_rows(lakehouse.store, manifest)
        for version, shape in parents.items():
            mine = rows.filter(
                pc.and_(pc.equal(rows.column("table_version"), version), pc.is_in(rows.column("op"), pa.array([DELETE, UPDATE])))
            )
            found.setdefault(shape.table, []).extend(_reaching(shape, mine, referenced[shape.table]))
    return {t: r for t, r in found.items() if r}


def _reaching(shape: TableShape, rows: pa.Table, columns: set[str]) -> Rows:
    """The before-images of deletes, and of updates that changed a referenced column."""
    if not rows.num_rows:
        return []
    names = [c for c in shape.column_names if c in columns]
    before = decode_image(list(shape.columns), rows.column("before"))
    after = decode_image(list(shape.columns), rows.column("after"))
    old = {n: pc.struct_field(before, n).to_pylist() for n in names}
    new = {n: pc.struct_field(after, n).to_pylist() for n in names}
    ops = rows.column("op").to_pylist()
    return [
        {n: old[n][i] for n in names}
        for i, op in enumerate(ops)
        if op == DELETE or any(old[n][i] != new[n][i] for n in names)
    ]


def parents_before_logged(changes: dict[TableRef, pa.Table], fks: list[ForeignKey]) -> dict[TableRef, Rows]:
    """`parents_before_changes` from change-log rows (`_cdc_op`, `_cdc_before` and the columns): the check after an
    apply reads what changed since a table was last found equal from its change log."""
    found: dict[TableRef, Rows] = {}
    for fk in fks:
        log = changes.get(fk.parent)
        if log is None or not log.num_rows:
            continue
        ops = log.column("_cdc_op").to_pylist()
        before = log.column("_cdc_before").combine_chunks()
        old = {n: pc.struct_field(before, n).to_pylist() for n in fk.parent_columns}
        new = {n: log.column(n).to_pylist() for n in fk.parent_columns}
        found.setdefault(fk.parent, []).extend(
            {n: old[n][i] for n in fk.parent_columns}
            for i, op in enumerate(ops)
            if (op == DELETE or (op == UPDATE and any(old[n][i] != new[n][i] for n in fk.parent_columns)))
        )
    return {t: r for t, r in found.items() if r}


def cascaded_keys(
    lakehouse: Lakehouse, fks: list[ForeignKey], parents: dict[TableRef, Rows], shapes: dict[TableRef, TableShape]
) -> dict[TableRef, set[tuple] | None]:
    """Per child table (recursively), the keys of its current-state rows whose foreign key holds a value one of
    `parents`' rows had: the rows a cascade may have changed. None for a child without a primary key (its rows have
    no identity: it is compared whole)."""
    found: dict[TableRef, set[tuple] | None] = {}
    frontier = parents
    for _ in range(MAX_DEPTH):
        following: dict[TableRef, Rows] = {}
        for fk in fks:
            values = {hashable(tuple(r.get(c) for c in fk.parent_columns)) for r in frontier.get(fk.parent, [])}
            values.discard(tuple(None for _ in fk.parent_columns))
            shape = shapes.get(fk.child)
            if not values or shape is None:
                continue
            current = lakehouse.open(CURRENT, fk.child)
            if current is None:
                continue
            # its key, this foreign key and what its own children reference: all a further level needs
            wanted = dict.fromkeys([*shape.primary_key, *fk.child_columns, *(c for f in fks if f.parent == fk.child for c in f.parent_columns)])
            rows = read_query(current, f"SELECT {', '.join(quote(c) for c in wanted)} FROM current", "current")
            matching = [
                row
                for row in rows.to_pylist()
                if hashable(tuple(row.get(c) for c in fk.child_columns)) in values
            ]
            if not matching:
                continue
            if shape.primary_key:
                keys = found.get(fk.child, set())
                if keys is not None:
                    keys |= {hashable(tuple(r[k] for k in shape.primary_key)) for r in matching}
                    found[fk.child] = keys
            else:
                found[fk.child] = None
            following.setdefault(fk.child, []).extend(matching)
        if not following:
            break
        frontier = following
    return found
