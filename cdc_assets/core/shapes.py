"""A table's shape (columns and primary key) and the schema changes DDL makes to it.

One `TableShape` travels from capture (each raw batch's table versions, the shapes kept at the checkpoint) to
the change logs and current state (the shape a table's changes are typed and merged with). Its JSON form is
`{"columns": [...], "primary_key": [...]}`; raw batches' manifests add the version id, schema and table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cdc_assets.core.mysql_types import ColumnSpec, arrow_type
from cdc_assets.core.names import TableRef


@dataclass(frozen=True)
class TableShape:
    """A table's columns and primary key at one point of the binlog (no key: the whole row is the key)."""

    table: TableRef
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...]

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def key_indexes(self) -> list[int]:
        """Positions of the key columns; a table without a primary key is keyed by the whole row."""
        names = self.column_names
        if not self.primary_key:
            return list(range(len(names)))
        return [names.index(k) for k in self.primary_key]

    def to_json(self) -> dict[str, Any]:
        return {"columns": [c.to_json() for c in self.columns], "primary_key": list(self.primary_key)}

    @staticmethod
    def from_json(table: TableRef, d: dict[str, Any]) -> TableShape:
        return TableShape(table, tuple(ColumnSpec.from_json(c) for c in d["columns"]), tuple(d["primary_key"]))

    def versioned_json(self, version_id: int) -> dict[str, Any]:
        """A raw batch manifest's entry: the shape with its batch-local version id and its table."""
        return {"id": version_id, "schema": self.table.schema, "table": self.table.table, **self.to_json()}

    @staticmethod
    def from_versioned_json(d: dict[str, Any]) -> tuple[int, TableShape]:
        return int(d["id"]), TableShape.from_json(TableRef(d["schema"], d["table"]), d)

    def same_layout(self, other: TableShape | None) -> bool:
        """Whether two shapes give the same Delta columns and key (charsets, lengths and members aside)."""
        return (
            other is not None
            and self.primary_key == other.primary_key
            and [(c.name, arrow_type(c)) for c in self.columns] == [(c.name, arrow_type(c)) for c in other.columns]
        )


def shape_json(shape: TableShape | None) -> dict[str, Any] | None:
    return None if shape is None else shape.to_json()


def shape_from_json(table: TableRef, d: dict[str, Any] | None) -> TableShape | None:
    return None if d is None else TableShape.from_json(table, d)


def apply_schemas(schemas: dict[TableRef, TableShape], changed: dict[str, Any]) -> dict[TableRef, TableShape]:
    """Known shapes after a batch, from its manifest's `schemas` (the tables whose shape it changed)."""
    result = dict(schemas)
    for name, d in changed.items():
        table = TableRef.parse(name)
        shape = shape_from_json(table, d)
        if shape is None:
            result.pop(table, None)
        else:
            result[table] = shape
    return result


@dataclass(frozen=True)
class Default:
    """What an added column holds in the rows that were there before it: a canonical text or NULL,
    `now` (the DDL's time), or `unknown` (an expression the pipeline cannot evaluate)."""

    kind: str  # value, now, unknown
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Default:
        return Default(d["kind"], d.get("text"))


@dataclass(frozen=True)
class SchemaChange:
    """One table's change by one statement.

    action: create (the table appears, empty or as a copy of `renamed_from`), alter (columns change;
    `renames` maps new names to old, `defaults` gives added columns' values in existing rows), drop
    (the table disappears; `renamed_to` when it lives on under that name). `flavor`: the server that ran it
    ("mariadb" or "mysql", from its raw batch; None before the change log recorded it), whose conversions a MODIFY
    follows. `by_policy`: an implicit alter a column policy made (its values become the texts it polices, not what
    a server's MODIFY would make of them).
    """

    table: TableRef
    action: str
    before: TableShape | None
    after: TableShape | None
    renames: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Default] = field(default_factory=dict)
    renamed_from: TableRef | None = None
    renamed_to: TableRef | None = None
    flavor: str | None = None
    by_policy: bool = False

    def to_json(self) -> dict[str, Any]:
        flavor = {"flavor": self.flavor} if self.flavor else {}
        flavor |= {"by_policy": True} if self.by_policy else {}
        return flavor | {
            "table": str(self.table),
            "action": self.action,
            "before": shape_json(self.before),
            "after": shape_json(self.after),
            "renames": self.renames,
            "defaults": {k: v.to_json() for k, v in self.defaults.items()},
            "renamed_from": str(self.renamed_from) if self.renamed_from else None,
            "renamed_to": str(self.renamed_to) if self.renamed_to else None,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> SchemaChange:
        table = TableRef.parse(d["table"])
        return SchemaChange(
            table=table,
            action=d["action"],
            before=shape_from_json(table, d.get("before")),
            after=shape_from_json(table, d.get("after")),
            renames=dict(d.get("renames") or {}),
            defaults={k: Default.from_json(v) for k, v in (d.get("defaults") or {}).items()},
            renamed_from=TableRef.parse(d["renamed_from"]) if d.get("renamed_from") else None,
            renamed_to=TableRef.parse(d["renamed_to"]) if d.get("renamed_to") else None,
            flavor=d.get("flavor"),
            by_policy=bool(d.get("by_policy")),
        )


def renamed_partners(changes: Iterable[dict[str, Any]]) -> set[str]:
    """Every table on the other side of a RENAME among schema changes (as SchemaChange JSON): a renamed table's
    rows move with it, so a stage takes both sides in together."""
    return {t for change in changes for t in (change.get("renamed_from"), change.get("renamed_to")) if t}


def with_rename_partners(targets: set[str], take_in: Callable[[list[str]], set[str]]) -> set[str]:
    """`targets` grown by the other side of every RENAME found among them, until none is left: a renamed
    table's rows move with it, so a stage takes both sides in together. `take_in` reads the tables it is
    given (the first time all of `targets`, then the partners just found) and returns the partners it saw."""
    new = sorted(targets)
    while new:
        partners = take_in(new) - targets
        targets |= partners
        new = sorted(partners)
    return targets


# A MariaDB SEQUENCE (CREATE SEQUENCE) is a table of one row of these columns, which the binlog logs as a row insert at
# every cache refill. It is state of the server, not data: capture skips it, as a snapshot does (docs/lakehouse.md, Types: "Sequences").
SEQUENCE_COLUMNS = (
    "next_not_cached_value", "minimum_value", "maximum_value", "start_value", "increment", "cache_size",
    "cycle_option", "cycle_count",
)  # fmt: skip


def is_sequence(shape: TableShape) -> bool:
    """Whether a binlog table shape is a MariaDB SEQUENCE's (its fixed columns, no key)."""
    return not shape.primary_key and tuple(c.name for c in shape.columns) == SEQUENCE_COLUMNS
