"""DDL statements turned into table changes (pure: no server)."""

from __future__ import annotations

import pytest

from cdc_assets.capture.batch_builder import BatchBuilder
from cdc_assets.capture.ddl import DdlParseError, UnknownStoredValue, schema_changes, tokenize
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import Default, TableShape

T = TableRef("shop", "t")
BASE = TableShape(
    T,
    (
        ColumnSpec("id", "int"),
        ColumnSpec("name", "varchar", charset="utf8mb4"),
        ColumnSpec("qty", "smallint"),
    ),
    ("id",),
)


def _one(statement: str, known: dict | None = None):
    changes = schema_changes(statement, "shop", {T: BASE} if known is None else known)
    assert len(changes) == 1, changes
    return changes[0]


def _names(shape: TableShape | None) -> list[str]:
    assert shape is not None
    return [c.name for c in shape.columns]


def test_add_columns_with_position_and_defaults() -> None:
    change = _one(
        "ALTER TABLE t ADD COLUMN price DECIMAL(8,2) NOT NULL DEFAULT '9.5' AFTER id, "
        "ADD c1 INT FIRST, ADD (b BIT(3) DEFAULT b'101', e ENUM('x','y') NOT NULL), "
        "ADD ts TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), ADD g INT AS (qty * 2) VIRTUAL, "
        "ADD u VARCHAR(36) DEFAULT (uuid()), ADD n INT, ADD tm TIME(2) NOT NULL, ADD INDEX ix (qty), ALGORITHM=INPLACE"
    )
    assert change.action == "alter" and change.renames == {}
    assert _names(change.after) == ["c1", "id", "price", "name", "qty", "b", "e", "ts", "g", "u", "n", "tm"]
    assert change.defaults == {
        "price": Default("value", "9.50"),
        "c1": Default("value", None),
        "b": Default("value", "5"),
        "e": Default("value", "x"),  # NOT NULL ENUM: its first member
        "ts": Default("now"),
        "g": Default("unknown"),
        "u": Default("unknown"),
        "n": Default("value", None),
        "tm": Default("value", "00:00:00.00"),
    }
    price = change.after.columns[2]  # type: ignore[union-attr]
    assert (price.type, price.precision, price.scale) == ("decimal", 8, 2)


def test_drop_modify_change_and_rename_columns() -> None:
    change = _one(
        "alter table `shop`.`t` drop column qty, modify name varchar(50) character set latin1 not null, "
        "change column id ident bigint unsigned first, rename column name to label"
    )
    assert _names(change.after) == ["ident", "label"]
    assert change.renames == {"ident": "id", "label": "name"}
    assert change.after.primary_key == ("ident",)  # type: ignore[union-attr]
    assert [(c.type, c.unsigned, c.charset) for c in change.after.columns] == [  # type: ignore[union-attr]
        ("bigint", True, None),
        ("varchar", False, "latin1"),
    ]


def test_primary_key_changes() -> None:
    assert _one("ALTER TABLE t DROP PRIMARY KEY").after.primary_key == ()  # type: ignore[union-attr]
    keyed = _one("ALTER TABLE t DROP PRIMARY KEY, ADD CONSTRAINT pk PRIMARY KEY (name, qty)")
    assert keyed.after.primary_key == ("name", "qty")  # type: ignore[union-attr]


def test_statements_that_change_no_column() -> None:
    for statement in (
        "ALTER TABLE t ADD INDEX ix (qty)",
        "ALTER TABLE t ENGINE=InnoDB",
        "ALTER TABLE t ALTER COLUMN qty SET DEFAULT 3",
        "CREATE INDEX ix ON t (qty)",
        "CREATE VIEW v AS SELECT * FROM t",
        "CREATE TEMPORARY TABLE tmp (x INT)",
        "DROP TABLE IF EXISTS unknown_table",
        "CREATE TABLE IF NOT EXISTS t (x INT)",
    ):
        assert schema_changes(statement, "shop", {T: BASE}) == [], statement


