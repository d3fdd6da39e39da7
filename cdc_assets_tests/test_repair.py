"""`cdc-lakehouse repair TABLE…`: only the rows that differ from the source are read again and written, as `repair`
changes the change log, the history and the sinks see, exactly once; everything else is left as it was."""

from __future__ import annotations

import re
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_assets.cli import main
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.repair.run import repair_changes
from cdc_assets.stages.current.apply import read_current
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once
from cdc_assets_tests.test_changed_keys import _last_equality_check
from cdc_assets_tests.test_cli import current_rows_like

pytestmark = pytest.mark.both_sources


def _drift(cdc: CdcEnv, table: str) -> DeltaTable:
    """The current state changed behind the pipeline's back: a row deleted, one changed, one too many."""
    current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, table)))
    current.delete("id = 5")
    current.update(predicate="id = 7", updates={"v": "'tampered'"})
    write_deltalake(current, current_rows_like(current, id=1000, v="extra"), mode="append")
    return current


def _ops(cdc: CdcEnv, table: str) -> list[tuple]:
    log = DeltaTable(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)))
    rows = read_query(log, "SELECT _cdc_op, id, _cdc_seq FROM changes WHERE _cdc_op LIKE 'repair%' ORDER BY id", "changes")
    return [(r["_cdc_op"], r["id"]) for r in rows.to_pylist()]


def test_a_drifted_table_is_repaired_row_by_row(cdc: CdcEnv, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.t")
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))", "CREATE TABLE other (id INT PRIMARY KEY)")
    cdc.execute(
        "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM " + cdc.numbers(50), "INSERT INTO other VALUES (1)"
    )
    assert cdc.sync() == 0
    before = {r["id"]: r["_cdc_seq"] for r in read_current(cdc.lakehouse, TableRef(cdc.database, "t")).to_pylist()}
    _drift(cdc, "t")
    assert main(["verify", f"{cdc.database}.t"]) == 1
    capsys.readouterr()

    assert main(["repair", f"{cdc.database}.t", f"{cdc.database}.other"]) == 0
    out = capsys.readouterr().out
    assert f"repair: {cdc.database}.t: 2 rows written as the source has them, 1 removed" in out, out
    assert f"repair: {cdc.database}.other: equal to the source: nothing to repair" in out, out
    assert main(["verify"]) == 0
    # the change log says what the repair did, key by key; nothing else was written again
    assert _ops(cdc, "t") == [("repair", 5), ("repair", 7), ("repair_delete", 1000)]
    after = {r["id"]: r["_cdc_seq"] for r in read_current(cdc.lakehouse, TableRef(cdc.database, "t")).to_pylist()}
    assert {k: s for k, s in after.items() if k not in (5, 7)} == {k: s for k, s in before.items() if k not in (5, 7)}
    assert after[5] > before[5] and after[7] > before[7]
    # the history closed the tampered version and the removed row at the repair's seq
    history = DeltaTable(cdc.lakehouse.table_uri(HISTORY, TableRef(cdc.database, "t")))
    open_rows = read_query(history, "SELECT id, v FROM history WHERE _cdc_is_current ORDER BY id", "history").to_pylist()
    assert {(r["id"], r["v"]) for r in open_rows} == {(i, f"v{i}") for i in range(1, 51)}
    assert duplicate_seqs(cdc.lakehouse) == {} and batch_chain_breaks(cdc.lakehouse) == []
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()

    # a repair of an equal table writes nothing, and changes after a repair apply on top as ever
    batches = list_batches(cdc.lakehouse.store)
    assert main(["repair", f"{cdc.database}.t"]) == 0
    assert list_batches(cdc.lakehouse.store) == batches
    cdc.execute("UPDATE t SET v = 'later' WHERE id IN (5, 1000)", "INSERT INTO t VALUES (1000, 'new')")
    assert cdc.sync() == 0 and main(["verify"]) == 0


