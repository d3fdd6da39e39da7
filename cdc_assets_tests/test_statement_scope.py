"""Which tables a statement changes the rows or columns of, from its tokens (pure: no server)."""

from __future__ import annotations

import pytest

from cdc_assets.capture.statement_scope import NOTHING, ChangedTables, changed_tables
from cdc_assets.core.names import TableRef


def _tables(*names: str) -> ChangedTables:
    return ChangedTables(frozenset(TableRef.parse(n if "." in n else f"shop.{n}") for n in names))


@pytest.mark.parametrize(
    "statement",
    [
        # a foreign key of another table that references it (TPC-C's setup)
        "ALTER TABLE stock1 ADD CONSTRAINT fkey_stock_2_1 FOREIGN KEY(s_i_id) REFERENCES item1(i_id)",
        "ALTER TABLE stock1 ADD FOREIGN KEY (s_i_id) REFERENCES item1 (i_id) ON DELETE CASCADE",
        "ALTER TABLE stock1 DROP FOREIGN KEY fkey_stock_2_1",
        # routines, triggers, views and events whose bodies name it
        "CREATE DEFINER=`root`@`localhost` PROCEDURE promote_employee(IN id INT) BEGIN UPDATE employees "
        "SET title = 'lead' WHERE emp_no = id; END",
        "CREATE DEFINER='root'@'%' FUNCTION f(i INT) RETURNS INT DETERMINISTIC RETURN (SELECT count(*) FROM item1)",
        "CREATE DEFINER=root@localhost TRIGGER t1 AFTER INSERT ON stock1 FOR EACH ROW DELETE FROM item1",
        "CREATE DEFINER=CURRENT_USER() TRIGGER t1 BEFORE UPDATE ON item1 FOR EACH ROW SET NEW.i_price = 0",
        "CREATE OR REPLACE ALGORITHM=UNDEFINED DEFINER=`root`@`localhost` SQL SECURITY DEFINER VIEW v AS "
        "SELECT * FROM item1",
        "CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO TRUNCATE TABLE item1",
        "ALTER DEFINER=`root`@`localhost` EVENT e DO DELETE FROM item1",
        "ALTER ALGORITHM=MERGE VIEW v AS SELECT i_id FROM item1",
        "DROP PROCEDURE IF EXISTS promote_employee",
        "DROP TRIGGER t1",
        "DROP VIEW IF EXISTS v",
        "CREATE AGGREGATE FUNCTION agg(x INT) RETURNS INT BEGIN RETURN 0; END",
        # table maintenance keeps the rows (OPTIMIZE rebuilds the table)
        "REPAIR TABLE dbz_253_table_maintenance_test",
        "REPAIR NO_WRITE_TO_BINLOG TABLE item1 QUICK",
        "OPTIMIZE TABLE item1",
        "OPTIMIZE LOCAL TABLE item1, stock1",
        "ANALYZE TABLE item1 PERSISTENT FOR ALL",
        "ANALYZE TABLE item1 UPDATE HISTOGRAM ON i_price",
        "CHECK TABLE item1 EXTENDED",
        "CHECKSUM TABLE item1",
        # privileges
        "GRANT SELECT, UPDATE ON shop.item1 TO 'app'@'%'",
        "REVOKE ALL ON item1 FROM app",
        # comments, indexes, table options and a rebuild
        "ALTER TABLE item1 COMMENT = 'the items'",
        "ALTER TABLE item1 COMMENT 'the items', ENGINE=InnoDB",
        "ALTER TABLE item1 ENGINE=InnoDB",
        "ALTER TABLE item1 FORCE",
        "ALTER TABLE item1 ROW_FORMAT=DYNAMIC, ALGORITHM=INPLACE, LOCK=NONE",
        "ALTER TABLE item1 AUTO_INCREMENT = 100",
        "ALTER TABLE item1 DEFAULT CHARSET=utf8mb4",
        "ALTER TABLE item1 ADD INDEX ix (i_name), DROP INDEX old, RENAME INDEX a TO b",
        "ALTER TABLE item1 ALTER COLUMN i_price SET DEFAULT 1, ALTER i_name DROP DEFAULT, ALTER INDEX ix INVISIBLE",
        "ALTER TABLE item1 ADD UNIQUE KEY (i_name), ADD CONSTRAINT c CHECK (i_price > 0), DROP CHECK c",
        "ALTER TABLE item1 /*!50100 PARTITION BY HASH (i_id) PARTITIONS 4 */",
        "ALTER TABLE item1 COALESCE PARTITION 2",
        "ALTER TABLE item1 REORGANIZE PARTITION p0 INTO (PARTITION p0 VALUES LESS THAN (10))",
        "ALTER TABLE item1 ADD PARTITION (PARTITION p9 VALUES LESS THAN MAXVALUE)",
        "ALTER TABLE item1 REMOVE PARTITIONING",
        "ALTER TABLE item1",
        "ALTER ONLINE TABLE item1 NOWAIT ADD INDEX (i_name)",
        "CREATE INDEX ix ON item1 (i_name)",
        "CREATE UNIQUE INDEX ix ON item1 (i_name) /* for item1 lookups */",
        "DROP INDEX ix ON item1",
        "CREATE TABLE other (id INT PRIMARY KEY) /* copied from item1 */",
        # objects that hold no table's rows
        "CREATE DATABASE IF NOT EXISTS shop2",
        "ALTER DATABASE shop CHARACTER SET utf8mb4",
        "CREATE TEMPORARY TABLE item1 (id INT)",
        "DROP /*!40005 TEMPORARY */ TABLE IF EXISTS item1",
        "FLUSH TABLES item1",
    ],
)
def test_statements_that_change_no_row_or_column_of_item1(statement: str) -> None:
    scope = changed_tables(statement, "shop")
    assert scope is not None and not scope.covers(TableRef("shop", "item1")), scope