def test_create_table_with_key_options_and_comments() -> None:
    change = _one(
        "/* a comment */ CREATE TABLE IF NOT EXISTS n (`odd ``name` INT UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'x,y', "
        "s SET('a','b') DEFAULT 'b,a', j JSON, bin BINARY(4), p POINT, d DATETIME(3), "
        "PRIMARY KEY (`odd ``name`), UNIQUE KEY u (d)) ENGINE=InnoDB DEFAULT CHARSET=latin1",
        {},
    )
    assert change.action == "create" and change.table == TableRef("shop", "n")
    assert _names(change.after) == ["odd `name", "s", "j", "bin", "p", "d"]
    assert change.after.primary_key == ("odd `name",)  # type: ignore[union-attr]
    types = [(c.type, c.charset, c.length, c.fsp, c.members) for c in change.after.columns]  # type: ignore[union-attr]
    assert types == [
        ("int", None, None, 0, ()),
        ("set", "latin1", None, 0, ("a", "b")),
        ("json", "binary", None, 0, ()),
        ("binary", None, 4, 0, ()),
        ("geometry", None, None, 0, ()),
        ("datetime", None, None, 3, ()),
    ]


def test_create_like_select_and_or_replace() -> None:
    like = _one("CREATE TABLE copy LIKE t")
    assert like.after is not None and like.after.columns == BASE.columns and like.after.table.table == "copy"
    assert _one("CREATE TABLE s AS SELECT * FROM t").after is None  # the row events tell its shape
    replaced = schema_changes("CREATE OR REPLACE TABLE t (a INT)", "shop", {T: BASE})
    assert [c.action for c in replaced] == ["drop", "create"]


def test_drop_rename_and_drop_database() -> None:
    other = TableRef("shop", "u")
    known = {T: BASE, other: TableShape(other, BASE.columns, ())}
    dropped = schema_changes("DROP TABLE IF EXISTS `t`, shop.u /* generated by server */", "x", {**known, TableRef("x", "t"): BASE})
    assert [(c.action, str(c.table)) for c in dropped] == [("drop", "x.t"), ("drop", "shop.u")]
    chain = schema_changes("RENAME TABLE t TO t2, t2 TO t3", "shop", known)
    assert [(c.action, c.table.table, c.renamed_from, c.renamed_to) for c in chain] == [
        ("create", "t2", T, None),
        ("drop", "t", None, TableRef("shop", "t2")),
        ("create", "t3", TableRef("shop", "t2"), None),
        ("drop", "t2", None, TableRef("shop", "t3")),
    ]
    assert chain[2].after is not None and chain[2].after.columns == BASE.columns
    renamed = schema_changes("ALTER TABLE t ADD z INT, RENAME TO other_db.t", "shop", known)
    assert [c.action for c in renamed] == ["alter", "create", "drop"]
    assert renamed[1].after is not None and _names(renamed[1].after)[-1] == "z"
    assert {str(c.table) for c in schema_changes("DROP DATABASE shop", None, known)} == {"shop.t", "shop.u"}


def test_errors_and_tokens() -> None:
    with pytest.raises(DdlParseError):
        schema_changes("ALTER TABLE t DROP COLUMN nope", "shop", {T: BASE})
    assert schema_changes("ALTER TABLE t DROP COLUMN IF EXISTS nope", "shop", {T: BASE}) == []
    assert [t.text for t in tokenize("a /*!50100 b */ -- c\n 'x''y'")] == ["a", "b", "'x''y'"]


def test_a_shape_no_statement_explained_becomes_an_alter_of_its_own() -> None:
    builder = BatchBuilder(start=BinlogPosition("f.000001", 4), schemas={T: BASE})
    builder.begin(None)
    builder.version_of(TableShape(T, BASE.columns, BASE.primary_key))
    assert builder.statements == []
    widened = (BASE.columns[0], BASE.columns[1], ColumnSpec("qty", "bigint"))
    builder.version_of(TableShape(T, widened, ("id",)))
    builder.commit(BinlogPosition("f.000001", 100), 1_700_000_000)
    [entry] = builder.statements
    assert entry["kind"] == "ddl" and entry["implicit"] and entry["commit_ts"] == 1_700_000_000
    assert entry["changes"][0]["action"] == "alter"
    assert builder.schemas[T].columns == widened
    # a difference that does not change the Delta columns (a charset, say) is no schema change
    builder.version_of(TableShape(T, (widened[0], ColumnSpec("name", "varchar", charset="latin1"), widened[2]), ("id",)))
    assert len(builder.statements) == 1


def test_a_statement_the_parser_cannot_read_is_recorded_not_fatal() -> None:
    builder = BatchBuilder(start=BinlogPosition("f.000001", 4), schemas={T: BASE})
    builder.statement("shop", "ALTER TABLE t MODIFY")  # cut short: no column
    [entry] = builder.statements
    assert entry["kind"] == "ddl" and "unparsed" in entry and "changes" not in entry
    assert builder.schemas[T] == BASE