def test_a_keyless_table_gets_exactly_its_copies_back(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE k (v INT, w VARCHAR(5))", "INSERT INTO k VALUES (1, 'a'), (1, 'a'), (2, NULL), (3, 'c')")
    assert cdc.sync() == 0
    current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "k")))
    current.delete("v = 1 AND _cdc_dup = 1")  # one of the two copies gone
    current.delete("v = 3")
    write_deltalake(current, current_rows_like(current, v=2, w=None, _cdc_dup=1), mode="append")  # a copy too many
    assert main(["repair", f"{cdc.database}.k"]) == 0
    assert "2 rows written as the source has them, 1 removed" in capsys.readouterr().out
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 4, result.describe()


def test_keys_changing_while_the_repair_reads_are_left_to_their_own_changes(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    cdc.execute("INSERT INTO t SELECT seq, CONCAT('v', seq) FROM " + cdc.numbers(200))
    assert cdc.sync() == 0
    _drift(cdc, "t")
    stop = threading.Event()

    def write() -> None:
        with cdc.admin() as conn, conn.cursor() as cur:
            i = 0
            while not stop.is_set():
                cur.execute("UPDATE t SET v = %s WHERE id = %s", (f"w{i}", i % 200 + 1))
                i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert main(["repair", f"{cdc.database}.t"]) == 0, capsys.readouterr().out
    finally:
        stop.set()
        writer.join()
    assert cdc.sync() == 0
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 200, result.describe()
    found = check_exactly_once(cdc.lakehouse)
    assert found.ok, found.describe()


def test_repair_names_a_table_the_lakehouse_does_not_keep(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    assert cdc.sync() == 0
    assert main(["repair", f"{cdc.database}.nosuch"]) == 2
    assert f"The lakehouse has no table {cdc.database}.nosuch" in capsys.readouterr().err


def test_a_comparison_that_did_not_count_the_source_is_never_equal() -> None:
    """A repair's comparison of some keys' rows leaves the source's count out (the check after its apply counts): it
    says so, and is never taken as equal, even with those rows the same."""
    from cdc_assets.verification.compare import TableDiff
    from cdc_assets.verification.consistency import CHANGED_KEYS, ConsistentComparison

    table = TableRef("shop", "t")
    compared = ConsistentComparison(table, "b.000001:4", 10, 0, 7, 3, 0, "x", "x", TableDiff(table), scope=CHANGED_KEYS, changed_keys=3)
    assert compared.ok
    compared.counted = False
    assert not compared.ok and compared.status == "differs"
    assert "the rows of 3 keys match; the source's rows were not counted" in compared.describe()


def test_repair_changes_are_the_differences_only() -> None:
    """The pure rule: per key the source's row over the lakehouse's, rows the source lacks removed; copies for a
    keyless table."""
    columns = (ColumnSpec("id", "int"), ColumnSpec("v", "varchar"))
    keyed = TableShape(TableRef("s", "t"), columns, ("id",))
    source = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "v": ["a", "b", None]})
    lake = pa.table({"id": pa.array([1, 2, 4], pa.int32()), "v": ["a", "x", "d"]})
    assert repair_changes(keyed, source, lake) == [(["2", "x"], ["2", "b"]), (None, ["3", None]), (["4", "d"], None)]
    keyless = TableShape(TableRef("s", "k"), columns, ())
    source = pa.table({"id": pa.array([1, 1, 2], pa.int32()), "v": ["a", "a", None]})
    lake = pa.table({"id": pa.array([1, 2, 2, 5], pa.int32()), "v": ["a", None, None, "e"]})
    assert sorted(repair_changes(keyless, source, lake), key=repr) == sorted(
        [(None, ["1", "a"]), (["2", None], None), (["5", "e"], None)], key=repr
    )


