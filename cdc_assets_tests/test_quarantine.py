"""One odd table never stops the others (docs/lakehouse.md: Quarantine): a table whose changes cannot be decoded at capture, or applied
to its current state, is quarantined with one sentence (cause and fix), its own checks fail and `status` lists it;
every other table goes on and the checkpoint moves; after the fix it catches up exactly once."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc_assets.cli import main
from cdc_assets.commands.runs import collect_status
from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CURRENT, HISTORY
from cdc_assets.lake.quarantine import CAPTURE, quarantined_tables, run_isolated
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.test_personal_data import _Log


def _rows(cdc: CdcEnv, table: str) -> list[tuple]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table), ["id", "v"])
    return [] if rows is None else sorted((r["id"], r["v"]) for r in rows.to_pylist())


def _all_equal(cdc: CdcEnv) -> None:
    results = cdc.verify()
    assert results and all(r.ok for r in results), [r.describe() for r in results if not r.ok]


@pytest.mark.both_sources
def test_a_table_capture_cannot_decode_is_quarantined_and_a_snapshot_takes_it_back(cdc: CdcEnv) -> None:
    """A table map without column names (binlog_row_metadata=MINIMAL for a while) stopped every table's capture."""
    cdc.execute(
        "CREATE TABLE healthy (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE odd (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO healthy VALUES (1, 'a')",
        "INSERT INTO odd VALUES (1, 'a')",
    )
    assert cdc.sync() == 0
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        try:
            cur.execute("INSERT INTO odd VALUES (2, 'no names')")
        finally:
            cur.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
    cdc.execute("INSERT INTO healthy VALUES (2, 'b')", "UPDATE odd SET v = 'c' WHERE id = 1")

    assert cdc.sync() == 1  # the odd table's own check fails
    held = quarantined_tables(cdc.lakehouse.store)
    odd = f"{cdc.database}.odd"
    assert list(held) == [odd] and held[odd].stage == CAPTURE
    assert "binlog_row_metadata=FULL" in held[odd].sentence() and f"snapshot {odd}" in held[odd].sentence()
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b")]  # the other table went on
    checkpoint = load_checkpoint(cdc.lakehouse.store)
    assert checkpoint is not None and checkpoint.last_batch is not None  # the checkpoint moved past the odd table
    assert collect_status(settings_now()).quarantined == {odd: held[odd].sentence()}
    results = {str(r.table): r for r in cdc.verify()}
    assert results[f"{cdc.database}.healthy"].ok and results[odd].differs

    cdc.execute("INSERT INTO healthy VALUES (3, 'c')", "INSERT INTO odd VALUES (3, 'd')")
    assert cdc.sync() == 1  # still left out: nothing of it is captured meanwhile
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b"), (3, "c")]

    assert main(["snapshot", odd]) == 0  # the fix the sentence names
    assert quarantined_tables(cdc.lakehouse.store) == {}
    cdc.execute("UPDATE odd SET v = 'e' WHERE id = 3", "DELETE FROM odd WHERE id = 2", "INSERT INTO odd VALUES (4, 'f')")
    assert cdc.sync() == 0
    _all_equal(cdc)
    assert _rows(cdc, "odd") == [(1, "c"), (3, "e"), (4, "f")]


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_a_table_whose_changes_cannot_be_applied_is_quarantined_and_catches_up_once(cdc: CdcEnv, engine: str, monkeypatch) -> None:
    """A current-state table another tool replaced with one of other types: its merge fails, so it is quarantined
    at the current-state stage with its changes kept in its change log; `snapshot TABLE` loads it afresh and lifts it.
    On either engine."""
    if engine == "spark":
        monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # every stage run (and the snapshot) on Spark
    cdc.execute(
        "CREATE TABLE healthy (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE odd (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO healthy VALUES (1, 'a')",
        "INSERT INTO odd VALUES (1, 'a')",
    )
    assert cdc.sync() == 0
    odd = TableRef(cdc.database, "odd")
    broken = pa.table({"id": pa.array(["x"]), "v": pa.array([1]), "_cdc_seq": pa.array(["y"])})
    write_deltalake(cdc.lakehouse.table_uri(CURRENT, odd), broken, mode="overwrite", schema_mode="overwrite")
    cdc.execute("INSERT INTO healthy VALUES (2, 'b')", "INSERT INTO odd VALUES (2, 'b')", "UPDATE odd SET v = 'c' WHERE id = 1")

    assert cdc.sync() == 1
    held = quarantined_tables(cdc.lakehouse.store)
    assert list(held) == [str(odd)] and held[str(odd)].stage == "current"
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b")]
    cdc.execute("INSERT INTO healthy VALUES (3, 'c')", "DELETE FROM odd WHERE id = 2")
    assert cdc.sync() == 1  # tried again, still failing: the others go on
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b"), (3, "c")]

    assert main(["snapshot", str(odd)]) == 0
    assert quarantined_tables(cdc.lakehouse.store) == {}
    cdc.execute("INSERT INTO odd VALUES (5, 'e')")
    assert cdc.sync() == 0
    _all_equal(cdc)
    assert _rows(cdc, "odd") == [(1, "c"), (5, "e")]