def test_members_and_defaults_as_the_server_stores_them() -> None:
    """An ENUM's or SET's members lose their trailing spaces and take the column's charset ('?' for what it cannot
    hold); a DEFAULT names a member as the server's store finds it; a CHAR loses its trailing spaces; the literals
    are read in the connection's charset. As MariaDB 10.11 and MySQL 9.7 store them (test_schema_changes)."""
    change = _one(
        "ALTER TABLE t ADD x ENUM('x ','a') NOT NULL, ADD r ENUM('🚀','é') CHARACTER SET latin1 NOT NULL, "
        "ADD u ENUM('😀','é') CHARSET utf8 NOT NULL, ADD k SET('b','a ') DEFAULT 'A,B  ', "
        "ADD w ENUM('É','z') COLLATE latin1_general_ci DEFAULT 'é ', ADD c CHAR(4) DEFAULT 'y  ', "
        "ADD v VARCHAR(4) DEFAULT 'y  ', ADD a CHAR(2) ASCII DEFAULT 'é', ADD q ENUM('ő','a') NOT NULL, "
        "DEFAULT CHARSET latin1"  # the new columns' charset wherever it is named
    )
    members = {c.name: c.members for c in change.after.columns}  # type: ignore[union-attr]
    assert [members[n] for n in ("x", "r", "u", "k", "w", "q")] == [
        ("x", "a"), ("?", "é"), ("?", "é"), ("b", "a"), ("É", "z"), ("?", "a"),
    ]  # fmt: skip
    assert {n: d.text for n, d in change.defaults.items()} == {
        "x": "x", "r": "?", "u": "?", "k": "b,a", "w": "É", "c": "y", "v": "y  ", "a": "é", "q": "?",
    }  # fmt: skip
    charsets = {c.name: c.charset for c in change.after.columns}  # type: ignore[union-attr]
    assert [charsets[n] for n in ("x", "w", "a")] == ["latin1", "latin1", "latin1"]  # the table's, COLLATE's, ASCII's
    # a latin1 connection's text; a binary column's bytes are the connection's
    latin1 = schema_changes("ALTER TABLE t ADD s SET('ñ','🚀') NOT NULL DEFAULT 'ñ', ADD b VARBINARY(2) DEFAULT 'é'",
                            "shop", {T: BASE}, "latin1")[0]  # fmt: skip
    assert latin1.after.columns[-2].members == ("ñ", "?")  # type: ignore[union-attr]
    assert latin1.defaults == {"s": Default("value", "ñ"), "b": Default("value", "6Q==")}  # b'\xe9'


def test_a_value_the_statement_does_not_tell_is_unknown_not_guessed() -> None:
    """An ENUM NOT NULL added without a DEFAULT gives the rows there its first member as the column's charset holds
    it: with a charset the statement does not name (the table's), a member that is not ASCII may be '?' or not.
    The statement names its table, for capture to quarantine; a CREATE TABLE, which has no rows yet, does not."""
    with pytest.raises(UnknownStoredValue, match="column 'q' is added as an ENUM NOT NULL") as raised:
        schema_changes("ALTER TABLE t ADD q ENUM('ő','a') NOT NULL", "shop", {T: BASE})
    assert raised.value.table == T
    for told in ("ADD q ENUM('ő','a') CHARACTER SET utf8mb4 NOT NULL", "ADD q ENUM('o','ő') NOT NULL",
                 "ADD q ENUM('ő','a') NOT NULL DEFAULT 'a'", "ADD q ENUM('ő','a')"):  # fmt: skip
        assert schema_changes(f"ALTER TABLE t {told}", "shop", {T: BASE})[0].defaults["q"].kind == "value", told
    assert _one("CREATE TABLE n (q ENUM('ő','a') NOT NULL)", {}).after.columns[0].members == ("ő", "a")  # type: ignore[union-attr]
    builder = BatchBuilder(start=BinlogPosition("f.000001", 4), schemas={T: BASE})
    builder.statement("shop", "ALTER TABLE t ADD q ENUM('ő','a') NOT NULL")
    assert "column 'q' is added as an ENUM NOT NULL" in builder.quarantined[str(T)]["cause"]
    assert builder.quarantined[str(T)]["fix"].startswith("run `cdc-lakehouse snapshot shop.t`")