def test_a_large_table_is_narrowed_by_key_range_digests(cdc: CdcEnv, capsys, monkeypatch) -> None:
    """A table past DIGEST_FROM_ROWS is not brought over row by row: the source and the lakehouse each digest its key
    ranges, and only the keys of the ranges that differ are compared and repaired; nor is it compared row by row
    again by the check after the repair (its Delta table was written by others, which alone would make it so)."""
    from cdc_assets.repair import run as repair
    from cdc_assets.verification import consistency, digests

    monkeypatch.setattr(repair, "DIGEST_FROM_ROWS", 100)
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 20)
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))")
    cdc.execute("INSERT INTO t SELECT seq, CONCAT('v', seq) FROM " + cdc.numbers(400))
    assert cdc.sync() == 0
    _drift(cdc, "t")
    counted: list[TableRef] = []
    count = consistency.count_source_rows
    monkeypatch.setattr(consistency, "count_source_rows", lambda conn, table: counted.append(table) or count(conn, table))
    assert main(["repair", f"{cdc.database}.t"]) == 0
    # the source's rows counted once, by the check after the repair's apply: the repair's own comparison of the
    # narrowed keys at its point writes from those rows and does not read the whole table again for a count
    assert counted == [TableRef(cdc.database, "t")], counted
    out = capsys.readouterr().out
    assert f"repair: {cdc.database}.t: 2 rows written as the source has them, 1 removed (2 of 20 key ranges differed" in out, out
    # the repair's digests stand for the comparison of every row: the check after its apply reads the changed keys
    passed, _, figures = _last_equality_check(f"{cdc.database}.t")
    assert passed and figures["scope"] == "changed keys" and figures["changed_keys"] == 3, figures
    assert figures["source_rows"] == figures["lakehouse_rows"] == 400, figures
    assert main(["verify"]) == 0
    assert _ops(cdc, "t") == [("repair", 5), ("repair", 7), ("repair_delete", 1000)]
    assert main(["repair", f"{cdc.database}.t"]) == 0
    assert "equal to the source: nothing to repair (0 of 20 key ranges differed" in capsys.readouterr().out


@pytest.mark.lakehouse_side  # S3's side: the source's is the local variant's, on both
def test_a_large_table_on_s3_keeps_its_data_files_digests_for_the_next_repair(cdc: CdcEnv, capsys, monkeypatch, s3_endpoint: str) -> None:
    """On S3 too, a repair keeps each data file's digests under `_state/file_digests/`, and the next repair writes
    texts only for the files written since: still finding the row drifted in one of them."""
    import boto3

    from cdc_assets.lake.store import Lakehouse, S3Access
    from cdc_assets.repair import run as repair
    from cdc_assets.verification import digests
    from cdc_assets_tests.conftest import use_s3
    from cdc_assets_tests.test_digests import loaded_in_pieces

    use_s3(monkeypatch, s3_endpoint)
    client = boto3.client("s3")
    client.create_bucket(Bucket="repair")
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://repair/{cdc.database}")
    lakehouse = Lakehouse(f"s3://repair/{cdc.database}", S3Access.of(client, endpoint_url=s3_endpoint))
    monkeypatch.setattr(repair, "DIGEST_FROM_ROWS", 100)
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 20)
    table = loaded_in_pieces(cdc, monkeypatch, "t", 400, 50)

    def drift(key: int) -> None:
        current = DeltaTable(lakehouse.table_uri(CURRENT, table), storage_options=lakehouse.storage_options())
        current.update(predicate=f"id = {key}", updates={"v": "'tampered'"})

    drift(7)
    capsys.readouterr()
    assert main(["repair", f"{cdc.database}.t"]) == 0
    out = capsys.readouterr().out
    assert "1 rows written as the source has them" in out and "; 0 of " in out, out
    kept = client.list_objects_v2(Bucket="repair", Prefix=f"{cdc.database}/_state/file_digests/{table.path}/").get("Contents", [])
    assert len(kept) == 1, kept  # the files' rows share an object
    drift(390)  # another file written again
    assert main(["repair", f"{cdc.database}.t"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"(\d+) of (\d+) data files' digests kept", out)
    # all kept but the files the first repair's apply wrote again (its merge may cut one in two) and the drift's
    assert "1 rows written as the source has them" in out and found and 2 <= int(found[2]) - int(found[1]) <= 3, out
    assert main(["verify"]) == 0