@pytest.mark.parametrize(
    ("statement", "changed"),
    [
        ("ALTER TABLE item1 ADD COLUMN extra INT", _tables("item1")),
        ("ALTER TABLE item1 ADD extra INT AFTER i_id, ADD INDEX (extra)", _tables("item1")),
        ("ALTER TABLE item1 ADD (a INT, b INT)", _tables("item1")),
        ("ALTER TABLE item1 DROP COLUMN i_data", _tables("item1")),
        ("ALTER TABLE item1 DROP i_data", _tables("item1")),
        ("ALTER TABLE item1 MODIFY i_price DECIMAL(6,2) COMMENT 'may change its type: read against its shape'", _tables("item1")),
        ("ALTER TABLE item1 CHANGE i_price price DECIMAL(6,2)", _tables("item1")),
        ("ALTER TABLE item1 RENAME COLUMN i_price TO price", _tables("item1")),
        ("ALTER TABLE item1 ALTER COLUMN i_price SET INVISIBLE", _tables("item1")),
        ("ALTER TABLE item1 ADD PRIMARY KEY (i_id)", _tables("item1")),
        ("ALTER TABLE item1 ADD CONSTRAINT pk PRIMARY KEY (i_id)", _tables("item1")),
        ("ALTER TABLE item1 DROP PRIMARY KEY", _tables("item1")),
        ("ALTER TABLE item1 CONVERT TO CHARACTER SET utf8mb4", _tables("item1")),
        ("ALTER TABLE item1 RENAME TO other.item2", _tables("item1", "other.item2")),
        ("ALTER TABLE item1 ADD SYSTEM VERSIONING", _tables("item1")),
        # partition maintenance that removes or moves rows
        ("ALTER TABLE p TRUNCATE PARTITION p2023", _tables("p")),
        ("ALTER TABLE p DROP PARTITION p2023, p2024", _tables("p")),
        ("ALTER TABLE p EXCHANGE PARTITION p2023 WITH TABLE ex WITHOUT VALIDATION", _tables("p", "ex")),
        ("ALTER TABLE p CONVERT PARTITION p2023 TO TABLE archived", _tables("p", "archived")),
        ("ALTER TABLE p CONVERT TABLE loaded TO PARTITION p2025 VALUES LESS THAN (2026)", _tables("p", "loaded")),
        ("ALTER TABLE p DISCARD PARTITION p2023 TABLESPACE", _tables("p")),
        ("ALTER TABLE p IMPORT TABLESPACE", _tables("p")),
        ("ALTER TABLE m UNION=(a, b)", _tables("m")),
        # tables made, dropped or renamed
        ("CREATE TABLE IF NOT EXISTS `other`.`t` (id INT) /* item1 */", _tables("other.t")),
        ("CREATE OR REPLACE TABLE t AS SELECT * FROM item1", _tables("t")),
        ("CREATE TABLE t LIKE item1", _tables("t")),
        ("DROP TABLE IF EXISTS a, other.b RESTRICT", _tables("a", "other.b")),
        ("DROP TABLE `a` /* generated by server */", _tables("a")),
        ("RENAME TABLE a TO b, other.c TO d", _tables("a", "b", "other.c", "d")),
        ("TRUNCATE TABLE item1", _tables("item1")),
        ("CREATE SEQUENCE s", _tables("s")),
        ("DROP DATABASE shop", ChangedTables(schemas=frozenset({"shop"}))),
    ],
)
def test_statements_that_change_rows_or_columns(statement: str, changed: ChangedTables) -> None:
    assert changed_tables(statement, "shop") == changed


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM item1",  # a MEMORY table emptied at a restart is logged as a statement
        "INSERT INTO item1 VALUES (1)",
        "SET STATEMENT max_statement_time=10 FOR ALTER TABLE item1 ADD COLUMN x INT",
        "ALTER TABLE item1 ADD COLUMN",  # cut short
        "CREATE TABLE item1 (id INT)",  # no default schema: which table is it?
    ],
)
def test_statements_it_cannot_read_count_every_table_they_name(statement: str) -> None:
    default = None if statement.startswith("CREATE TABLE item1") else "shop"
    scope = changed_tables(statement, default)
    assert scope is None or scope.covers(TableRef("shop", "item1")), scope


def test_a_statement_of_nothing_changes_nothing() -> None:
    assert changed_tables("", "shop") == NOTHING
    assert changed_tables("/* only a comment naming item1 */", "shop") == NOTHING