def test_an_alter_the_lakehouse_cannot_convert_quarantines_only_its_table(cdc: CdcEnv) -> None:
    """A MODIFY COLUMN the lakehouse cannot convert as the server did (a BIT made a BLOB: the server writes the
    value's bytes, as many as the column's width, which the binlog does not tell; docs/lakehouse.md, Schema changes) ended the
    whole sync. Now only that table is quarantined, with the sentence naming the snapshot that loads it again; the
    others go on. (This test's case was a text in armscii8 made binary until the lakehouse learned that charset.)"""
    cdc.execute(
        "CREATE TABLE healthy (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE odd (id INT PRIMARY KEY, v BIT(12))",
        "INSERT INTO healthy VALUES (1, 'a')",
        "INSERT INTO odd VALUES (1, b'101000001')",
    )
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE odd MODIFY v BLOB", "INSERT INTO healthy VALUES (2, 'b')")
    assert cdc.sync() == 1  # the odd table's own check fails; the run went on
    odd = f"{cdc.database}.odd"
    held = quarantined_tables(cdc.lakehouse.store)
    assert list(held) == [odd] and held[odd].stage == "current"
    assert "cannot be converted" in held[odd].sentence() and f"snapshot {odd}" in held[odd].sentence()
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b")]
    assert main(["snapshot", odd]) == 0
    assert quarantined_tables(cdc.lakehouse.store) == {}
    assert cdc.sync() == 0
    _all_equal(cdc)


def test_a_history_that_cannot_take_its_changes_quarantines_only_its_table(cdc: CdcEnv, monkeypatch) -> None:
    """A history table (CDC_HISTORY_TABLES) that cannot take in its table's changes (here one of its own columns
    removed by hand) ended every table's sync after their merges, before any progress was saved. Now only its table
    is held back, named with the history table whose removal makes it again; the others go on."""
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.healthy,{db}.odd")
    cdc.execute(
        "CREATE TABLE healthy (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE odd (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO healthy VALUES (1, 'a')",
        "INSERT INTO odd VALUES (1, 'abc')",
    )
    assert cdc.sync() == 0
    odd = TableRef(db, "odd")
    history = cdc.lakehouse.open(HISTORY, odd)
    assert history is not None
    rows = pa.table(history.to_pyarrow_table())
    broken = rows.drop_columns(["_cdc_valid_from_seq"])  # a column of the history's own removed by hand
    write_deltalake(cdc.lakehouse.table_uri(HISTORY, odd), broken, mode="overwrite", schema_mode="overwrite")
    cdc.execute("INSERT INTO odd VALUES (2, 'xyz')", "INSERT INTO healthy VALUES (2, 'b')")
    assert cdc.sync() == 1  # the odd table is held back; the run went on
    held = quarantined_tables(cdc.lakehouse.store)
    assert list(held) == [f"{db}.odd"] and held[f"{db}.odd"].stage == "current"
    assert f"history/{db}/odd" in held[f"{db}.odd"].sentence(), held[f"{db}.odd"].sentence()
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b")]
    kept = cdc.lakehouse.open(HISTORY, TableRef(db, "healthy"))
    assert kept is not None and sorted(kept.to_pyarrow_table().column("id").to_pylist()) == [1, 2]
    # following the sentence: the history removed is made again from the change log, and the table goes on
    shutil.rmtree(cdc.lakehouse.table_uri(HISTORY, odd))
    assert cdc.sync() == 0
    assert quarantined_tables(cdc.lakehouse.store) == {}
    remade = cdc.lakehouse.open(HISTORY, odd)
    assert remade is not None and sorted(remade.to_pyarrow_table().column("v").to_pylist()) == ["abc", "xyz"]
    _all_equal(cdc)


