"""Schema changes mid-stream: current state follows the source, change logs stay readable, every
event is read under the schema in force at its point of the binlog (docs/lakehouse.md: Schema changes)."""

from __future__ import annotations

import json

import pymysql
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY
from cdc_assets.local_source.server import MARIADB
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.history.as_of import table_as_of
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources


def _current(cdc: CdcEnv, table: str) -> list[dict]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table))
    assert rows is not None, f"no current state for {table}"
    return sorted(rows.to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def _columns(cdc: CdcEnv, table: str) -> list[str]:
    dt = open_table(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, table)), None)
    assert dt is not None, f"no current state for {table}"
    return [f.name for f in dt.schema().fields if not f.name.startswith("_cdc_")]


def _log(cdc: CdcEnv, table: str, columns: str) -> list[dict]:
    dt = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)), None)
    assert dt is not None
    return read_query(dt, f"SELECT {columns} FROM changes ORDER BY _cdc_seq", "changes").to_pylist()


def _assert_equal_to_source(cdc: CdcEnv) -> None:
    results = cdc.verify()
    assert results and all(r.ok for r in results), [r.describe() for r in results]


def test_column_changes_in_the_same_batch_as_data(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(10), qty SMALLINT, old_col INT)",
        "INSERT INTO t VALUES (1, 'a', 10, 100), (2, 'b', 20, 200), (3, 'c', 30, 300)",
    )
    assert cdc.sync() == 0
    cdc.execute(
        "INSERT INTO t VALUES (4, 'd', 40, 400)",
        "ALTER TABLE t ADD COLUMN price DECIMAL(8,2) NOT NULL DEFAULT '9.50' AFTER name, "
        "ADD COLUMN note VARCHAR(20) NULL, ADD COLUMN flag TINYINT NOT NULL",
        "UPDATE t SET price = 1.25, note = 'changed' WHERE id = 2",
        "ALTER TABLE t DROP COLUMN old_col",
        "ALTER TABLE t MODIFY qty BIGINT NOT NULL",
        "UPDATE t SET qty = 5000000000 WHERE id = 3",
        "ALTER TABLE t RENAME COLUMN name TO label",
        "INSERT INTO t (id, label, price, qty, flag) VALUES (5, 'e', 2.00, 50, 1)",
        "ALTER TABLE t CHANGE label title VARCHAR(40) FIRST",
        "DELETE FROM t WHERE id = 1",
    )
    assert cdc.sync() == 0
    assert _columns(cdc, "t") == ["title", "id", "price", "qty", "note", "flag"]
    rows = {r["id"]: r for r in _current(cdc, "t")}
    assert sorted(rows) == [2, 3, 4, 5]
    assert rows[4]["title"] == "d" and str(rows[4]["price"]) == "9.50" and rows[4]["flag"] == 0  # defaults
    assert rows[3]["qty"] == 5_000_000_000 and rows[2]["note"] == "changed"
    _assert_equal_to_source(cdc)

    log = _log(cdc, "t", "_cdc_op, _cdc_ddl")
    ddl = [json.loads(r["_cdc_ddl"]) for r in log if r["_cdc_op"] == "alter"]
    assert [d["renames"] for d in ddl[-2:]] == [{"label": "name"}, {"title": "label"}]
    # every version stays readable: the old names and the dropped column keep their values
    history = _log(cdc, "t", "id, name, label, title, old_col, qty, _cdc_op")
    assert {"id": 1, "name": "a", "label": None, "title": None, "old_col": 100, "qty": 10, "_cdc_op": "insert"} in history
    assert any(r["title"] is None and r["label"] == "e" and r["_cdc_op"] == "insert" for r in history)


