"""Current state against the source at a consistent point, with a busy source (real MariaDB, Spark, Delta)."""

from __future__ import annotations

import datetime as dt
import shutil
import threading
import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake

from cdc_assets.capture.run import capture
from cdc_assets.cli import main
from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import BinlogResource
from cdc_assets.lake.delta import APPLIED_SEQ_KEY
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.source.rows import read_source_table, source_shapes
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.current.run import apply_pending
from cdc_assets.verification import buckets as bucketed_compare
from cdc_assets.verification.compare import compare_tables
from cdc_assets.verification.consistency import (
    EMPTY_CHECKSUM,
    ConsistentComparison,
    _Manifests,
    compare_many,
    content_checksum,
)
from cdc_assets_tests.conftest import CdcEnv, on_spark

pytestmark = pytest.mark.both_sources

ROWS = 10


@pytest.fixture(params=["whole", "in buckets"])
def in_buckets(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The test's comparisons read each table whole, or (every table counting as large) streamed in buckets of
    three rows: both ways must give the same results."""
    if request.param == "in buckets":
        monkeypatch.setattr(bucketed_compare, "LARGE_TABLE_ROWS", 0)
        monkeypatch.setattr(bucketed_compare, "BUCKET_ROWS", 3)
        monkeypatch.setattr(bucketed_compare, "STREAM_ROWS", 4)
    return request.param == "in buckets"


def _binlog(cdc: CdcEnv) -> BinlogResource:
    return BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{cdc.database}.*")


def _capture(cdc: CdcEnv) -> None:
    capture(_binlog(cdc).settings(), cdc.lakehouse)


def _up_to_date(cdc: CdcEnv, spark: object) -> None:
    """Capture, change logs and current state, driven through the plain functions (not the CLI)."""
    _capture(cdc)
    process_new_batches(cdc.lakehouse, on_spark(lambda: spark))
    apply_pending(cdc.lakehouse, on_spark(lambda: spark))


def _table_t(cdc: CdcEnv, spark: object) -> TableRef:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), d DECIMAL(8,2))")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", [(i, f"v{i}", Decimal(i) / 4) for i in range(1, ROWS + 1)])
    _up_to_date(cdc, spark)
    return TableRef(cdc.database, "t")


def _change_in_flight(cdc: CdcEnv) -> int:
    """Updates, a delete, an insert and a key change; returns how many distinct keys they touch."""
    cdc.execute(
        "UPDATE t SET v = 'u' WHERE id IN (1, 2)",
        "UPDATE t SET v = 'uu' WHERE id = 1",  # the same key twice
        "DELETE FROM t WHERE id = 3",
        "INSERT INTO t VALUES (11, 'new', 0.50)",
        "UPDATE t SET id = 12 WHERE id = 4",  # key change: 4 and 12
    )
    return len({1, 2, 3, 11, 4, 12})


def _compare(cdc: CdcEnv, table: TableRef) -> ConsistentComparison:
    return compare_many(_binlog(cdc).settings(), cdc.lakehouse, [table])[0]


def _current(cdc: CdcEnv, table: TableRef) -> DeltaTable:
    return DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))


def test_quiet_source_compares_every_row(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    c = _compare(cdc, table)
    assert c.ok, c.describe()
    assert (c.source_rows, c.lakehouse_rows, c.compared_rows, c.in_flight_keys) == (ROWS, ROWS, ROWS, 0)
    assert c.source_checksum == c.lakehouse_checksum != EMPTY_CHECKSUM
    assert c.applied_seq == load_checkpoint(cdc.lakehouse.store).next_seq - 1
    assert c.describe().startswith(f"{table}: {ROWS} rows match at ")
    assert (c.buckets > 1) == in_buckets


def test_changes_not_captured_yet_are_left_out_not_reported(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    changed = _change_in_flight(cdc)
    with cdc.server.admin_connection() as conn:  # comparing with "now" sees differences
        shape = source_shapes(conn, [table])[table]
        now = read_source_table(conn, table, list(shape.columns))
    lake = read_current(cdc.lakehouse, table).select(shape.column_names)
    assert not compare_tables(table, now, lake, list(shape.primary_key)).ok
    c = _compare(cdc, table)
    assert c.ok, c.describe()
    assert str(load_checkpoint(cdc.lakehouse.store).position) != c.position  # the keys came from the binlog
    assert c.in_flight_keys == changed
    # Source now: 1, 2, 5..10, 11, 12; of those 1, 2, 11 and 12 are in flight.
    assert (c.source_rows, c.lakehouse_rows, c.compared_rows) == (ROWS, ROWS, ROWS - 4)
    assert c.source_checksum == c.lakehouse_checksum
    assert f"{changed} keys changed in flight left out" in c.describe()


def test_changes_captured_but_not_applied_are_left_out(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    changed = _change_in_flight(cdc)
    _capture(cdc)  # raw batches only
    c = _compare(cdc, table)
    assert str(load_checkpoint(cdc.lakehouse.store).position) == c.position  # nothing left in the binlog
    assert c.ok, c.describe()
    assert (c.in_flight_keys, c.compared_rows) == (changed, ROWS - 4)

    process_new_batches(cdc.lakehouse, on_spark(lambda: spark))  # in the change log, still not in current state
    c = _compare(cdc, table)
    assert c.ok and (c.in_flight_keys, c.compared_rows) == (changed, ROWS - 4), c.describe()

    apply_pending(cdc.lakehouse, on_spark(lambda: spark))
    c = _compare(cdc, table)
    assert c.ok and (c.in_flight_keys, c.compared_rows) == (0, ROWS), c.describe()


def test_a_corrupted_current_state_row_is_detected(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    cdc.execute("UPDATE t SET v = 'busy' WHERE id = 1")  # in flight: left out, even though corrupted below
    current = _current(cdc, table)
    current.delete("id = 5")
    current.update(updates={"v": "'tampered'"}, predicate="id IN (1, 6)")
    c = _compare(cdc, table)
    assert not c.ok
    assert c.source_checksum != c.lakehouse_checksum
    assert (c.in_flight_keys, c.compared_rows) == (1, ROWS - 1)
    assert (c.diff.missing, c.diff.extra, c.diff.different) == ([(5,)], [], [(6,)])
    assert "1 missing: 5" in c.describe() and "1 different: 6" in c.describe()
    assert (c.buckets > 1) == in_buckets


def test_a_large_table_is_read_file_by_file_live_rows_in_the_schema_now(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large table's lakehouse side is read a data file at a time, not through delta-rs's query engine (which keeps
    every file's metadata it read for the life of the process): soft-deleted rows are left out, a file written before
    a column was added reads it as NULL, and a difference is still found."""
    monkeypatch.setattr(bucketed_compare, "LARGE_TABLE_ROWS", 0)
    monkeypatch.setattr(bucketed_compare, "BUCKET_ROWS", 3)
    monkeypatch.setattr(bucketed_compare, "STREAM_ROWS", 4)
    monkeypatch.setenv("CDC_SOFT_DELETES", f"{cdc.database}.s")
    cdc.execute("CREATE TABLE s (id INT PRIMARY KEY, v VARCHAR(10))")
    cdc.execute("INSERT INTO s VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 11)))
    assert cdc.sync() == 0
    cdc.execute("DELETE FROM s WHERE id IN (2, 3)", "ALTER TABLE s ADD COLUMN w INT", "INSERT INTO s VALUES (11, 'new', 7)")
    assert cdc.sync() == 0
    table = TableRef(cdc.database, "s")
    assert len(_current(cdc, table).file_uris()) > 1
    queried: list[str] = []  # the queries delta-rs's engine is given from here on
    real_execute = QueryBuilder.execute
    monkeypatch.setattr(QueryBuilder, "execute", lambda self, sql: queried.append(sql) or real_execute(self, sql))
    c = _compare(cdc, table)
    assert c.ok and c.buckets > 1, c.describe()
    assert (c.source_rows, c.lakehouse_rows, c.compared_rows) == (9, 9, 9)

    _current(cdc, table).update(updates={"v": "'tampered'"}, predicate="id = 5")
    c = _compare(cdc, table)
    assert not c.ok and (c.diff.missing, c.diff.extra, c.diff.different) == ([], [], [(5,)]), c.describe()
    read = [q for q in queried if q.startswith("SELECT * FROM current")]
    assert read == ["SELECT * FROM current LIMIT 0"] * 2, read  # the schema alone


def test_a_current_state_table_of_other_types_is_reported(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    current = _current(cdc, table)
    rows = current.to_pyarrow_table()
    rows = rows.set_column(rows.schema.get_field_index("d"), "d", pc.cast(rows.column("d"), pa.float64()))
    write_deltalake(current.table_uri, rows, mode="overwrite", schema_mode="overwrite")
    c = _compare(cdc, table)
    assert not c.ok
    assert "types differ: d: source decimal128(8, 2), lakehouse double" in c.describe()
    assert (c.source_rows, c.lakehouse_rows, c.compared_rows) == (ROWS, ROWS, ROWS)
    assert c.source_checksum != c.lakehouse_checksum != EMPTY_CHECKSUM


def _snapshot_into_current(cdc: CdcEnv, table: TableRef) -> None:
    """Current state written as `cdc-lakehouse snapshot` writes it (the source is quiet): the rows read with SQL,
    applied up to the checkpoint. The pipeline's keyless merge cannot keep duplicates yet (see the report)."""
    _capture(cdc)
    seq = load_checkpoint(cdc.lakehouse.store).next_seq - 1
    with cdc.server.admin_connection() as conn:
        columns = list(source_shapes(conn, [table])[table].columns)
        rows = read_source_table(conn, table, columns)
    rows = rows.append_column("_cdc_seq", pa.array([seq] * rows.num_rows, pa.int64()))
    ts = pa.array([dt.datetime.now(dt.UTC)] * rows.num_rows, pa.timestamp("us", tz="UTC"))
    rows = rows.append_column("_cdc_commit_ts", ts)
    write_deltalake(
        cdc.lakehouse.table_uri(CURRENT, table),
        rows,
        commit_properties=CommitProperties(custom_metadata={APPLIED_SEQ_KEY: str(seq)}),
    )


def test_a_table_without_a_key_keeps_duplicates_apart(cdc: CdcEnv, in_buckets: bool) -> None:
    cdc.execute(
        "CREATE TABLE nk (a INT, b VARCHAR(10))",
        "INSERT INTO nk VALUES (1, 'x'), (1, 'x'), (2, 'y'), (3, 'z'), (4, 'w'), (4, 'w')",
    )
    table = TableRef(cdc.database, "nk")
    _snapshot_into_current(cdc, table)
    c = _compare(cdc, table)
    assert c.ok and (c.source_rows, c.compared_rows, c.in_flight_keys) == (6, 6, 0), c.describe()

    cdc.execute("DELETE FROM nk WHERE a = 1 LIMIT 1")  # the whole row is the key: (1, 'x') is in flight
    c = _compare(cdc, table)
    assert c.ok, c.describe()
    assert (c.source_rows, c.lakehouse_rows, c.compared_rows, c.in_flight_keys) == (5, 6, 4, 1)

    current = _current(cdc, table)
    rows = current.to_pyarrow_table()
    write_deltalake(
        current.table_uri, rows.filter(pc.equal(rows.column("a"), 2)), mode="append"
    )  # one (2, 'y') too many
    c = _compare(cdc, table)
    assert not c.ok and c.source_checksum != c.lakehouse_checksum
    assert (c.diff.missing, c.diff.extra, c.diff.different) == ([], [], [(2, "y")])


def test_a_schema_change_in_flight_is_not_compared_rather_than_reported(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    cdc.execute("ALTER TABLE t ADD COLUMN extra INT", "TRUNCATE TABLE t")
    c = _compare(cdc, table)
    assert not c.ok and not c.differs and c.compared_rows == 0, c.describe()
    assert c.status == "not compared" and "in flight" in c.describe()


def test_a_table_captured_but_not_yet_in_current_state(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    cdc.execute("CREATE TABLE fresh (id INT PRIMARY KEY)", "INSERT INTO fresh VALUES (1), (2), (3)")
    _capture(cdc)
    c = _compare(cdc, TableRef(cdc.database, "fresh"))  # every row in flight: nothing compared, and it says so
    assert c.status == "not compared" and "every one of its rows changed" in c.describe(), c.describe()
    assert (c.applied_seq, c.lakehouse_rows, c.source_rows, c.in_flight_keys, c.compared_rows) == (None, 0, 3, 3, 0)
    assert _compare(cdc, table).ok


def _busy(cdc: CdcEnv, stop: threading.Event, writes: list[int]) -> None:
    """Updates of existing keys, and short-lived rows, until told to stop."""
    with cdc.admin() as conn, conn.cursor() as cur:
        i = 0
        while not stop.is_set():
            cur.execute("UPDATE t SET v = %s WHERE id = %s", (f"w{i}", i % ROWS + 1))
            cur.execute("INSERT INTO t VALUES (%s, 'hot', 1.00)", (1000 + i,))
            if i % 2:
                cur.execute("DELETE FROM t WHERE id = %s", (1000 + i - 1,))
            i += 1
            writes[0] = i


def _wait_for_writes(writes: list[int], at_least: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while writes[0] < at_least:
        assert time.monotonic() < deadline, f"the writer made {writes[0]} writes in {timeout:.0f} s, not {at_least}"
        time.sleep(0.01)


def test_no_false_difference_while_the_source_writes(cdc: CdcEnv, spark, in_buckets: bool) -> None:
    table = _table_t(cdc, spark)
    stop, writes = threading.Event(), [0]
    writer = threading.Thread(target=_busy, args=(cdc, stop, writes))
    writer.start()
    comparisons: list[ConsistentComparison] = []
    try:
        for _ in range(3):
            # Writes after the checkpoint before each comparison (keys in flight), and more while it is inside its
            # snapshot (after its position: to be left out). Waited for, not hoped for: on a slow machine three
            # comparisons could once all run before the writer's first statement.
            _wait_for_writes(writes, writes[0] + 2)
            with failpoints.arm("verify.in_snapshot", lambda: _wait_for_writes(writes, writes[0] + 2)):
                comparisons.append(_compare(cdc, table))
    finally:
        stop.set()
        writer.join()
    assert all(c.in_flight_keys for c in comparisons), [c.describe() for c in comparisons]
    _no_false_difference(comparisons)
    assert all(c.source_checksum == c.lakehouse_checksum for c in comparisons)


def test_no_false_difference_while_the_source_writes_and_syncs_run(cdc: CdcEnv, spark) -> None:
    table = _table_t(cdc, spark)
    stop, writes, syncs, failures = threading.Event(), [0], [0], []

    def sync() -> None:
        try:
            while not stop.is_set():
                _up_to_date(cdc, spark)
                syncs[0] += 1
        except Exception as exc:  # reported below: a failing sync must fail the test, not hang it
            failures.append(exc)

    threads = [threading.Thread(target=_busy, args=(cdc, stop, writes)), threading.Thread(target=sync)]
    for thread in threads:
        thread.start()
    comparisons: list[ConsistentComparison] = []
    try:
        deadline = time.monotonic() + 20
        moved = False  # until the current state has moved between two comparisons
        while not moved and time.monotonic() < deadline and not failures:
            comparisons.append(_compare(cdc, table))
            moved = len({c.applied_seq for c in comparisons}) > 1
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures and moved, (failures, syncs, [c.applied_seq for c in comparisons])
    assert any(c.in_flight_keys for c in comparisons)
    _no_false_difference(comparisons)
    assert any(c.ok and c.compared_rows for c in comparisons), [c.describe() for c in comparisons]


def _no_false_difference(comparisons: list[ConsistentComparison]) -> None:
    """None differs; each is equal over what it compared, or compared nothing because every row changed in flight
    (the writer gets round every key of the small table between two syncs)."""
    assert not any(c.differs for c in comparisons), [c.describe() for c in comparisons if c.differs]
    unseen = [c.describe() for c in comparisons if c.not_compared and "every one of its rows changed" not in c.describe()]
    assert not unseen, unseen


def test_seq_floor_of_a_position_inside_or_after_raw_batches(cdc: CdcEnv, spark) -> None:
    _table_t(cdc, spark)
    cdc.execute("UPDATE t SET v = 'again' WHERE id = 1")
    _capture(cdc)
    store = cdc.lakehouse.store
    manifests = _Manifests(store, list_batches(store))
    first, last = manifests[0], manifests[len(manifests.names) - 1]
    assert manifests.seq_floor_at(last.end) == last.next_seq - 1  # at a batch's end: all of it is before
    assert manifests.seq_floor_at(last.start) == last.first_seq - 1
    inside = type(last.start)(last.start.log_file, last.start.log_pos + 1)
    assert manifests.seq_floor_at(inside) == last.first_seq - 1  # inside a batch: the whole batch counts as after
    assert manifests.seq_floor_at(type(first.start)(first.start.log_file, 1)) == 0
    assert manifests.first_after(0) == 0
    assert manifests.first_after(last.next_seq - 1) == len(manifests.names)
    assert manifests.first_after(last.first_seq - 1) == len(manifests.names) - 1


def test_checksum_is_order_independent_and_counts_duplicates() -> None:
    rows = pa.table({"id": [1, 2, 2], "v": ["a", "b", "b"]})
    assert content_checksum(rows) == content_checksum(rows.take([2, 1, 0]))
    assert content_checksum(rows) != content_checksum(rows.slice(0, 2))
    assert content_checksum(pa.table({"id": [1], "v": ["a"]})) != content_checksum(pa.table({"id": ["1"], "v": ["a"]}))
    assert content_checksum(pa.table({"v": ["", None]})) != content_checksum(pa.table({"v": [None, None]}))
    assert content_checksum(rows.slice(0, 0)) == EMPTY_CHECKSUM


@pytest.mark.parametrize("statement", ["TRUNCATE TABLE t", "ALTER TABLE t ADD COLUMN extra INT"])
def test_ddl_after_the_snapshot_began_is_not_compared_and_other_tables_are(cdc: CdcEnv, spark, statement: str) -> None:
    """A TRUNCATE or ALTER that runs after the consistent snapshot began makes InnoDB refuse to read the table in
    it (error 1412). That table is reported as not compared, as a DDL found in flight is; the others compare."""
    table = _table_t(cdc, spark)
    cdc.execute("CREATE TABLE other (id INT PRIMARY KEY)", "INSERT INTO other VALUES (1), (2)")
    _up_to_date(cdc, spark)
    with failpoints.arm("verify.in_snapshot", lambda: cdc.execute(statement)):
        results = {c.table: c for c in compare_many(_binlog(cdc).settings(), cdc.lakehouse, [table, TableRef(cdc.database, "other")])}
    assert results[table].status == "not compared" and "definition changed" in results[table].describe()
    other = results[TableRef(cdc.database, "other")]
    assert other.ok and other.compared_rows == 2 and not other.not_compared


def test_a_current_state_table_removed_by_hand_is_a_difference_and_sync_rebuilds_it(cdc: CdcEnv, spark) -> None:
    """`rm -rf current/<schema>/<table>` once passed verify ("0 rows match", every captured key taken as in
    flight), and a sync without new changes left it missing."""
    table = _table_t(cdc, spark)
    cdc.execute("UPDATE t SET v = 'changed' WHERE id = 2", "DELETE FROM t WHERE id = 3")
    assert cdc.sync() == 0
    shutil.rmtree(cdc.lakehouse.table_uri(CURRENT, table))
    c = _compare(cdc, table)
    assert not c.ok and "is missing from the lakehouse" in c.describe() and "cdc-lakehouse sync" in c.describe()
    assert main(["verify"]) == 1
    assert cdc.sync() == 0  # no new change: the sync still rebuilds it from the change log
    c = _compare(cdc, table)
    assert c.ok and c.compared_rows == ROWS - 1, c.describe()


def test_a_snapshot_loaded_table_removed_by_hand_names_snapshot(cdc: CdcEnv, spark, capsys) -> None:
    """A table loaded by a snapshot has rows its change log never saw: sync does not rebuild it from the log but
    holds it back, naming the fix, which then works."""
    cdc.execute("CREATE TABLE s (id INT PRIMARY KEY, v INT)", "INSERT INTO s VALUES (1, 1), (2, 2)")
    assert main(["snapshot", f"{cdc.database}.s"]) == 0
    cdc.execute("INSERT INTO s VALUES (3, 3)")
    assert cdc.sync() == 0
    shutil.rmtree(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "s")))
    capsys.readouterr()
    assert cdc.sync() == 1  # that table is held back (test_quarantine: the others go on)
    printed = capsys.readouterr()
    assert f"run `cdc-lakehouse snapshot {cdc.database}.s`" in printed.out + printed.err, printed
    assert main(["snapshot", f"{cdc.database}.s"]) == 0
    assert cdc.sync() == 0
    [c] = cdc.verify()
    assert c.ok and c.compared_rows == 3