def test_a_snapshot_loaded_table_whose_current_state_was_removed_holds_back_only_itself(cdc: CdcEnv) -> None:
    """The current state of a table a snapshot loaded, removed behind the pipeline's back: its change log cannot
    make it again (the snapshot's rows are not in it). That ended every table's sync; now that table alone is held
    back with the sentence naming the snapshot that loads it, and the snapshot takes it back."""
    db = cdc.database
    cdc.execute(
        "CREATE TABLE healthy (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE loaded (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO healthy VALUES (1, 'a')",
    )
    with cdc.admin() as conn, conn.cursor() as cur:  # rows the binlog does not hold: only a snapshot brings them
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"INSERT INTO {db}.loaded VALUES (1, 'snapshot')")
    assert main(["snapshot", f"{db}.loaded"]) == 0
    assert cdc.sync() == 0
    shutil.rmtree(cdc.lakehouse.table_uri(CURRENT, TableRef(db, "loaded")))
    cdc.execute("INSERT INTO healthy VALUES (2, 'b')", "INSERT INTO loaded VALUES (2, 'c')")
    assert cdc.sync() == 1
    held = quarantined_tables(cdc.lakehouse.store)
    assert list(held) == [f"{db}.loaded"], held
    assert "is missing from the lakehouse" in held[f"{db}.loaded"].sentence()
    assert f"snapshot {db}.loaded" in held[f"{db}.loaded"].sentence()
    assert _rows(cdc, "healthy") == [(1, "a"), (2, "b")]
    assert main(["snapshot", f"{db}.loaded"]) == 0
    assert cdc.sync() == 0
    assert quarantined_tables(cdc.lakehouse.store) == {}
    assert _rows(cdc, "loaded") == [(1, "snapshot"), (2, "c")]
    _all_equal(cdc)


def test_a_run_that_fails_together_and_not_alone_says_so() -> None:
    """Splitting a failed run into a run a table keeps one table from stopping the others, but when every table then
    succeeds alone the fault was the batched run's own (a Spark stage's slice bug once hid this way, showing only as
    more jobs): the split is said, with its cause."""
    alone: list[set[str]] = []

    def work(group: set[str]) -> None:
        if len(group) > 1:
            raise ValueError("Array type doesn't match type of values set: string vs null")
        alone.append(group)

    log = _Log()
    assert run_isolated(["s.a", "s.b", "s.c"], [], work, log) == {}
    assert sorted(min(g) for g in alone) == ["s.a", "s.b", "s.c"]
    assert log.warnings == [
        "3 tables failed as one run (ValueError: Array type doesn't match type of values set: string vs null); "
        "each is taken alone now"
    ]
    log = _Log()
    assert run_isolated(["s.a", "s.b"], [], alone.append, log) == {} and log.warnings == []  # one pass: nothing said