def test_alter_alone_reaches_current_state_without_later_rows(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE t ADD COLUMN created DATE NOT NULL DEFAULT '2024-02-29', MODIFY v VARCHAR(12)")
    assert cdc.sync() == 0
    assert _columns(cdc, "t") == ["id", "v", "created"]
    assert [(r["v"], str(r["created"])) for r in _current(cdc, "t")] == [("1", "2024-02-29"), ("2", "2024-02-29")]
    _assert_equal_to_source(cdc)


def test_create_drop_and_rename_tables(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(5))",
        "INSERT INTO a VALUES (1, 'x'), (2, 'y')",
        "CREATE TABLE gone (id INT PRIMARY KEY)",
        "INSERT INTO gone VALUES (1)",
    )
    assert cdc.sync() == 0
    cdc.execute(
        "UPDATE a SET v = 'X' WHERE id = 1",
        "RENAME TABLE a TO b",
        "INSERT INTO b VALUES (3, 'z')",
        "CREATE TABLE empty_one (id BIGINT UNSIGNED PRIMARY KEY, d DATETIME(3))",
        "DROP TABLE gone",
        "CREATE TABLE c (k VARCHAR(3) PRIMARY KEY)",
        "INSERT INTO c VALUES ('p')",
        "ALTER TABLE c RENAME TO d",
        "INSERT INTO d VALUES ('q')",
    )
    assert cdc.sync() == 0
    house = cdc.lakehouse
    tables = {str(t) for t in house.tables(CURRENT)}
    db = cdc.database
    assert tables == {f"{db}.b", f"{db}.empty_one", f"{db}.d"}
    assert [(r["id"], r["v"]) for r in _current(cdc, "b")] == [(1, "X"), (2, "y"), (3, "z")]
    assert _current(cdc, "empty_one") == [] and _columns(cdc, "empty_one") == ["id", "d"]
    assert [r["k"] for r in _current(cdc, "d")] == ["p", "q"]
    assert [r["_cdc_op"] for r in _log(cdc, "gone", "_cdc_op")] == ["create", "insert", "drop"]
    assert [r["_cdc_op"] for r in _log(cdc, "a", "_cdc_op")][-1] == "drop"
    _assert_equal_to_source(cdc)

    # a table dropped and created again under the same name starts from nothing
    cdc.execute("DROP TABLE b", "CREATE TABLE b (id INT PRIMARY KEY, w INT)", "INSERT INTO b VALUES (7, 70)")
    assert cdc.sync() == 0
    assert [(r["id"], r["w"]) for r in _current(cdc, "b")] == [(7, 70)]
    _assert_equal_to_source(cdc)


def test_primary_key_added_and_dropped(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE k (id INT NOT NULL, v INT)", "INSERT INTO k VALUES (1, 1), (2, 2)")
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE k ADD PRIMARY KEY (id)", "UPDATE k SET v = 20 WHERE id = 2")
    assert cdc.sync() == 0
    assert "_cdc_dup" not in [f.name for f in open_table(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "k")), None).schema().fields]
    cdc.execute("ALTER TABLE k DROP PRIMARY KEY", "INSERT INTO k VALUES (2, 20)")
    assert cdc.sync() == 0
    assert [(r["id"], r["v"]) for r in _current(cdc, "k")] == [(1, 1), (2, 20), (2, 20)]
    _assert_equal_to_source(cdc)


def test_added_columns_of_every_kind_take_their_defaults_in_existing_rows(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    assert cdc.sync() == 0
    cdc.execute(
        "ALTER TABLE t ADD COLUMN i INT UNSIGNED NOT NULL DEFAULT 4294967295, ADD b BIT(5) DEFAULT b'10101', "
        "ADD bl BOOL NOT NULL DEFAULT TRUE, ADD d DECIMAL(30,10) DEFAULT -12.5, ADD f DOUBLE DEFAULT 1e300, "
        "ADD dt DATETIME(6) DEFAULT '2038-01-19 03:14:08.123456', ADD dd DATE NOT NULL DEFAULT '1000-01-01', "
        "ADD tm TIME(3) DEFAULT '-838:59:59', ADD y YEAR DEFAULT 2155, ADD e ENUM('a','😀') NOT NULL, "
        "ADD e2 ENUM('a','😀') DEFAULT '😀', ADD s SET('x','y','z') DEFAULT 'z,x', ADD s0 SET('x') NOT NULL, "
        "ADD v VARCHAR(10) CHARACTER SET latin1 DEFAULT 'café', ADD bn BINARY(4) DEFAULT 'ab', "
        "ADD vb VARBINARY(4) NOT NULL, ADD ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, "
        "ADD n INT NULL, ADD tx TEXT",
    )
    cdc.execute("INSERT INTO t (id, e, s0, vb) VALUES (3, '😀', 'x', 'q')")
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)


