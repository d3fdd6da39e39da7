"""End to end against the real parts: MariaDB binlog -> raw batches -> change logs -> current state."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import threading
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pymysql
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.raw_batches import list_batches, read_manifest, read_rows
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.local_source import Workload, load_sample_schema
from cdc_assets.stages.current.apply import read_current
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

# Row changes only: CREATE TABLE and other schema changes have change-log rows of their own (test_schema_changes).
ROW_CHANGES = "_cdc_op IN ('insert', 'update', 'delete')"

def _sample(cdc: CdcEnv, monkeypatch, transactions: int, seed: int = 1) -> Workload:
    shop, inventory = f"{cdc.database}_shop", f"{cdc.database}_inventory"
    monkeypatch.setenv("CDC_TABLES", f"{shop}.*,{inventory}.*")
    with cdc.server.admin_connection(autocommit=False) as conn:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{shop}`")
            cur.execute(f"DROP DATABASE IF EXISTS `{inventory}`")
        load_sample_schema(conn, shop, inventory)
        workload = Workload(conn, seed=seed, shop=shop, inventory=inventory)
        workload.seed()
        workload.run(transactions)
    return workload


def _run_workload(cdc: CdcEnv, transactions: int, seed: int) -> None:
    shop, inventory = f"{cdc.database}_shop", f"{cdc.database}_inventory"
    with cdc.server.admin_connection(autocommit=False) as conn:
        Workload(conn, seed=seed, shop=shop, inventory=inventory).run(transactions)


def _assert_all_equal(cdc: CdcEnv, expected_tables: int) -> None:
    diffs = cdc.verify()
    assert len(diffs) == expected_tables
    assert [d.describe() for d in diffs if not d.ok] == []
    assert all(d.source_rows == d.lakehouse_rows for d in diffs)


def _all_change_seqs(cdc: CdcEnv) -> list[int]:
    seqs: list[int] = []
    for table in cdc.lakehouse.tables(CHANGES):
        log = open_table(cdc.lakehouse.table_uri(CHANGES, table), None)
        seqs += read_query(log, f"SELECT _cdc_seq FROM changes WHERE {ROW_CHANGES}", "changes").column(0).to_pylist()
    return sorted(seqs)


def _raw_seqs(cdc: CdcEnv) -> list[int]:
    store = cdc.lakehouse.store
    seqs: list[int] = []
    for name in list_batches(store):
        seqs += read_rows(store, read_manifest(store, name)).column("seq").to_pylist()
    return sorted(seqs)


def test_workload_catch_up_then_more_changes_then_nothing(cdc: CdcEnv, monkeypatch) -> None:
    _sample(cdc, monkeypatch, transactions=300)
    assert cdc.sync() == 0
    _assert_all_equal(cdc, expected_tables=6)

    _run_workload(cdc, transactions=300, seed=7)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "200")  # several batches, cut only at transaction boundaries
    assert cdc.sync() == 0
    _assert_all_equal(cdc, expected_tables=6)
    assert batch_chain_breaks(cdc.lakehouse) == []
    assert duplicate_seqs(cdc.lakehouse) == {}
    assert _all_change_seqs(cdc) == _raw_seqs(cdc)

    # A sync with no new source changes changes nothing: no batch, no Delta commit.
    store = cdc.lakehouse.store
    batches_before = list_batches(store)
    checkpoint_before = load_checkpoint(store)
    versions_before = {
        str(t): open_table(cdc.lakehouse.table_uri(CHANGES, t), None).version() for t in cdc.lakehouse.tables(CHANGES)
    }
    assert cdc.sync() == 0
    assert list_batches(store) == batches_before
    checkpoint_after = load_checkpoint(store)
    assert checkpoint_after.position == checkpoint_before.position and checkpoint_after.next_seq == checkpoint_before.next_seq
    assert checkpoint_after.reached_at > checkpoint_before.reached_at  # only when capture last had everything moves
    versions_after = {
        str(t): open_table(cdc.lakehouse.table_uri(CHANGES, t), None).version() for t in cdc.lakehouse.tables(CHANGES)
    }
    assert versions_after == versions_before
    _assert_all_equal(cdc, expected_tables=6)


def test_batches_end_at_transaction_boundaries(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    with cdc.admin() as conn, conn.cursor() as cur:
        for txn in range(10):  # ten transactions of 7 rows each
            cur.execute("BEGIN")
            cur.executemany("INSERT INTO t VALUES (%s, %s)", [(txn * 7 + i, i) for i in range(7)])
            cur.execute("COMMIT")
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "10")
    assert cdc.sync() == 0
    store = cdc.lakehouse.store
    manifests = [read_manifest(store, n) for n in list_batches(store)]
    with_rows = [m for m in manifests if m.rows]
    # 10 rows is reached inside the second transaction: each batch holds exactly two whole transactions.
    assert [m.rows for m in with_rows] == [14, 14, 14, 14, 14]
    assert all(m.transactions == 2 for m in with_rows)
    assert batch_chain_breaks(cdc.lakehouse) == []
    _assert_all_equal(cdc, expected_tables=1)


def test_values_survive_exactly(cdc: CdcEnv) -> None:
    # TIME's greatest value: MariaDB allows a fraction on 838:59:59, MySQL does not
    time_max = "838:59:59.500000" if cdc.server.flavour == "mariadb" else "838:59:59.000000"
    cdc.execute(
        """CREATE TABLE v (
            id INT PRIMARY KEY,
            ti TINYINT, si SMALLINT, mi MEDIUMINT, i INT, bi BIGINT,
            tiu TINYINT UNSIGNED, siu SMALLINT UNSIGNED, miu MEDIUMINT UNSIGNED, iu INT UNSIGNED,
            biu BIGINT UNSIGNED,
            d DECIMAL(12,4), dw DECIMAL(38,10),
            dt6 DATETIME(6), ts TIMESTAMP(6) NULL, da DATE, tm TIME, tm6 TIME(6),
            vc VARCHAR(100), tx TEXT, bl BLOB, vb VARBINARY(16)
        ) CHARACTER SET utf8mb4"""
    )
    row = (
        1, -128, -32768, -8388608, -2147483648, -9223372036854775808,
        255, 65535, 16777215, 4294967295, 18446744073709551615,
        "-12345678.1234", "1234567890123456789012345678.0123456789",
        "2024-02-29 23:59:59.999999", "2038-01-19 03:14:07.654321", "1000-01-01", "-12:30:00", time_max,
        "naïve café 🚀👩🏽‍💻", "Zürich 東京 🎉" * 50, b"\x00\xff\x10binary\x00", b"",
    )  # fmt: skip
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"INSERT INTO v VALUES ({','.join(['%s'] * len(row))})", row)
        cur.execute("INSERT INTO v (id) VALUES (2)")  # every other column NULL
    assert cdc.sync() == 0

    current = read_current(cdc.lakehouse, TableRef(cdc.database, "v"))
    assert current is not None
    by_id = {r["id"]: r for r in current.to_pylist()}
    one = by_id[1]
    assert (one["ti"], one["si"], one["mi"], one["i"], one["bi"]) == row[1:6]
    assert (one["tiu"], one["siu"], one["miu"], one["iu"]) == row[6:10]
    assert one["biu"] == Decimal("18446744073709551615")
    assert one["d"] == Decimal("-12345678.1234")
    assert one["dw"] == Decimal("1234567890123456789012345678.0123456789")
    assert one["dt6"] == dt.datetime(2024, 2, 29, 23, 59, 59, 999999)
    assert one["ts"] == dt.datetime(2038, 1, 19, 3, 14, 7, 654321, tzinfo=dt.UTC)
    assert one["da"] == dt.date(1000, 1, 1)
    assert one["tm"] == "-12:30:00"
    assert one["tm6"] == time_max
    assert one["vc"] == "naïve café 🚀👩🏽‍💻"
    assert one["tx"] == "Zürich 東京 🎉" * 50
    assert one["bl"] == b"\x00\xff\x10binary\x00"
    assert one["vb"] == b""
    two = by_id[2]
    assert all(two[c] is None for c in two if c not in ("id", "_cdc_seq", "_cdc_commit_ts"))

    schema = current.schema
    expected_types = {
        "ti": pa.int8(), "si": pa.int16(), "mi": pa.int32(), "i": pa.int32(), "bi": pa.int64(),
        "tiu": pa.int16(), "siu": pa.int32(), "miu": pa.int64(), "iu": pa.int64(), "biu": pa.decimal128(20, 0),
        "d": pa.decimal128(12, 4), "dw": pa.decimal128(38, 10), "dt6": pa.timestamp("us"),
        "ts": pa.timestamp("us", tz="UTC"), "da": pa.date32(), "tm": pa.string(), "vc": pa.string(),
        "bl": pa.binary(), "_cdc_seq": pa.int64(), "_cdc_commit_ts": pa.timestamp("us", tz="UTC"),
    }  # fmt: skip
    assert {name: schema.field(name).type for name in expected_types} == expected_types
    source_columns = [c for c in schema.names if not c.startswith("_cdc_")]
    assert source_columns == ["id", "ti", "si", "mi", "i", "bi", "tiu", "siu", "miu", "iu", "biu", "d", "dw", "dt6",
                              "ts", "da", "tm", "tm6", "vc", "tx", "bl", "vb"]  # fmt: skip
    _assert_all_equal(cdc, expected_tables=1)


def test_time_year_and_zero_timestamp_edges(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE e (id INT PRIMARY KEY, t2 TIME(2), t6 TIME(6), y YEAR, ts TIMESTAMP NULL)")
    rows = [
        (1, "-12:30:00.01", "-00:00:00.000001", 0, "0000-00-00 00:00:00"),
        (2, "-838:59:59.99", "-10:00:00.999999", 2155, "2038-01-19 03:14:07"),
        (3, "838:59:59.99", "00:00:00.5", 1901, "1970-01-01 00:00:01"),
    ]
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET sql_mode = '', time_zone = '+00:00'")
        cur.executemany("INSERT INTO e VALUES (%s, %s, %s, %s, %s)", rows)
    assert cdc.sync() == 0
    current = {r["id"]: r for r in read_current(cdc.lakehouse, TableRef(cdc.database, "e")).to_pylist()}
    # TIME's extremes with a fraction: MariaDB keeps it, MySQL clamps to 838:59:59.00 (sql_mode '')
    extreme = "838:59:59.99" if cdc.server.flavour == "mariadb" else "838:59:59.00"
    assert [(current[i]["t2"], current[i]["t6"], current[i]["y"]) for i in (1, 2, 3)] == [
        ("-12:30:00.01", "-00:00:00.000001", 0),
        ("-" + extreme, "-10:00:00.999999", 2155),
        (extreme, "00:00:00.500000", 1901),
    ]
    assert current[1]["ts"] is None  # the zero TIMESTAMP
    assert current[3]["ts"] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    _assert_all_equal(cdc, expected_tables=1)


def test_savepoints_stay_inside_their_transaction(cdc: CdcEnv, monkeypatch) -> None:
    cdc.execute("CREATE TABLE sp (id INT PRIMARY KEY, v INT)")
    with cdc.admin() as conn, conn.cursor() as cur:
        for txn in range(4):
            cur.execute("BEGIN")
            cur.execute("INSERT INTO sp VALUES (%s, 1), (%s, 1)", (txn * 10, txn * 10 + 1))
            cur.execute("SAVEPOINT s1")
            cur.execute("INSERT INTO sp VALUES (%s, 2)", (txn * 10 + 2,))
            cur.execute("ROLLBACK TO SAVEPOINT s1")  # the InnoDB row is gone, and never reaches the binlog
            cur.execute("SAVEPOINT s2")
            cur.execute("INSERT INTO sp VALUES (%s, 3), (%s, 3)", (txn * 10 + 3, txn * 10 + 4))
            cur.execute("RELEASE SAVEPOINT s2")
            cur.execute("COMMIT")
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "1")  # a batch wherever a transaction may end
    assert cdc.sync() == 0
    store = cdc.lakehouse.store
    with_rows = [m for m in (read_manifest(store, n) for n in list_batches(store)) if m.rows]
    assert [(m.rows, m.transactions) for m in with_rows] == [(4, 1)] * 4  # never a cut inside one
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "sp")), None)
    gtids = read_query(log, f"SELECT _cdc_gtid FROM changes WHERE {ROW_CHANGES} ORDER BY _cdc_seq", "changes").column(0).to_pylist()
    assert None not in gtids and len(set(gtids)) == 4
    statements = [st["query"] for m in with_rows for st in m.raw["statements"]]
    assert not [q for q in statements if q.upper().startswith(("SAVEPOINT", "ROLLBACK", "RELEASE"))]
    _assert_all_equal(cdc, expected_tables=1)


def test_composite_keys_and_key_changing_updates(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE item (order_id BIGINT UNSIGNED, line SMALLINT, sku VARCHAR(20), qty INT, "
        "PRIMARY KEY (order_id, line))"
    )
    cdc.execute("INSERT INTO item VALUES (18446744073709551615, 1, 'a', 1), (18446744073709551615, 2, 'b', 2)")
    assert cdc.sync() == 0
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("UPDATE item SET line = line + 10 ORDER BY line DESC")  # both keys move
        cur.execute("UPDATE item SET qty = qty * 100 WHERE line = 12")
        cur.execute("INSERT INTO item VALUES (7, 1, 'c', 3)")
        cur.execute("DELETE FROM item WHERE line = 11")
        cur.execute("UPDATE item SET order_id = 8, line = 1 WHERE order_id = 7")  # moves onto a fresh key
        cur.execute("COMMIT")
    assert cdc.sync() == 0
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "item"), ["order_id", "line", "sku", "qty"])
    rows = sorted(current.to_pylist(), key=lambda r: (r["order_id"], r["line"]))
    assert rows == [
        {"order_id": Decimal(8), "line": 1, "sku": "c", "qty": 3},
        {"order_id": Decimal("18446744073709551615"), "line": 12, "sku": "b", "qty": 200},
    ]
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "item")), None)
    changes = read_query(log, f"SELECT _cdc_op, _cdc_before FROM changes WHERE {ROW_CHANGES} ORDER BY _cdc_seq", "changes")
    assert changes.column("_cdc_op").to_pylist() == ["insert"] * 2 + ["update"] * 3 + ["insert", "delete", "update"]
    key_move = changes.column("_cdc_before").to_pylist()[2]
    assert (key_move["line"], key_move["sku"]) == (2, "b")
    _assert_all_equal(cdc, expected_tables=1)


def test_ordering_survives_binlog_rotation(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE r (id INT PRIMARY KEY, v VARCHAR(10))")
    with cdc.server.admin_connection(database=cdc.database) as conn, conn.cursor() as cur:
        for i in range(3):
            cur.execute("INSERT INTO r VALUES (1, %s) ON DUPLICATE KEY UPDATE v = %s", (f"v{i}", f"v{i}"))
            cur.execute("FLUSH BINARY LOGS")
    assert cdc.sync() == 0
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "r")), None)
    changes = read_query(log, f"SELECT _cdc_seq, v FROM changes WHERE {ROW_CHANGES} ORDER BY _cdc_seq", "changes")
    assert changes.column("v").to_pylist() == ["v0", "v1", "v2"]
    store = cdc.lakehouse.store
    first = read_manifest(store, list_batches(store)[0])
    assert load_checkpoint(store).position.sort_key[0] >= first.start.sort_key[0] + 3  # read across 3 rotations
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "r"))
    assert current.column("v").to_pylist() == ["v2"]


def test_raw_batches_are_self_describing(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE s (id INT PRIMARY KEY, name VARCHAR(20) CHARACTER SET utf8mb4)")
    cdc.execute("INSERT INTO s VALUES (1, 'x')")
    assert cdc.sync() == 0
    store = cdc.lakehouse.store
    [name] = [n for n in list_batches(store) if read_manifest(store, n).rows]
    manifest = json.loads(store.get(f"raw/{name}/manifest.json"))
    assert manifest["name"] == name
    assert manifest["start"]["file"].startswith("mysql-bin.")
    # MariaDB: the batch's last GTID per domain; MySQL: the executed GTID set up to its end (tags included)
    gtid_form = r"0-1-\d+" if cdc.server.flavour == "mariadb" else r"[0-9a-f-]{36}:[0-9a-z_:,-]+"
    assert manifest["end_gtid"] and re.fullmatch(gtid_form, manifest["end_gtid"])
    [table] = [t for t in manifest["tables"] if t["table"] == "s"]
    assert table["primary_key"] == ["id"]
    assert [(c["name"], c["type"]) for c in table["columns"]] == [("id", "int"), ("name", "varchar")]
    rows = read_rows(store, read_manifest(store, name))
    assert rows.column("after").to_pylist() == [["1", "x"]]
    assert pc.all(pc.equal(rows.column("op"), "insert")).as_py()


def test_sync_while_the_source_keeps_writing(cdc: CdcEnv, monkeypatch) -> None:
    _sample(cdc, monkeypatch, transactions=50, seed=3)
    stop = threading.Event()
    shop, inventory = f"{cdc.database}_shop", f"{cdc.database}_inventory"

    def write() -> None:
        with cdc.server.admin_connection(autocommit=False) as conn:
            Workload(conn, seed=4, shop=shop, inventory=inventory).run_until(stop, pause_s=0.002)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3):  # each sync reads to the binlog end as of its start while the end keeps moving
            assert cdc.sync() == 0
    finally:
        stop.set()
        writer.join()
    assert cdc.sync() == 0
    _assert_all_equal(cdc, expected_tables=6)
    assert batch_chain_breaks(cdc.lakehouse) == []
    assert _all_change_seqs(cdc) == _raw_seqs(cdc)


def _last_gtid(cur: pymysql.cursors.Cursor, flavour: str) -> str:
    """The GTID of the server's last transaction (nothing else writes meanwhile)."""
    if flavour == "mariadb":
        cur.execute("SELECT @@gtid_binlog_pos")
        return cur.fetchone()[0]
    cur.execute("SELECT @@server_uuid, @@global.gtid_executed")
    uuid, executed = cur.fetchone()
    [mine] = [part for part in executed.replace("\n", "").split(",") if part.startswith(uuid)]
    # uuid:1-5:7-9[:tag:1-3…]: the untagged intervals come first; the last one ends at the newest transaction
    untagged = list(itertools.takewhile(lambda part: part[:1].isdigit(), mine[len(uuid) + 1 :].split(":")))
    return f"{uuid}:{untagged[-1].rsplit('-', 1)[-1]}"


