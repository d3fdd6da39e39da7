"""Batch assembly: transactions, `_cdc_seq` numbering and batch cuts, without a server."""

from cdc_assets.capture.batch_builder import BatchBuilder, redact_statement
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import TableShape


def _builder(max_rows: int = 3) -> tuple[BatchBuilder, object]:
    builder = BatchBuilder(start=BinlogPosition("b.000001", 4), next_seq=10, max_rows=max_rows)
    version = TableShape(TableRef("s", "t"), (ColumnSpec("id", "int"),), ("id",))
    return builder, version


def test_seq_counts_committed_changes_in_binlog_order() -> None:
    builder, version = _builder()
    builder.begin("0-1-5")
    builder.row_changes(version, "insert", [None], [["1"]])
    builder.row_changes(version, "update", [["1"]], [["2"]])
    builder.commit(BinlogPosition("b.000001", 500), 1_700_000_000)
    batch = builder.cut()
    assert batch.rows.column("seq").to_pylist() == [10, 11]
    assert (batch.first_seq, batch.next_seq) == (10, 12)
    assert batch.end == BinlogPosition("b.000001", 500)
    assert batch.end_gtid == "0-1-5"
    assert batch.rows.column("gtid").to_pylist() == ["0-1-5", "0-1-5"]


def test_an_uncommitted_transaction_never_enters_a_batch() -> None:
    builder, version = _builder()
    builder.begin("0-1-6")
    builder.row_changes(version, "insert", [None], [["1"]])
    builder.advance_idle_to(BinlogPosition("b.000002", 4))  # a transaction is open: no advance
    assert not builder.has_progress()
    builder.begin("0-1-7")  # the open one never committed (e.g. the stream stopped mid-way)
    builder.commit(BinlogPosition("b.000001", 900), 1)
    batch = builder.cut()
    assert batch.rows.num_rows == 0 and batch.next_seq == 10


def test_a_batch_is_full_only_after_whole_transactions() -> None:
    builder, version = _builder(max_rows=3)
    builder.begin(None)
    for i in range(2):
        builder.row_changes(version, "insert", [None], [[str(i)]])
    builder.commit(BinlogPosition("b.000001", 100), 1)
    assert not builder.is_full()
    builder.begin(None)
    for i in range(5):
        builder.row_changes(version, "insert", [None], [[str(i)]])
    assert not builder.is_full()  # rows of an open transaction do not count
    builder.commit(BinlogPosition("b.000001", 200), 2)
    assert builder.is_full()
    first = builder.cut()
    assert first.rows.num_rows == 7 and first.transactions == 2
    assert builder.batch_start == first.end and builder.batch_first_seq == first.next_seq


def test_account_statements_and_passwords_stay_out() -> None:
    builder, _ = _builder()
    builder.statement("db", "CREATE USER 'u'@'%' IDENTIFIED BY 'hunter2'")
    builder.statement("db", "ALTER TABLE t ADD COLUMN c INT")
    builder.statement("db", "TRUNCATE TABLE t")
    assert [s["query"] for s in builder.statements] == ["ALTER TABLE t ADD COLUMN c INT", "TRUNCATE TABLE t"]
    assert [s["kind"] for s in builder.statements] == ["ddl", "truncate"]
    assert redact_statement("SET PASSWORD = PASSWORD('x')") is None
    assert "hunter2" not in (redact_statement("CREATE TABLE t (c TEXT DEFAULT 'IDENTIFIED BY hunter2')") or "")


def test_gtid_state_round_trip() -> None:
    assert GtidState.parse("0-1-18,1-2-5").domains == {"0": "0-1-18", "1": "1-2-5"}
    assert GtidState.parse("1-2-5,0-1-18").text() == "0-1-18,1-2-5"
    mysql = GtidState.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:23")
    assert mysql.executed == {("3e11fa47-71ca-11e1-9e33-c80aa9429562", ""): [(23, 23)]}


def test_query_events_and_transactions() -> None:
    from cdc_assets.capture.batch_builder import classify_query

    assert [classify_query(q) for q in ("BEGIN", "XA START 'x'", "START TRANSACTION")] == ["begin"] * 3
    assert [classify_query(q) for q in ("COMMIT", "ROLLBACK", "XA COMMIT 'x'", "XA ROLLBACK 'x'")] == ["end"] * 4
    markers = ("SAVEPOINT `s1`", "ROLLBACK TO `s1`", "ROLLBACK TO SAVEPOINT s1", "RELEASE SAVEPOINT s1", "XA END 'x'")
    assert [classify_query(q) for q in markers] == ["marker"] * 5
    assert classify_query("ALTER TABLE t ADD c INT") == "ddl"
    assert classify_query("TRUNCATE TABLE t") == "ddl"


def test_credentials_in_table_definitions_are_blanked() -> None:
    federated = "CREATE TABLE f (id INT) ENGINE=FEDERATED CONNECTION='mysql://u:pw@h:3306/db/t'"
    assert "pw" not in redact_statement(federated)