def test_ddl_literals_fill_existing_rows_as_the_server_stores_them(cdc: CdcEnv) -> None:
    """A statement was read as UTF-8 whatever its client's charset, and ENUM/SET members and defaults as the DDL
    spelled them: a latin1 connection's 'é' filled the rows already there with 'xe9', a UTF-8 client behind SET NAMES
    latin1 with 'é' where the source holds 'Ã©', a member's trailing space and a character its column's charset cannot
    hold ('?' at the source) as written. Every row here gets no row event after the ALTERs that fill it."""
    cdc.execute("CREATE TABLE d (id INT PRIMARY KEY)", "INSERT INTO d VALUES (1), (2)")
    latin1 = pymysql.connect(
        unix_socket=str(cdc.server.socket_path), user="root", password="", database=cdc.database, charset="latin1",
        autocommit=True,
    )  # fmt: skip
    with latin1, latin1.cursor() as cur:
        cur.execute(
            "ALTER TABLE d ADD COLUMN e ENUM('é','a') CHARACTER SET latin1 NOT NULL, "
            "ADD COLUMN s SET('ñ','b') CHARACTER SET latin1 DEFAULT 'ñ', ADD COLUMN `naïve` VARCHAR(5) DEFAULT 'Ø ', "
            "ADD COLUMN vb VARBINARY(2) DEFAULT 'é'"
        )
        utf8 = "ALTER TABLE d ADD m ENUM('é','a') CHARACTER SET utf8mb4 NOT NULL, ADD n CHAR(3) DEFAULT 'ü'"
        latin1.query(utf8.encode())  # a UTF-8 client behind SET NAMES latin1
        # the server logs its own CREATE TABLE for a CREATE … SELECT, in UTF-8 whatever the client's charset
        cur.execute("CREATE TABLE ctas (`é` INT, e ENUM('ñ','a') CHARACTER SET latin1) SELECT 1 AS k FROM DUAL WHERE 0")
    cdc.execute(
        "ALTER TABLE d ADD COLUMN x ENUM('x ','a') NOT NULL, ADD COLUMN r ENUM('🚀','a') CHARACTER SET latin1 NOT NULL, "
        "ADD COLUMN u ENUM('😀 ','é') CHARACTER SET utf8mb3 NOT NULL, ADD COLUMN k SET('b','a ') DEFAULT 'A,B  ', "
        "ADD COLUMN w ENUM('É','z') COLLATE utf8mb4_unicode_ci DEFAULT 'é ', ADD COLUMN c CHAR(4) DEFAULT 'y  ', "
        "ADD COLUMN v VARCHAR(4) DEFAULT 'y  ', ADD COLUMN bn VARBINARY(4) DEFAULT 'é'",
        "ALTER TABLE d ADD COLUMN q ENUM('ő  ','a') NOT NULL, DEFAULT CHARSET latin1",  # named after the column
    )
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM d ORDER BY id")
        names = [c[0] for c in cur.description]
        source = [tuple(_text(v) for v in row) for row in cur.fetchall()]
    assert _columns(cdc, "d") == names
    assert [tuple(_text(r[n]) for n in names) for r in _current(cdc, "d")] == source
    assert source[0][1:] == ("é", "ñ", "Ø ", b"\xe9", "Ã©", "Ã¼", "x", "?", "?", "b,a", "É", "y", "y  ", b"\xc3\xa9", "?")  # fmt: skip


def _text(value: object) -> object:
    """A value as text (bytes and NULL as they are), to compare rows whatever each side's types."""
    return value if value is None or isinstance(value, bytes) else str(value)