def test_change_log_metadata(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE m (id INT PRIMARY KEY, v INT)")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET TIMESTAMP = 1700000000")  # the commit time the binlog records
        cur.execute("INSERT INTO m VALUES (1, 1), (2, 2)")
        cur.execute("SET TIMESTAMP = 1700000123")
        cur.execute("UPDATE m SET v = 10 WHERE id = 1")
        gtid = _last_gtid(cur, cdc.server.flavour)
    assert cdc.sync() == 0
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "m")), None)
    rows = read_query(log, f"SELECT * FROM changes WHERE {ROW_CHANGES} ORDER BY _cdc_seq", "changes").to_pylist()
    assert [r["_cdc_op"] for r in rows] == ["insert", "insert", "update"]
    [created] = read_query(log, "SELECT _cdc_ddl FROM changes WHERE _cdc_op = 'create'", "changes").to_pylist()
    ddl = json.loads(created["_cdc_ddl"])  # the CREATE TABLE has a change-log row of its own, before the rows
    assert ddl["statement"].startswith("CREATE TABLE m") and ddl["after"]["primary_key"] == ["id"]
    assert [r["_cdc_commit_ts"] for r in rows] == [
        dt.datetime.fromtimestamp(1700000000, dt.UTC),
        dt.datetime.fromtimestamp(1700000000, dt.UTC),
        dt.datetime.fromtimestamp(1700000123, dt.UTC),
    ]
    assert rows[2]["_cdc_gtid"] == gtid and rows[0]["_cdc_gtid"] != gtid
    assert rows[2]["_cdc_before"] == {"id": 1, "v": 1} and rows[0]["_cdc_before"] is None
    assert rows[2]["_cdc_seq"] == rows[1]["_cdc_seq"] + 1
    assert all(r["_cdc_batch"] in list_batches(cdc.lakehouse.store) for r in rows)
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "m")).to_pylist()
    one = next(r for r in current if r["id"] == 1)
    assert (one["v"], one["_cdc_seq"], one["_cdc_commit_ts"]) == (10, rows[2]["_cdc_seq"], rows[2]["_cdc_commit_ts"])


