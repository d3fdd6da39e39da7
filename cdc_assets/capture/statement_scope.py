"""Which tables a statement of the binlog changes the rows or columns of, read from its tokens (capture/ddl.py's
tokenizer): a pure function of the statement text and its default schema.

Capture records every statement that is not a row event (`BatchBuilder.statement`), and a comparison holds a table
off while a statement that changes it is in flight (verification/consistency.py). Many statements name a table
without changing one of its rows or columns: a foreign key of another table that references it; a procedure,
function, trigger, view or event whose body names it (the rows a trigger or a routine changes when it runs arrive
as row events of their own); REPAIR, OPTIMIZE, ANALYZE, CHECK TABLE (OPTIMIZE, like `ALTER TABLE … FORCE` or
`ENGINE=…`, rebuilds a table and keeps its rows); GRANT and REVOKE; an index; a comment (a table's COMMENT, a
`/* … */` naming it). Those change no table here. Partition maintenance that removes or moves rows (TRUNCATE, DROP,
EXCHANGE, CONVERT PARTITION) does change its tables, and so does anything this module cannot read: `None` then
tells the caller to count every table the statement names.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_assets.capture.ddl import DdlParseError, Token, _Cursor, _split_top_level, tokenize
from cdc_assets.core.names import TableRef


@dataclass(frozen=True)
class ChangedTables:
    """The tables a statement may change the rows or columns of: these tables, and every table of these schemas
    (DROP DATABASE)."""

    tables: frozenset[TableRef] = frozenset()
    schemas: frozenset[str] = frozenset()

    def covers(self, table: TableRef) -> bool:
        return table in self.tables or table.schema in self.schemas


NOTHING = ChangedTables()

# Objects that hold no row of a table: creating, altering or dropping one changes no table's rows or columns.
_NO_ROWS_OBJECTS = frozenset({
    "PROCEDURE", "FUNCTION", "TRIGGER", "VIEW", "EVENT", "INDEX", "DATABASE", "SCHEMA", "SERVER", "TABLESPACE",
    "LOGFILE", "USER", "ROLE", "PACKAGE", "RESOURCE", "SPATIAL", "INSTANCE",
})  # fmt: skip
# Words that may come between CREATE and the kind of object it creates.
_CREATE_PREFIXES = frozenset({"OR", "REPLACE", "AGGREGATE", "UNIQUE", "FULLTEXT", "ONLINE", "OFFLINE", "TEMPORARY"})
# Table maintenance: reads or rebuilds a table, keeping its rows.
_MAINTENANCE = frozenset({"REPAIR", "OPTIMIZE", "ANALYZE", "CHECK", "CHECKSUM"})
# Statements about no table's rows: accounts and privileges, caches, logs, plugins.
_NO_TABLE = frozenset({"GRANT", "REVOKE", "FLUSH", "RESET", "PURGE", "INSTALL", "UNINSTALL", "CACHE"})
# ALTER TABLE clauses that change no row or column: indexes and constraints other than the primary key, partition
# maintenance that keeps every row where it is, and table options (a COMMENT, the engine, a rebuild).
_KEEPS_ROWS_ADDED = frozenset({"INDEX", "KEY", "UNIQUE", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK", "PARTITION", "PERIOD"})
_KEEPS_ROWS_DROPPED = frozenset({"INDEX", "KEY", "FOREIGN", "CHECK", "PERIOD"})
# (DISCARD and IMPORT of a partition's tablespace take its rows away or bring others in: they count)
_KEEPS_ROWS_PARTITIONS = frozenset({"REORGANIZE", "COALESCE", "REBUILD", "OPTIMIZE", "ANALYZE", "CHECK", "REPAIR"})
_TABLE_OPTIONS = frozenset({
    "ENGINE", "TYPE", "COMMENT", "AUTO_INCREMENT", "AVG_ROW_LENGTH", "CHECKSUM", "TABLE_CHECKSUM", "COMPRESSION",
    "CONNECTION", "DATA", "DELAY_KEY_WRITE", "ENCRYPTED", "ENCRYPTION", "ENCRYPTION_KEY_ID", "ENGINE_ATTRIBUTE",
    "SECONDARY_ENGINE", "SECONDARY_ENGINE_ATTRIBUTE", "INSERT_METHOD", "KEY_BLOCK_SIZE", "MAX_ROWS", "MIN_ROWS",
    "PACK_KEYS", "PAGE_CHECKSUM", "PAGE_COMPRESSED", "PAGE_COMPRESSION_LEVEL", "PASSWORD", "ROW_FORMAT",
    "SEQUENCE", "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES", "TRANSACTIONAL",
    "IETF_QUOTES", "AUTOEXTEND_SIZE", "START", "STORAGE", "DEFAULT", "CHARACTER", "CHARSET", "COLLATE", "FORCE",
    "ALGORITHM", "LOCK", "ORDER", "ENABLE", "DISABLE", "WITH", "WITHOUT", "REMOVE", "PARTITION", "NOWAIT", "WAIT",
    "SECONDARY_LOAD", "SECONDARY_UNLOAD", "UPGRADE",
})  # fmt: skip


def changed_tables(statement: str, default_schema: str | None) -> ChangedTables | None:
    """The tables whose rows or columns `statement` may change; None when its tokens do not tell (a statement this
    does not read, which may change rows or columns: the caller counts every table it names)."""
    try:
        return _changed(_Cursor(tokenize(statement)), default_schema)
    except (DdlParseError, IndexError):
        return None


def _changed(cur: _Cursor, schema: str | None) -> ChangedTables | None:
    if cur.at_end():
        return NOTHING
    word = cur.upper()
    if word in _MAINTENANCE or word in _NO_TABLE or (word == "LOAD" and cur.upper(1) == "INDEX"):
        return NOTHING
    if word == "TRUNCATE":
        cur.take()
        cur.accept("TABLE")
        return ChangedTables(frozenset({cur.table(schema)}))
    if word == "RENAME":
        cur.take()
        if not (cur.accept("TABLE") or cur.accept("TABLES")):
            return NOTHING if cur.upper() in ("USER", "ROLE") else None
        named = [
            table for part in _split_top_level(cur.tokens[cur.i :]) for table in _renamed_tables(_Cursor(part), schema)
        ]
        return ChangedTables(frozenset(named))
    if word == "CREATE":
        cur.take()
        return _created(cur, schema)
    if word == "ALTER":
        cur.take()
        return _altered(cur, schema)
    if word == "DROP":
        cur.take()
        return _dropped(cur, schema)
    return None


def _skip_definer(cur: _Cursor) -> None:
    """`ALGORITHM = …`, `DEFINER = user`, `SQL SECURITY …` before the object a CREATE or ALTER names."""
    while True:
        if cur.upper() in ("ALGORITHM", "DEFINER") and _is_punct(cur.peek(1), "="):
            cur.i += 2
            cur.take()  # the algorithm, or the user: `name`, 'name', name@host, CURRENT_USER
            host = cur.peek()
            if host is not None and host.kind == "word" and host.text.startswith("@"):  # @host, or @ then 'host'
                cur.take()
                if host.text == "@":
                    cur.take()
            if _is_punct(cur.peek(), "("):  # CURRENT_USER()
                cur.parenthesised()
        elif cur.accept("SQL", "SECURITY"):
            cur.take()
        else:
            return


def _is_punct(token: Token | None, text: str) -> bool:
    return token is not None and token.kind == "punct" and token.text == text


def _created(cur: _Cursor, schema: str | None) -> ChangedTables | None:
    temporary = False
    while True:
        _skip_definer(cur)
        word = cur.upper()
        if word not in _CREATE_PREFIXES:
            break
        temporary = temporary or word == "TEMPORARY"
        cur.take()
    kind = cur.upper()
    if kind == "TABLE":
        if temporary:  # a temporary table is not the base table of its name
            return NOTHING
        cur.take()
        cur.accept("IF", "NOT", "EXISTS")
        return ChangedTables(frozenset({cur.table(schema)}))
    if kind == "SEQUENCE":  # MariaDB's sequence is a table of one row
        cur.take()
        cur.accept("IF", "NOT", "EXISTS")
        return ChangedTables(frozenset({cur.table(schema)}))
    return NOTHING if kind in _NO_ROWS_OBJECTS else None


def _dropped(cur: _Cursor, schema: str | None) -> ChangedTables | None:
    if cur.accept("TEMPORARY"):
        return NOTHING
    kind = cur.upper()
    if kind in ("TABLE", "TABLES", "SEQUENCE"):
        cur.take()
        cur.accept("IF", "EXISTS")
        parts = _split_top_level(cur.tokens[cur.i :])
        return ChangedTables(frozenset(_Cursor(part).table(schema) for part in parts))
    if kind in ("DATABASE", "SCHEMA"):
        cur.take()
        cur.accept("IF", "EXISTS")
        return ChangedTables(schemas=frozenset({cur.identifier()}))
    _skip_definer(cur)
    return NOTHING if cur.upper() in _NO_ROWS_OBJECTS else None


def _altered(cur: _Cursor, schema: str | None) -> ChangedTables | None:
    while cur.accept("ONLINE") or cur.accept("OFFLINE") or cur.accept("IGNORE"):
        pass
    _skip_definer(cur)
    kind = cur.upper()
    if kind == "SEQUENCE":
        cur.take()
        cur.accept("IF", "EXISTS")
        return ChangedTables(frozenset({cur.table(schema)}))
    if kind != "TABLE":
        return NOTHING if kind in _NO_ROWS_OBJECTS else None
    cur.take()
    cur.accept("IF", "EXISTS")
    table = cur.table(schema)
    if cur.accept("NOWAIT"):
        pass
    elif cur.accept("WAIT"):
        cur.take()
    changed: set[TableRef] = set()
    for spec in _split_top_level(cur.tokens[cur.i :]):
        changed |= _clause_changes(_Cursor(spec), table, schema)
    return ChangedTables(frozenset(changed))


def _clause_changes(sc: _Cursor, table: TableRef, schema: str | None) -> set[TableRef]:
    """The tables one clause of `ALTER TABLE table` changes the rows or columns of: none, `table`, or `table` and the
    table a partition is exchanged with (or converted to)."""
    word, then = sc.upper(), sc.upper(1)
    if word == "ADD":
        sc.take()
        if sc.upper() == "CONSTRAINT":  # ADD CONSTRAINT [name] PRIMARY KEY | UNIQUE | FOREIGN KEY | CHECK
            return {table} if any(t.upper == "PRIMARY" for t in sc.tokens[sc.i : sc.i + 3]) else set()
        return set() if sc.upper() in _KEEPS_ROWS_ADDED else {table}  # a column or the primary key
    if word == "DROP":
        sc.take()
        if sc.upper() == "CONSTRAINT":  # MySQL: DROP CONSTRAINT name; its primary key is named PRIMARY
            sc.take()
            sc.accept("IF", "EXISTS")
            name = sc.peek()
            return {table} if name is not None and name.name.upper() == "PRIMARY" else set()
        if sc.upper() == "PARTITION":  # its rows go
            return {table}
        return set() if sc.upper() in _KEEPS_ROWS_DROPPED else {table}  # a column or the primary key
    if word == "ALTER":  # ALTER [COLUMN] c SET DEFAULT …, ALTER INDEX … VISIBLE, ALTER CHECK …
        sc.take()
        if sc.upper() in ("INDEX", "KEY", "CHECK", "CONSTRAINT"):
            return set()
        sc.accept("COLUMN")
        sc.take()  # the column
        return set() if sc.upper() in ("SET", "DROP") and sc.upper(1) == "DEFAULT" else {table}
    if word == "RENAME":
        sc.take()
        if sc.upper() in ("INDEX", "KEY"):
            return set()
        if sc.upper() == "COLUMN":
            return {table}
        sc.accept("TO") or sc.accept("AS")
        return {table, sc.table(schema)}
    if word in ("TRUNCATE", "EXCHANGE", "CONVERT") and then == "PARTITION":
        sc.take(), sc.take()
        sc.identifier()
        if sc.accept("WITH", "TABLE") or sc.accept("TO", "TABLE"):  # its rows move to or from that table
            return {table, sc.table(schema)}
        return {table}
    if word == "CONVERT" and then == "TABLE":  # MariaDB: CONVERT TABLE t2 TO PARTITION p: t2's rows move in
        sc.take(), sc.take()
        return {table, sc.table(schema)}
    if word == "CONVERT":  # CONVERT TO CHARACTER SET: every text column changes
        return {table}
    if word in _KEEPS_ROWS_PARTITIONS and then in ("PARTITION", "PARTITIONING"):
        return set()
    if word in _TABLE_OPTIONS:
        return set()
    return {table}  # MODIFY, CHANGE (a column's definition), and anything not read here


def _renamed_tables(part: _Cursor, schema: str | None) -> list[TableRef]:
    old = part.table(schema)
    part.accept("TO")
    return [old, part.table(schema)]