def test_many_small_batches_and_syncs_between_schema_changes(cdc: CdcEnv, monkeypatch) -> None:
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "1")
    cdc.execute("CREATE TABLE p (id INT PRIMARY KEY, a INT)", "CREATE TABLE q (id INT, v VARCHAR(5))")
    steps = [
        ["INSERT INTO p VALUES (1, 1), (2, 2)", "INSERT INTO q VALUES (1, 'x'), (1, 'x')"],
        ["ALTER TABLE p ADD b VARCHAR(5) DEFAULT 'bb'", "UPDATE p SET a = 10 WHERE id = 1"],
        ["ALTER TABLE q ADD w INT NOT NULL DEFAULT 3, DROP COLUMN v", "DELETE FROM q LIMIT 1"],
        ["ALTER TABLE p MODIFY a BIGINT", "INSERT INTO p VALUES (3, 3000000000, 'c')"],
        ["RENAME TABLE p TO p_old, q TO p", "INSERT INTO p VALUES (9, 9)"],
        ["ALTER TABLE p_old RENAME COLUMN b TO bee", "UPDATE p_old SET bee = 'B' WHERE id = 2"],
    ]
    for statements in steps:
        cdc.execute(*statements)
        assert cdc.sync() == 0
        _assert_equal_to_source(cdc)
    assert [(r["id"], r["w"]) for r in _current(cdc, "p")] == [(1, 3), (9, 9)]
    assert _columns(cdc, "p_old") == ["id", "a", "bee"]


def test_all_changes_in_one_sync_with_one_row_batches(cdc: CdcEnv, monkeypatch) -> None:
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "1")
    cdc.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE b (id INT PRIMARY KEY, w VARCHAR(3))",
        "INSERT INTO a VALUES (1, 1), (2, 2)",
        "INSERT INTO b VALUES (1, 'b1')",
        "RENAME TABLE a TO tmp, b TO a, tmp TO b",  # swap
        "INSERT INTO a VALUES (2, 'a2')",
        "INSERT INTO b VALUES (3, 3)",
        "CREATE TABLE c LIKE b",
        "INSERT INTO c SELECT * FROM b",
        "CREATE TABLE d AS SELECT id, v * 2 AS v2 FROM b",
        "ALTER TABLE d ADD PRIMARY KEY (id), ADD z INT DEFAULT 1",
    )
    assert cdc.sync() == 0
    assert [(r["id"], r["w"]) for r in _current(cdc, "a")] == [(1, "b1"), (2, "a2")]
    assert [(r["id"], r["v"]) for r in _current(cdc, "b")] == [(1, 1), (2, 2), (3, 3)]
    assert [(r["id"], r["v2"], r["z"]) for r in _current(cdc, "d")] == [(1, 2, 1), (2, 4, 1), (3, 6, 1)]
    assert "tmp" not in {t.table for t in cdc.lakehouse.tables(CURRENT)}
    _assert_equal_to_source(cdc)


@pytest.mark.lakehouse_side  # S3's side: the source's is the local variant's, on both
def test_schema_changes_on_s3(cdc: CdcEnv, monkeypatch, s3_endpoint: str) -> None:
    import boto3

    from cdc_assets_tests.conftest import use_s3

    use_s3(monkeypatch, s3_endpoint)
    boto3.client("s3").create_bucket(Bucket="ddl")
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://ddl/{cdc.database}")  # a prefix of its own per flavour
    cdc.execute("CREATE TABLE a (id INT PRIMARY KEY, v INT)", "INSERT INTO a VALUES (1, 1)", "CREATE TABLE x (id INT)")
    cdc.execute("INSERT INTO x VALUES (5)")
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE a ADD w INT DEFAULT 7", "RENAME TABLE a TO b", "DROP TABLE x", "INSERT INTO b VALUES (2, 2, 2)")
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ddl", Prefix=f"{cdc.database}/current/")["Contents"]]
    assert {k.split("/")[3] for k in keys} == {"b"}  # a and x are gone from current state, nothing left behind
    assert any(k.startswith(f"{cdc.database}/_state/schemas/") for k in [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ddl", Prefix=f"{cdc.database}/_state/")["Contents"]])


def test_snapshot_table_altered_before_its_first_row_change(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE s (id INT PRIMARY KEY, v INT)", "INSERT INTO s VALUES (1, 10), (2, 20)")
    from cdc_assets.cli import main

    assert main(["snapshot"]) == 0
    cdc.execute("ALTER TABLE s ADD note VARCHAR(5) NOT NULL DEFAULT 'n', DROP COLUMN v")
    assert cdc.sync() == 0
    assert [(r["id"], r["note"]) for r in _current(cdc, "s")] == [(1, "n"), (2, "n")]
    _assert_equal_to_source(cdc)


def test_a_transaction_larger_than_a_spark_job_and_a_merge_is_taken_in_parts(cdc: CdcEnv, monkeypatch) -> None:
    """Item 5 at a small scale: one transaction larger than what capture keeps in memory, than one Spark
    job of the change-log stage and than one merge of the current-state stage."""
    from cdc_assets.stages.changes import run as changes
    from cdc_assets.stages.current import apply as current_state

    monkeypatch.setattr(changes, "MAX_ROWS_PER_ARROW_JOB", 7)
    monkeypatch.setattr(current_state, "MAX_CHANGES_PER_MERGE", 5)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "4")
    cdc.execute("CREATE TABLE h (id INT PRIMARY KEY, v INT)", "CREATE TABLE k (v INT)")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.executemany("INSERT INTO h VALUES (%s, %s)", [(i, i) for i in range(40)])
        cur.executemany("INSERT INTO k VALUES (%s)", [(i % 3,) for i in range(12)])
        cur.execute("COMMIT")
    cdc.execute(
        "ALTER TABLE h ADD w INT NOT NULL DEFAULT 5",
        "UPDATE h SET v = v * 10, w = id WHERE id % 2 = 0",  # one transaction of 20 changes
        "UPDATE h SET id = id + 100 WHERE id < 6",  # key changes
        "DELETE FROM k WHERE v = 1 LIMIT 3",
    )
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    cdc.execute("UPDATE h SET w = w + 1", "TRUNCATE h", "INSERT INTO h VALUES (1, 1, 1), (2, 2, 2)", "UPDATE k SET v = 7")
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    assert len(_current(cdc, "h")) == 2
    appends = [c for c in open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "h")), None).history()
               if c.get("operation") == "WRITE"]
    assert len(appends) > 3  # the 40-row transaction went in several slices