def test_xa_transactions_count_at_their_commit(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE x (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO x VALUES (1, 'one')")
    preparer = cdc.admin()
    with preparer.cursor() as cur:
        for statement in ("XA START 'a'", "INSERT INTO x VALUES (2, 'xa')", "UPDATE x SET v = 'by xa' WHERE id = 1",
                          "XA END 'a'", "XA PREPARE 'a'"):  # fmt: skip
            cur.execute(statement)
    cdc.execute("INSERT INTO x VALUES (3, 'plain')")
    # Prepared, not committed: the source shows neither row 2 nor the update, and neither does the lakehouse,
    # whose capture stops just before the PREPARE (row 3, committed after it, is in flight until the outcome).
    assert cdc.sync() == 0
    assert [d.describe() for d in cdc.verify() if not d.ok] == []
    assert sorted(r["id"] for r in read_current(cdc.lakehouse, TableRef(cdc.database, "x")).to_pylist()) == [1]
    preparer.close()  # a prepared XA transaction outlives its connection; another one commits it
    cdc.execute("XA COMMIT 'a'")
    cdc.execute(
        "XA START 'b'", "INSERT INTO x VALUES (4, 'gone')", "XA END 'b'", "XA PREPARE 'b'", "XA ROLLBACK 'b'",
        "XA START 'c'", "INSERT INTO x VALUES (5, 'one phase')", "XA END 'c'", "XA COMMIT 'c' ONE PHASE",
    )  # fmt: skip
    assert cdc.sync() == 0
    _assert_all_equal(cdc, expected_tables=1)
    rows = {r["id"]: r["v"] for r in read_current(cdc.lakehouse, TableRef(cdc.database, "x")).to_pylist()}
    assert rows == {1: "by xa", 2: "xa", 3: "plain", 5: "one phase"}
    assert duplicate_seqs(cdc.lakehouse) == {} and batch_chain_breaks(cdc.lakehouse) == []


def test_a_change_rewrites_only_the_current_state_file_holding_its_key(cdc: CdcEnv, monkeypatch) -> None:
    """Copy on write by file: a changed key costs the rewrite of the file whose key range holds it (new keys past
    the end: of the last file), the files stay in disjoint key ranges, and the table still equals the source."""
    from cdc_assets.lake.layout import CURRENT

    monkeypatch.setenv("CDC_CURRENT_FILE_KB", "2")  # a few hundred rows a file (default 32 KB: one file here)
    cdc.execute(
        "CREATE TABLE wide (id INT PRIMARY KEY, v INT, note VARCHAR(20))",
        "INSERT INTO wide SELECT seq, seq, CONCAT('row ', seq) FROM " + cdc.numbers(5000),
    )
    assert cdc.sync() == 0
    cdc.execute("UPDATE wide SET v = -1 WHERE id = 2500")  # the first merge cuts the table's file into pieces
    assert cdc.sync() == 0

    def files() -> dict[str, tuple[int, int]]:
        table = cdc.lakehouse.open(CURRENT, TableRef(cdc.database, "wide"))
        actions = pa.table(table.get_add_actions(flatten=True))
        return {
            p: (low, high)
            for p, low, high in zip(*(actions.column(c).to_pylist() for c in ("path", "min.id", "max.id")), strict=True)
        }

    before = files()
    assert len(before) >= 8
    spans = sorted(before.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))  # disjoint ranges
    cdc.execute(
        "UPDATE wide SET v = -2 WHERE id = 1234",
        "DELETE FROM wide WHERE id = 3210",
        "INSERT INTO wide VALUES (6000, 0, 'past the end')",
    )
    assert cdc.sync() == 0
    after = files()
    holders = {p for p, (low, high) in before.items() if low <= 1234 <= high or low <= 3210 <= high or high == 5000}
    assert set(before) - set(after) == holders  # only the files holding a changed key (and the last) rewritten
    spans = sorted(after.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[-1][1] == 6000
    results = cdc.verify()
    assert all(r.ok for r in results), [r.describe() for r in results]

    # CDC_CURRENT_FILE_KB sets the pieces' size: the same rows at 64 KB make a few files, not dozens
    monkeypatch.setenv("CDC_CURRENT_FILE_KB", "64")
    cdc.execute("CREATE TABLE wide64 LIKE wide", "INSERT INTO wide64 SELECT * FROM wide")
    assert cdc.sync() == 0
    cdc.execute("UPDATE wide64 SET v = -3 WHERE id = 10")
    assert cdc.sync() == 0
    coarse = cdc.lakehouse.open(CURRENT, TableRef(cdc.database, "wide64"))
    assert 1 <= len(coarse.file_uris()) <= 3 < len(after), (len(coarse.file_uris()), len(after))
