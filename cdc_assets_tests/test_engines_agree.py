"""Both engines make the same lakehouse. Random change streams (inserts, updates, deletes, keys moved and swapped,
REPLACE, identical rows of a keyless table, TRUNCATE, an ALTER) are captured into two lakehouses, whose stages
then run one on Arrow and one on Spark, round after round: their change logs and current-state tables must be
identical, every column the lakehouse adds included. Spark expresses some rules in its own API (the newest change
per key, the seq guard, a keyless table's copies, what a TRUNCATE removes); this is what keeps them the rules the
Arrow engine applies. Both must also equal the source."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_assets.capture.run import capture
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, CURRENT
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes import spark_tasks as change_tasks
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current import apply as current_state
from cdc_assets.stages.current import on_spark as current_on_spark
from cdc_assets.stages.current.run import apply_pending
from cdc_assets_tests.conftest import CdcEnv, on_spark
from cdc_assets_tests.env_settings import source_now
from cdc_assets_tests.stage_runs import source_and_current
from spark_resources.engine import Transforms

TABLES = ("k", "c", "s", "bag")
ROUNDS = 4


def _create(cdc: CdcEnv, rng: random.Random) -> None:
    cdc.execute(
        "CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(8), n INT)",
        "CREATE TABLE c (a INT, b VARCHAR(4), v INT, PRIMARY KEY (a, b))",
        "CREATE TABLE s (code VARCHAR(6) PRIMARY KEY, d DECIMAL(6,2), t DATETIME(3))",
        "CREATE TABLE bag (x INT, y VARCHAR(3))",
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO k VALUES (%s, %s, %s)", [(i, f"v{i}", rng.choice([None, i])) for i in range(40)])
        cur.executemany("INSERT INTO c VALUES (%s, %s, %s)", [(i % 6, f"b{i}", i) for i in range(30)])
        cur.executemany("INSERT INTO s VALUES (%s, %s, NOW(3))", [(f"s{i:02d}", i / 4) for i in range(20)])
        cur.executemany("INSERT INTO bag VALUES (%s, %s)", [(i % 4, rng.choice([None, "p", "q"])) for i in range(30)])


def _statement(rng: random.Random, altered: bool) -> str:
    """One random statement of the stream (many touch nothing: an absent key, a key moved onto one taken)."""
    i, j = rng.randrange(60), rng.randrange(60)
    w = f", w = 'w{i % 9}'" if altered and rng.random() < 0.5 else ""
    return rng.choice(
        [
            f"INSERT IGNORE INTO k (id, v, n) VALUES ({i}, 'i{j}', {j})",
            f"UPDATE k SET v = 'u{j}', n = {rng.choice(['NULL', str(j)])}{w} WHERE id = {i}",
            f"UPDATE k SET n = COALESCE(n, 0) + 1 WHERE id BETWEEN {i} AND {i + 5}",
            f"DELETE FROM k WHERE id = {i}",
            f"UPDATE IGNORE k SET id = {j} WHERE id = {i}",  # a key moved
            f"REPLACE INTO k (id, v, n) VALUES ({i}, 'r{j}', NULL)",
            f"INSERT INTO k (id, v, n) VALUES ({i}, 'd{j}', {j}) ON DUPLICATE KEY UPDATE n = {j}",
            f"INSERT IGNORE INTO c VALUES ({i % 6}, 'b{j % 40}', {j})",
            f"UPDATE IGNORE c SET b = 'b{j % 40}' WHERE a = {i % 6} AND b = 'b{i % 40}'",
            f"UPDATE c SET v = v + 1 WHERE a = {i % 6}",
            f"DELETE FROM c WHERE a = {i % 6} AND b = 'b{j % 40}'",
            f"INSERT IGNORE INTO s VALUES ('s{i:02d}', {j / 4}, NOW(3))",
            f"UPDATE s SET d = {j / 8}, t = NOW(3) WHERE code = 's{i:02d}'",
            f"DELETE FROM s WHERE code = 's{i:02d}'",
            f"INSERT INTO bag VALUES ({i % 4}, {rng.choice(['NULL', repr('p'), repr('q')])})",
            f"INSERT INTO bag VALUES ({i % 4}, 'p'), ({i % 4}, 'p')",  # identical copies
            f"DELETE FROM bag WHERE x = {i % 4} LIMIT 1",
            f"UPDATE bag SET y = 'q' WHERE x = {i % 4} AND y <=> 'p' LIMIT 1",  # one copy becomes another's twin
            f"UPDATE bag SET x = {j % 4} WHERE x = {i % 4}",
        ]
    )


def _round(cdc: CdcEnv, rng: random.Random, number: int) -> None:
    """About 80 statements in transactions of one to four; a TRUNCATE in the middle now and then, an ALTER in
    the second round."""
    altered = number >= 2
    with cdc.admin() as conn, conn.cursor() as cur:
        if number == 2:
            cur.execute("ALTER TABLE k ADD COLUMN w VARCHAR(5) DEFAULT 'd'")
        for n in range(25):
            if n == 12 and rng.random() < 0.5:
                cur.execute(f"TRUNCATE TABLE {rng.choice(TABLES)}")
            cur.execute("BEGIN")
            for _ in range(rng.randint(1, 4)):
                cur.execute(_statement(rng, altered))
            if n == 20:
                cur.execute("UPDATE IGNORE k SET id = -1 WHERE id = 3")  # two keys swapped in one transaction
                cur.execute("UPDATE IGNORE k SET id = 3 WHERE id = 4")
                cur.execute("UPDATE IGNORE k SET id = 4 WHERE id = -1")
            cur.execute("COMMIT")


def _stage_rows(lakehouse: Lakehouse, layer: str, table: TableRef) -> list[dict]:
    opened = lakehouse.open(layer, table)
    assert opened is not None, f"{table} has no {layer} table"
    rows = read_query(opened, "SELECT * FROM t", "t")
    columns = sorted(rows.column_names)
    return sorted(rows.select(columns).to_pylist(), key=repr)


@pytest.mark.parametrize(
    ("seed", "merges"),
    [(11, "read tasks write the logs, task per table, Arrow copy on write"), (29, "Spark shuffles and cogroups, delta-rs MERGE")],
)
def test_both_engines_make_the_same_tables(
    cdc: CdcEnv, spark: object, seed: int, merges: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if merges.startswith("Spark shuffles"):
        # every table through Spark's shuffles, not the Arrow merge a task runs for a small table; and on Arrow,
        # every keyed merge through delta-rs's MERGE (the seq guard in its SQL), not the copy on write by file
        monkeypatch.setattr(current_on_spark, "SMALL_TABLE_CHANGES", -1)
        monkeypatch.setattr(current_state, "REWRITE_MAX_ROWS", -1)
        # and every change-log run's rows through the shuffle by table, not written by the tasks that read them
        monkeypatch.setattr(change_tasks, "DIRECT_MAX_BATCHES", -1)
    else:  # every change-log run written by its read tasks, a table's rows in the files of several
        monkeypatch.setattr(change_tasks, "DIRECT_MAX_BATCHES", 1000)
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "40")  # several raw batches a round, so several read tasks
    rng = random.Random(seed)
    _create(cdc, rng)
    arrow, on_spark_lakehouse = cdc.lakehouse, Lakehouse(str(tmp_path / "spark"))  # the test's own is Arrow's
    settings = source_now()
    for number in range(ROUNDS):
        if number:
            _round(cdc, rng, number)
        for lakehouse in (arrow, on_spark_lakehouse):  # the same binlog, read twice while nothing writes
            capture(settings, lakehouse)
        for lakehouse, engine in ((arrow, lambda changes: Transforms()), (on_spark_lakehouse, on_spark(lambda: spark))):
            process_new_batches(lakehouse, engine)
            apply_pending(lakehouse, engine)
        for name in TABLES:
            table = TableRef(cdc.database, name)
            for layer in (CHANGES, CURRENT):
                assert _stage_rows(arrow, layer, table) == _stage_rows(on_spark_lakehouse, layer, table), (
                    f"round {number}: {layer} of {name} differs between the engines"
                )
    if merges.startswith("read tasks"):  # a commit took a table's files from several read tasks
        log_k = on_spark_lakehouse.open(CHANGES, TableRef(cdc.database, "k"))
        assert log_k is not None and len(log_k.file_uris()) > log_k.version() + 1
    logs = {name: _stage_rows(arrow, CHANGES, TableRef(cdc.database, name)) for name in TABLES}
    ops = {r["_cdc_op"] for rows in logs.values() for r in rows}
    assert {"insert", "update", "delete", "truncate"} <= ops, ops  # the stream held what it is meant to
    assert any(r["_cdc_op"] == "update" and r["_cdc_before_key"] != r["_cdc_key"] for r in logs["k"])  # a key moved
    assert any(r["_cdc_dup"] > 0 for r in _stage_rows(arrow, CURRENT, TableRef(cdc.database, "bag")))  # twins
    for name in TABLES:
        source_rows, current = source_and_current(cdc, name)
        assert _sorted(source_rows) == _sorted(current), f"{name}: the lakehouse differs from the source"


def _sorted(rows: pa.Table) -> list[dict]:
    return sorted(rows.to_pylist(), key=repr)