def test_truncated_table_is_read_from_the_statement() -> None:
    from cdc_assets.capture.batch_builder import truncated_table
    from cdc_assets.core.names import TableRef

    assert truncated_table("TRUNCATE TABLE t", "db") == TableRef("db", "t")
    assert truncated_table("truncate `my db`.`we``ird`", "db") == TableRef("my db", "we`ird")
    assert truncated_table("  TRUNCATE other.t2;", None) == TableRef("other", "t2")
    assert truncated_table("/* app: cleanup */ TRUNCATE TABLE t", "db") == TableRef("db", "t")
    assert truncated_table("TRUNCATE t", None) is None  # no schema to place it in
    assert truncated_table("ALTER TABLE t ADD c INT", "db") is None


def test_a_transaction_larger_than_memory_spills_and_keeps_order() -> None:
    builder = BatchBuilder(start=BinlogPosition("b.000001", 4), next_seq=100, max_rows=5, chunk_rows=10)
    version = TableShape(TableRef("s", "t"), (ColumnSpec("id", "int"),), ("id",))
    builder.begin("0-1-1")
    for i in range(12):  # a transaction that never commits, spilled to disk, leaves nothing behind
        builder.row_changes(version, "insert", [None], [[f"x{i}"]])
    builder.begin("0-1-2")
    builder.row_changes(version, "insert", [None], [["small"]])
    builder.commit(BinlogPosition("b.000001", 50), 10)
    builder.begin("0-1-3")
    for i in range(25):  # spills: 10 + 10 rows on disk, 5 in memory
        builder.row_changes(version, "update", [[str(i)]], [[str(i + 1)]])
    assert builder.rows == 1  # rows of an open transaction are not the batch's yet
    builder.commit(BinlogPosition("b.000001", 900), 20)
    batch = builder.cut()  # one batch: it ends only where a transaction does, far past max_rows
    rows = batch.rows
    assert batch.row_count == rows.num_rows == 26 and (batch.first_seq, batch.next_seq) == (100, 126)
    assert rows.column("seq").to_pylist() == list(range(100, 126))
    assert rows.column("after").to_pylist() == [["small"]] + [[str(i + 1)] for i in range(25)]
    assert [t.timestamp() for t in rows.column("commit_ts").to_pylist()] == [10.0] + [20.0] * 25
    assert rows.column("gtid").to_pylist() == ["0-1-2"] + ["0-1-3"] * 25


def test_an_xa_transaction_counts_at_its_commit_and_holds_the_batch_end_until_then() -> None:
    builder, version = _builder(max_rows=1)
    builder.begin("0-1-3", BinlogPosition("b.000001", 100))  # XA START ... XA END ... XA PREPARE
    builder.row_changes(version, "insert", [None], [["xa"]])
    builder.prepare_xa("X'7831',X'',1")
    builder.commit(BinlogPosition("b.000001", 200), 5)
    builder.begin("0-1-4", BinlogPosition("b.000001", 200))  # another transaction commits meanwhile
    builder.row_changes(version, "insert", [None], [["plain"]])
    builder.commit(BinlogPosition("b.000001", 300), 6)
    assert builder.is_full() and builder.holding  # no batch may end between the PREPARE and its outcome
    builder.begin("0-1-5", BinlogPosition("b.000001", 300))
    assert builder.resolve_xa("X'7831',X'',1", committed=True)
    builder.commit(BinlogPosition("b.000001", 400), 7)
    batch = builder.cut()
    assert batch.rows.column("after").to_pylist() == [["plain"], ["xa"]]  # in commit order
    assert batch.rows.column("seq").to_pylist() == [10, 11]
    assert [t.timestamp() for t in batch.rows.column("commit_ts").to_pylist()] == [6.0, 7.0]

    builder.begin("0-1-6", BinlogPosition("b.000001", 400))
    builder.row_changes(version, "insert", [None], [["rolled back"]])
    builder.prepare_xa("X'7832',X'',1")
    builder.commit(BinlogPosition("b.000001", 500), 8)
    builder.begin("0-1-7", BinlogPosition("b.000001", 500))
    assert builder.resolve_xa("X'7832',X'',1", committed=False)
    builder.commit(BinlogPosition("b.000001", 600), 9)
    assert not builder.holding and builder.cut().row_count == 0


def test_a_capture_ending_while_an_xa_transaction_is_prepared_stops_just_before_it() -> None:
    builder, version = _builder(max_rows=100)
    builder.begin("0-1-1", BinlogPosition("b.000001", 4))
    builder.row_changes(version, "insert", [None], [["first"]])
    builder.commit(BinlogPosition("b.000001", 100), 1)
    builder.begin("0-1-2", BinlogPosition("b.000001", 100))
    builder.row_changes(version, "insert", [None], [["prepared"]])
    builder.prepare_xa("X'01',X'',1")
    builder.commit(BinlogPosition("b.000001", 200), 2)
    builder.begin("0-1-3", BinlogPosition("b.000001", 200))
    builder.row_changes(version, "insert", [None], [["after it"]])
    builder.commit(BinlogPosition("b.000001", 300), 3)
    batch = builder.cut()
    assert batch.end == BinlogPosition("b.000001", 100) and batch.end_gtid == "0-1-1"
    assert batch.rows.column("after").to_pylist() == [["first"]] and (batch.first_seq, batch.next_seq) == (10, 11)