def _bytes(value: object) -> object:
    return value.encode() if isinstance(value, str) else value


def _history_follows(cdc: CdcEnv, table: str, key: str) -> list[dict]:
    """The table's history, once found to follow current state: each key's versions one after another (none
    overlaps the next), the last one open and equal to its current row. Text is compared as its UTF-8 bytes: a
    history column that held text and binary holds both as bytes."""
    history = cdc.lakehouse.open(HISTORY, TableRef(cdc.database, table))
    assert history is not None
    versions = read_query(history, "SELECT * FROM history ORDER BY _cdc_valid_from_seq", "history").to_pylist()
    current = _current(cdc, table)
    names = [n for n in current[0] if not n.startswith("_cdc_")]
    chains: dict = {}
    for version in versions:
        chains.setdefault(_bytes(version[key]), []).append(version)
    for chain in chains.values():
        for earlier, later in zip(chain, chain[1:], strict=False):
            assert earlier["_cdc_valid_to_seq"] is not None and earlier["_cdc_valid_to_seq"] <= later["_cdc_valid_from_seq"], chain
    open_rows = {k: {n: _bytes(c[-1][n]) for n in names} for k, c in chains.items() if c[-1]["_cdc_is_current"]}
    assert open_rows == {_bytes(r[key]): {n: _bytes(r[n]) for n in names} for r in current}
    return versions


