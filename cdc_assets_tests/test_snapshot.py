"""`cdc-lakehouse snapshot`: existing rows into current state, consistent with the binlog position."""

from __future__ import annotations

import threading

import pytest

from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.keys import table_asset_key
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_cli import _assert_user_error, _run

pytestmark = pytest.mark.both_sources


def test_snapshot_brings_in_a_table_whose_history_the_pipeline_never_saw(cdc: CdcEnv, monkeypatch, capsys) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE old (k1 INT, k2 VARCHAR(10), v DECIMAL(8,2), PRIMARY KEY (k1, k2))",
        "CREATE TABLE other (id INT PRIMARY KEY)",
        "INSERT INTO old VALUES (1, 'a', 1.00), (2, 'b', 2.00), (3, 'c', 3.00), (4, 'd', 4.00)",
        "INSERT INTO other VALUES (1)",
    )
    monkeypatch.setenv("CDC_TABLES", f"{db}.other")  # `old` is left out: its inserts pass the checkpoint
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_TABLES", f"{db}.*")
    cdc.execute("UPDATE old SET v = 20.00 WHERE k1 = 2")  # after the checkpoint: the binlog has this one

    code, out, _ = _run(["snapshot", f"{db}.old"], capsys)
    assert code == 0, out
    assert f"{db}.old: 4 rows loaded" in out
    checkpoint = load_checkpoint(cdc.lakehouse.store)
    rows = read_current(cdc.lakehouse, TableRef(db, "old")).to_pylist()
    assert {r["_cdc_seq"] for r in rows} == {checkpoint.next_seq - 1}
    # the snapshot run records the table's own asset, with its rows and columns
    own = instance().get_latest_materialization_event(table_asset_key(f"{db}.old")).asset_materialization.metadata
    assert own["dagster/row_count"].value == own["snapshot_rows"].value == 4
    assert [c.name for c in own["dagster/column_schema"].value.columns][:3] == ["k1", "k2", "v"]

    cdc.execute(
        "UPDATE old SET v = v + 1 WHERE k1 IN (1, 3)",
        "DELETE FROM old WHERE k1 = 4",
        "UPDATE old SET k2 = 'z' WHERE k1 = 3",
        "INSERT INTO old VALUES (5, 'e', 5.00)",
        "INSERT INTO other VALUES (2)",
    )
    assert cdc.sync() == 0
    results = cdc.verify()
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert [(str(r.table), r.compared_rows) for r in results] == [(f"{db}.old", 4), (f"{db}.other", 2)]


def test_snapshot_is_consistent_while_the_source_writes(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE hot (id INT PRIMARY KEY, n INT NOT NULL, note VARCHAR(40))")
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO hot VALUES (%s, 0, 'start')", [(i,) for i in range(20_000)])
    stop = threading.Event()
    writes = [0]

    def write() -> None:
        with cdc.admin() as conn, conn.cursor() as cur:
            i = 0
            while not stop.is_set():
                cur.execute("UPDATE hot SET n = n + 1, note = %s WHERE id = %s", (f"w{i}", (i * 7919) % 20_000))
                if i % 10 == 0:
                    cur.execute("DELETE FROM hot WHERE id = %s", ((i * 104729) % 20_000,))
                    cur.execute("INSERT INTO hot VALUES (%s, 0, 'new')", (20_000 + i,))
                i += 1
                writes[0] = i

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert cdc.sync("--max-batch-rows", "500") == 0  # capture from the oldest binlog, while writes go on
        assert _snapshot_all(cdc) == 0
    finally:
        stop.set()
        writer.join()
    assert writes[0] > 50  # the source really changed during the snapshot
    assert cdc.sync() == 0
    [diff] = cdc.verify()
    assert diff.ok, diff.describe()


def _snapshot_all(cdc: CdcEnv) -> int:
    from cdc_assets.cli import main

    return main(["snapshot"])


def test_snapshot_refuses_tables_it_could_not_follow(cdc: CdcEnv, monkeypatch, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    monkeypatch.setenv("CDC_EXCLUDE_TABLES", f"{cdc.database}.t")
    code, _, err = _run(["snapshot", f"{cdc.database}.t"], capsys)
    _assert_user_error(code, err, "is excluded by CDC_TABLES / CDC_EXCLUDE_TABLES")
    monkeypatch.delenv("CDC_EXCLUDE_TABLES")
    code, _, err = _run(["snapshot", f"{cdc.database}.missing"], capsys)
    _assert_user_error(code, err, "does not exist in the source")


def test_snapshot_streams_a_table_in_key_order_a_chunk_at_a_time(cdc: CdcEnv, monkeypatch, capsys) -> None:
    """Rows go through the spool a few at a time, in primary-key order, keyless tables included, and land as one
    commit whose files hold disjoint key ranges."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from cdc_assets.lake.layout import CURRENT
    from cdc_assets.stages.snapshot import run as snapshot

    monkeypatch.setattr(snapshot, "SNAPSHOT_CHUNK_ROWS", 7)
    db = cdc.database
    cdc.execute(
        "CREATE TABLE wide (id INT PRIMARY KEY, note VARCHAR(20), at DATETIME(6), amount DECIMAL(10,2))",
        "CREATE TABLE dup (v INT, w VARCHAR(5))",
        "INSERT INTO wide SELECT seq, CONCAT('n', seq), NOW(6), seq / 4 FROM " + cdc.numbers(50) + " ORDER BY seq DESC",
        "INSERT INTO dup VALUES (1, 'a'), (1, 'a'), (2, NULL), (1, 'a')",
    )
    code, out, _ = _run(["snapshot"], capsys)
    assert code == 0, out
    assert f"{db}.wide: 50 rows loaded" in out and f"{db}.dup: 4 rows loaded" in out
    table = DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(db, "wide")))
    assert len(table.history()) == 1  # one commit, whatever the number of chunks
    [data_file] = table.file_uris()
    ids = pq.read_table(data_file.removeprefix("file://"), columns=["id"]).column("id").to_pylist()
    assert ids == list(range(1, 51))  # inserted in descending order, stored in key order
    cdc.execute("UPDATE wide SET note = 'changed' WHERE id = 7", "DELETE FROM dup WHERE v = 2")
    assert cdc.sync() == 0
    results = cdc.verify()
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert {str(r.table): r.compared_rows for r in results} == {f"{db}.wide": 50, f"{db}.dup": 3}
