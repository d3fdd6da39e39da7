"""The source's foreign keys, read from `information_schema`: which child rows a parent's change cascades to.

MariaDB and MySQL before 9.6 apply ON DELETE / ON UPDATE CASCADE and SET NULL inside InnoDB, where the binlog never
sees them (`server.logs_foreign_key_cascades`): the child rows change without row events. The graph read here is
the source's now, read again for every run, so it follows DDL from run to run.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import pymysql

from cdc_assets.core.names import TableRef
from cdc_assets.source.rows import quote_identifier

CASCADING_RULES = ("CASCADE", "SET NULL")  # what InnoDB does to the children itself; RESTRICT/NO ACTION refuse


@dataclass(frozen=True)
class ForeignKey:
    """One foreign key: the child's columns referencing the parent's, and what a parent's delete or key update
    does to the child rows."""

    child: TableRef
    child_columns: tuple[str, ...]
    parent: TableRef
    parent_columns: tuple[str, ...]
    on_delete: str
    on_update: str

    @property
    def cascades(self) -> bool:
        """Whether a parent's delete or update can change child rows."""
        return self.on_delete in CASCADING_RULES or self.on_update in CASCADING_RULES


def foreign_keys(conn: pymysql.Connection, children: Collection[str]) -> list[ForeignKey]:
    """Every foreign key of the `children` tables (`schema.table`) that cascades (a child row changes with its
    parent's), in a stable order. The columns come from `KEY_COLUMN_USAGE`; the rules from each child's `SHOW CREATE
    TABLE`, since MariaDB shows `REFERENTIAL_CONSTRAINTS` to no user with SELECT alone (the CDC user's grants).

    Only the children's schemas are read: `KEY_COLUMN_USAGE` opens every table of every schema it looks at, which
    costs a server of many schemas dearly at every run, and MariaDB 10.11 has crashed (signal 11 in
    `get_all_tables`) answering it over the whole server while other schemas' tables were created and dropped."""
    wanted = set(children)
    schemas = sorted({TableRef.parse(c).schema for c in wanted})
    if not schemas:
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, COLUMN_NAME, REFERENCED_TABLE_SCHEMA, "
            "REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
            f"WHERE TABLE_SCHEMA IN ({', '.join(['%s'] * len(schemas))}) AND REFERENCED_TABLE_NAME IS NOT NULL "
            "ORDER BY TABLE_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, ORDINAL_POSITION",
            schemas,
        )
        rows = [r for r in cur.fetchall() if str(TableRef(str(r[0]), str(r[1]))) in wanted]
        grouped: dict[tuple[str, str, str], list[tuple]] = {}
        for row in rows:
            grouped.setdefault((str(row[0]), str(row[1]), str(row[2])), []).append(row)
        rules: dict[TableRef, dict[str, tuple[str, str]]] = {}
        for schema, table, _ in grouped:
            child = TableRef(schema, table)
            if child not in rules:
                cur.execute(f"SHOW CREATE TABLE {quote_identifier(schema)}.{quote_identifier(table)}")
                rules[child] = constraint_rules(str(cur.fetchone()[1]))
    found = []
    for (schema, table, name), parts in grouped.items():
        first, child = parts[0], TableRef(schema, table)
        on_delete, on_update = rules[child].get(name, ("RESTRICT", "RESTRICT"))
        fk = ForeignKey(
            child=child,
            child_columns=tuple(str(p[3]) for p in parts),
            parent=TableRef(str(first[4]), str(first[5])),
            parent_columns=tuple(str(p[6]) for p in parts),
            on_delete=on_delete,
            on_update=on_update,
        )
        if fk.cascades:
            found.append(fk)
    return found


_CONSTRAINT = re.compile(r"CONSTRAINT\s+`((?:[^`]|``)+)`\s+FOREIGN\s+KEY[^\n]*", re.IGNORECASE)
_RULE = re.compile(r"ON\s+(DELETE|UPDATE)\s+(CASCADE|SET\s+NULL|SET\s+DEFAULT|RESTRICT|NO\s+ACTION)", re.IGNORECASE)


def constraint_rules(create_table: str) -> dict[str, tuple[str, str]]:
    """Each foreign key's (ON DELETE, ON UPDATE) rule in a `SHOW CREATE TABLE` text (RESTRICT where none is said)."""
    found = {}
    for match in _CONSTRAINT.finditer(create_table):
        said = {kind.upper(): " ".join(rule.upper().split()) for kind, rule in _RULE.findall(match.group(0))}
        found[match.group(1).replace("``", "`")] = (said.get("DELETE", "RESTRICT"), said.get("UPDATE", "RESTRICT"))
    return found