def test_a_column_changed_between_text_and_binary_keeps_every_byte(cdc: CdcEnv, monkeypatch) -> None:
    """MODIFY between a text type and a binary type, both ways: no value loses a byte in the change log, current
    state or history, before or after the ALTER (the change log's column fell back to text, so bytes that are not
    UTF-8 came out as replacement characters, and current state's conversion at the ALTER failed on them). A key
    column's change keeps one open version per key in the history. The ALTER's run is on Spark on MariaDB and on
    Arrow on MySQL: each engine converts once, and the stages see the same raw batches from either source."""
    spark = cdc.server.flavour == MARIADB
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.*")
    cdc.execute(
        "CREATE TABLE tb (id INT PRIMARY KEY, s VARCHAR(20), l VARCHAR(20) CHARACTER SET latin1, tx TEXT, b BLOB, "
        "vb VARBINARY(20))",
        "INSERT INTO tb VALUES (1, 'héllo ✅', 'café', 'text', X'FF00FE', X'E29C85'), "
        "(2, 'two', 'ÿ', 'deux', X'C3A9', X'FF00FE')",  # b: the UTF-8 of é, but Ã© in latin1
        "CREATE TABLE pk (k VARCHAR(10) PRIMARY KEY, v INT)",
        "INSERT INTO pk VALUES ('a', 1), ('b', 2)",
    )
    assert cdc.sync() == 0
    if spark:  # the ALTER's run on Spark: its tasks rewrite the change log and reshape current state
        monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")
    cdc.execute(
        "UPDATE tb SET vb = X'6F6B' WHERE id = 2",  # strict mode refuses a VARCHAR of bytes that are not UTF-8
        "ALTER TABLE tb MODIFY s VARBINARY(20), MODIFY l VARBINARY(20), MODIFY tx BLOB, "
        "MODIFY b TEXT CHARACTER SET latin1, MODIFY vb VARCHAR(20)",
        "INSERT INTO tb VALUES (3, X'FF00FE', X'FF00FE', X'FF00FE', 'ÿ€ after', 'naïve ✅')",
        "UPDATE tb SET s = X'00FF', tx = X'80', b = 'þ' WHERE id = 1",
        "UPDATE pk SET v = 5 WHERE k = 'b'",  # read at the log's new type, it must still close b's version
        "ALTER TABLE pk MODIFY k VARBINARY(10)",
        "UPDATE pk SET v = 10 WHERE k = 'a'",
        "INSERT INTO pk VALUES (X'FF', 3)",
    )
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)

    # the change log: every value as written, text as its UTF-8 bytes in a column that holds bytes of both kinds
    log = [r for r in _log(cdc, "tb", "*") if r["_cdc_op"] in ("insert", "update")]
    names = ["id", "s", "l", "tx", "b", "vb"]
    utf8 = str.encode
    assert [[r[n] for n in names] for r in log] == [
        [1, utf8("héllo ✅"), utf8("café"), b"text", b"\xff\x00\xfe", b"\xe2\x9c\x85"],
        [2, b"two", utf8("ÿ"), b"deux", b"\xc3\xa9", b"\xff\x00\xfe"],
        [2, b"two", utf8("ÿ"), b"deux", b"\xc3\xa9", b"ok"],
        [3, b"\xff\x00\xfe", b"\xff\x00\xfe", b"\xff\x00\xfe", utf8("ÿ€ after"), utf8("naïve ✅")],
        [1, b"\x00\xff", b"caf\xe9", b"\x80", utf8("þ"), utf8("✅")],
    ]
    assert log[2]["_cdc_before"]["vb"] == b"\xff\x00\xfe" and log[4]["_cdc_before"]["s"] == utf8("héllo ✅")
    if spark:
        written = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "tb")), None).file_uris()
        assert all("zstd" in p for p in written)  # every file of the rewritten log is a Spark task's

    # current state: the ALTER's conversions in each column's charset (latin1's é is one byte; X'C3A9' is Ã© there)
    current = {r["id"]: r for r in _current(cdc, "tb")}
    assert current[1]["l"] == b"caf\xe9" and current[2]["b"] == "Ã©"
    # the history follows current state, and the versions before the ALTER keep their bytes
    versions = _history_follows(cdc, "tb", "id")
    first = {r["id"]: r for r in reversed(versions)}  # each key's first version
    assert [first[1]["b"], first[2]["vb"], first[1]["s"]] == [b"\xff\x00\xfe", b"\xff\x00\xfe", utf8("héllo ✅")]
    # read as of the point before the ALTER, from the history and from the change log: each value at its type then
    for from_history in (True, False):
        then = table_as_of(cdc.lakehouse, f"{cdc.database}.tb", at_seq=log[2]["_cdc_seq"], from_history=from_history)
        assert [[r[n] for n in names] for r in then.to_pylist()] == [
            [1, "héllo ✅", "café", "text", b"\xff\x00\xfe", b"\xe2\x9c\x85"],
            [2, "two", "ÿ", "deux", b"\xc3\xa9", b"ok"],
        ]
    keys = _history_follows(cdc, "pk", "k")
    assert [(r["k"], r["v"]) for r in keys if r["_cdc_valid_to_seq"] is None] == [(b"b", 5), (b"a", 10), (b"\xff", 3)]
