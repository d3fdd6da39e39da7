"""SCD2 history (CDC_HISTORY_TABLES) and reads as of a point, against a real MariaDB and Delta tables.

The history table must hold, version for version, what the source row went through: checked against the
versions the statements made (values written here), with their seqs taken from the change log, and against a
plain replay of the change log. As-of reads at several points must equal what a SELECT on the source returned
at that point.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from cdc_assets.cli import main
from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import HISTORY_SEQ_KEY, max_seq, open_table, read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY
from cdc_assets.stages.history import run as history_stage
from cdc_assets.stages.history.as_of import table_as_of
from cdc_assets_tests.conftest import CdcEnv, run_cli


def _log(cdc: CdcEnv, table: str) -> list[dict]:
    log = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, table)), None)
    return read_query(log, "SELECT * FROM changes ORDER BY _cdc_seq", "changes").to_pylist()


def _history(cdc: CdcEnv, table: str) -> list[dict]:
    history = cdc.lakehouse.open(HISTORY, TableRef(cdc.database, table))
    assert history is not None
    rows = read_query(history, "SELECT * FROM history ORDER BY _cdc_valid_from_seq, id", "history")
    return rows.to_pylist()


def _source(cdc: CdcEnv, table: str, columns: str) -> list[tuple]:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {columns} FROM `{table}` ORDER BY id")
        return [tuple(r) for r in cur.fetchall()]


def _point(cdc: CdcEnv, table: str) -> tuple[int, dt.datetime]:
    """The lakehouse's newest change of the table: its seq and commit time."""
    last = _log(cdc, table)[-1]
    return last["_cdc_seq"], last["_cdc_commit_ts"]


def _rows(table, columns: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


def test_history_and_as_of_reads_follow_the_source(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.t")
    monkeypatch.setattr(history_stage, "CHANGES_PER_COMMIT", 3)  # several history commits per run, each its part
    points: list[tuple[int, dt.datetime, list[tuple], str]] = []  # seq, time, source rows, columns

    def record(columns: str) -> None:
        seq, ts = _point(cdc, "t")
        points.append((seq, ts, _source(cdc, "t", columns), columns))
        time.sleep(1.1)  # commit times have one-second resolution: the next changes fall in a later second

    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    assert cdc.sync() == 0
    record("id, v")
    cdc.execute(
        "UPDATE t SET v = 'A' WHERE id = 1",
        "DELETE FROM t WHERE id = 2",
        "INSERT INTO t VALUES (2, 'b2')",  # a re-insert: a new version of key 2
        "UPDATE t SET id = 30 WHERE id = 3",  # a key change: 3 ends (deleted), 30 begins
    )
    assert cdc.sync() == 0
    record("id, v")
    cdc.execute("ALTER TABLE t ADD COLUMN w DECIMAL(5,1) NOT NULL DEFAULT 7.5", "UPDATE t SET w = 8 WHERE id = 1")
    assert cdc.sync() == 0
    record("id, v, w")
    cdc.execute("TRUNCATE TABLE t", "INSERT INTO t VALUES (5, 'e', 1)")
    assert cdc.sync() == 0
    record("id, v, w")

    log = _log(cdc, "t")
    seq: dict[tuple, int] = {}  # the first change of each (op, id, v)
    for r in log:
        seq.setdefault((r["_cdc_op"], r["id"], r["v"]), r["_cdc_seq"])
    alter = next(r["_cdc_seq"] for r in log if r["_cdc_op"] == "alter")
    truncate = next(r["_cdc_seq"] for r in log if r["_cdc_op"] == "truncate")
    w8 = next(r["_cdc_seq"] for r in log if r["_cdc_op"] == "update" and r["w"] == Decimal("8.0"))
    expected = [  # id, v, w, from, to, deleted: every version the statements made
        (1, "a", None, seq[("insert", 1, "a")], seq[("update", 1, "A")], False),
        (2, "b", None, seq[("insert", 2, "b")], seq[("delete", 2, "b")], True),
        (3, "c", None, seq[("insert", 3, "c")], seq[("update", 30, "c")], True),
        (1, "A", None, seq[("update", 1, "A")], alter, False),
        (2, "b2", None, seq[("insert", 2, "b2")], alter, False),
        (30, "c", None, seq[("update", 30, "c")], alter, False),
        (1, "A", Decimal("7.5"), alter, w8, False),  # the ALTER's default reaches the rows already there
        (2, "b2", Decimal("7.5"), alter, truncate, True),
        (30, "c", Decimal("7.5"), alter, truncate, True),
        (1, "A", Decimal("8.0"), w8, truncate, True),
        (5, "e", Decimal("1.0"), seq[("insert", 5, "e")], None, False),
    ]
    history = _history(cdc, "t")
    got = [
        (r["id"], r["v"], r["w"], r["_cdc_valid_from_seq"], r["_cdc_valid_to_seq"], r["_cdc_deleted"]) for r in history
    ]
    assert sorted(got, key=lambda v: (v[3], v[0])) == sorted(expected, key=lambda v: (v[3], v[0]))
    times = {r["_cdc_seq"]: r["_cdc_commit_ts"] for r in log}
    for r in history:
        assert r["_cdc_valid_from"] == times[r["_cdc_valid_from_seq"]]
        assert r["_cdc_valid_to"] == (None if r["_cdc_valid_to_seq"] is None else times[r["_cdc_valid_to_seq"]])
        assert r["_cdc_is_current"] == (r["_cdc_valid_to_seq"] is None)
    history_table = cdc.lakehouse.open(HISTORY, TableRef(cdc.database, "t"))
    assert max_seq(history_table, HISTORY_SEQ_KEY) == log[-1]["_cdc_seq"]
    assert len([c for c in history_table.history() if HISTORY_SEQ_KEY in c]) > 4  # more parts than the 4 runs

    # as of each recorded point: what the source held then, from the history and from the change log alone
    name = f"{cdc.database}.t"
    for point, moment, source, columns in points:
        names = [c.strip() for c in columns.split(",")]
        for from_history in (True, False):
            by_seq = table_as_of(cdc.lakehouse, name, at_seq=point, from_history=from_history)
            assert _rows(by_seq, names) == source, (point, from_history)
        assert _rows(table_as_of(cdc.lakehouse, name, at_time=moment), names) == source
    with pytest.raises(CdcUserError, match="before the first change"):
        table_as_of(cdc.lakehouse, name, at_seq=log[0]["_cdc_seq"] - 1)
    with pytest.raises(CdcUserError, match="not in the lakehouse"):
        table_as_of(cdc.lakehouse, f"{cdc.database}.nope", at_seq=1)

    # the export command writes the as-of read as Parquet; bad input ends in one sentence, exit code 2
    second = points[1]
    target = tmp_path / "t_at_2.parquet"
    assert main(["export", name, "--as-of", f"seq:{second[0]}", "--to", str(target)]) == 0
    assert pq.read_table(target).equals(table_as_of(cdc.lakehouse, name, at_seq=second[0]))
    at_time = tmp_path / "t_at_time.parquet"
    assert main(["export", name, "--as-of", second[1].isoformat(), "--to", str(at_time)]) == 0
    assert pq.read_table(at_time).equals(pq.read_table(target))
    (tmp_path / "dir").mkdir()
    assert main(["export", name, "--as-of", "seq:1", "--to", str(tmp_path / "dir")]) == 2
    assert main(["export", name, "--as-of", "yesterday", "--to", str(tmp_path / "x.parquet")]) == 2


def test_history_is_kept_exactly_once_across_a_crash(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed between current state's commit and the history's commit, then run again: each version once."""
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.*")
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    cdc.execute("CREATE TABLE k (id INT, v INT)", "INSERT INTO k VALUES (1, 1), (1, 1), (2, 2)")  # no key
    assert cdc.sync() == 0
    cdc.execute("UPDATE t SET v = v + 10", "DELETE FROM t WHERE id = 2", "INSERT INTO t VALUES (3, 3)")
    killed = run_cli("sync", env={failpoints.ENV: "history.before_commit=exit"})
    assert killed.returncode == failpoints.EXIT_CODE, killed.stderr[-2000:]
    before = _history(cdc, "t")
    assert [(r["id"], r["v"]) for r in before] == [(1, 1), (2, 2)]  # the crash left the history where it was
    assert cdc.sync() == 0
    assert cdc.sync() == 0  # and a run with nothing new changes nothing
    got = [(r["id"], r["v"], r["_cdc_is_current"], r["_cdc_deleted"]) for r in _history(cdc, "t")]
    assert sorted(got) == [
        (1, 1, False, False),
        (1, 11, True, False),
        (2, 2, False, False),
        (2, 12, False, True),
        (3, 3, True, False),
    ]
    assert all(r.ok for r in cdc.verify())

    # a table without a primary key has no history; its as-of read replays the change log, copies and all
    cdc.execute("DELETE FROM k WHERE id = 1 LIMIT 1")
    assert not cdc.lakehouse.has_table(HISTORY, TableRef(cdc.database, "k"))
    # a run on Spark keeps the history too (it is built in the run's process)
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")
    cdc.execute("UPDATE t SET v = 21 WHERE id = 1")
    assert cdc.sync() == 0
    assert sorted((r["id"], r["v"]) for r in _history(cdc, "t") if r["_cdc_is_current"]) == [(1, 21), (3, 3)]
    keyless = table_as_of(cdc.lakehouse, f"{cdc.database}.k", at_seq=_point(cdc, "k")[0])
    assert sorted(_rows(keyless, ["id", "v"])) == sorted(_source(cdc, "k", "id, v")) == [(1, 1), (2, 2)]


def _versions(cdc: CdcEnv, table: str) -> list[tuple]:
    """The history's versions: id, v, from seq, to seq, deleted."""
    return sorted(
        (r["id"], r["v"], r["_cdc_valid_from_seq"], r["_cdc_valid_to_seq"], r["_cdc_deleted"])
        for r in _history(cdc, table)
    )


def _snapshot(cdc: CdcEnv, table: str) -> int:
    """`cdc-lakehouse snapshot` of the table; returns the seq it loaded the rows at."""
    assert main(["snapshot", f"{cdc.database}.{table}"]) == 0
    current = cdc.lakehouse.open(CURRENT, TableRef(cdc.database, table))
    assert current is not None
    [seq] = set(read_query(current, "SELECT DISTINCT _cdc_seq FROM current", "current").column(0).to_pylist())
    return seq


def test_a_snapshot_seeds_the_history(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows a snapshot loads open versions at its seq; later changes go on from them; a re-snapshot closes the
    versions of rows that changed or left meanwhile; as-of reads between a snapshot and the next change see it."""
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.s")
    monkeypatch.setattr(history_stage, "SEED_ROWS_PER_COMMIT", 2)  # several seed commits, each its part
    cdc.execute(
        "CREATE TABLE s (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE other (id INT PRIMARY KEY)",
        "INSERT INTO s VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')",
        "INSERT INTO other VALUES (1)",
    )
    monkeypatch.setenv("CDC_TABLES", f"{db}.other")  # `s`'s inserts pass the checkpoint: it has no change log
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_TABLES", f"{db}.*")
    seeded = _snapshot(cdc, "s")
    assert _versions(cdc, "s") == [(i, v, seeded, None, False) for i, v in enumerate("abcde", 1)]
    assert not cdc.lakehouse.has_table(CHANGES, TableRef(db, "s"))  # a snapshot-only table: history, no log
    time.sleep(1.1)  # commit times have one-second resolution
    after_snapshot, then = dt.datetime.now(dt.UTC), _source(cdc, "s", "id, v")
    time.sleep(1.1)
    assert _rows(table_as_of(cdc.lakehouse, f"{db}.s", at_time=after_snapshot), ["id", "v"]) == then
    assert _rows(table_as_of(cdc.lakehouse, f"{db}.s", at_seq=seeded), ["id", "v"]) == then

    cdc.execute(
        "UPDATE s SET v = 'A' WHERE id = 1",
        "DELETE FROM s WHERE id = 2",
        "UPDATE s SET id = 30 WHERE id = 3",
        "INSERT INTO s VALUES (6, 'f')",
    )
    assert cdc.sync() == 0
    seq = {(r["_cdc_op"], r["id"]): r["_cdc_seq"] for r in _log(cdc, "s")}
    replayed = [  # the seeded versions, then what the changes made of them
        (1, "a", seeded, seq[("update", 1)], False),
        (1, "A", seq[("update", 1)], None, False),
        (2, "b", seeded, seq[("delete", 2)], True),
        (3, "c", seeded, seq[("update", 30)], True),
        (4, "d", seeded, None, False),
        (5, "e", seeded, None, False),
        (6, "f", seq[("insert", 6)], None, False),
        (30, "c", seq[("update", 30)], None, False),
    ]
    assert _versions(cdc, "s") == sorted(replayed)
    name = f"{db}.s"
    assert _rows(table_as_of(cdc.lakehouse, name, at_time=after_snapshot), ["id", "v"]) == then  # still
    newest = _point(cdc, "s")[0]
    assert _rows(table_as_of(cdc.lakehouse, name, at_seq=newest, from_history=True), ["id", "v"]) == _source(cdc, "s", "id, v")

    # a re-snapshot after changes the history has not taken in: changed rows and rows gone close at its seq
    cdc.execute("UPDATE s SET v = 'D' WHERE id = 4", "DELETE FROM s WHERE id = 5")
    again = _snapshot(cdc, "s")
    expected = [r for r in replayed if r[0] not in (4, 5)] + [
        (4, "d", seeded, again, False),
        (4, "D", again, None, False),
        (5, "e", seeded, again, True),
    ]
    assert _versions(cdc, "s") == sorted(expected)
    assert cdc.sync() == 0  # the changes up to the re-snapshot reach the change log, not the history again
    assert _versions(cdc, "s") == sorted(expected)
    current = sorted((r[0], r[1]) for r in _versions(cdc, "s") if r[3] is None)
    assert current == _source(cdc, "s", "id, v")
    assert all(r.ok for r in cdc.verify())


def test_a_seed_stopped_part_way_is_done_once(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot killed before a seed commit (the CLI at the first, this process after some parts), then run
    again: one open version per row, none twice."""
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.s")
    cdc.execute("CREATE TABLE s (id INT PRIMARY KEY, v INT)")
    cdc.execute("INSERT INTO s VALUES " + ", ".join(f"({i}, {i})" for i in range(1, 8)))
    killed = run_cli("snapshot", f"{db}.s", env={failpoints.ENV: "history.before_seed_commit=exit"})
    assert killed.returncode == failpoints.EXIT_CODE, killed.stderr[-2000:]
    assert not cdc.lakehouse.has_table(HISTORY, TableRef(db, "s"))
    monkeypatch.setattr(history_stage, "SEED_ROWS_PER_COMMIT", 2)

    def stop() -> None:
        raise OSError("stopped between two seed commits")

    cdc.execute("UPDATE s SET v = 70 WHERE id = 7")
    with failpoints.arm("history.before_seed_commit", stop, on_hit=3):
        assert main(["snapshot", f"{db}.s"]) != 0
    current = cdc.lakehouse.open(CURRENT, TableRef(db, "s"))
    [stopped] = set(read_query(current, "SELECT DISTINCT _cdc_seq FROM current", "current").column(0).to_pylist())
    assert len(_history(cdc, "s")) == 4  # two parts committed
    cdc.execute("UPDATE s SET v = 50 WHERE id = 5")  # a row of a part not committed yet
    seeded = _snapshot(cdc, "s")
    cdc.execute("UPDATE s SET v = 10 WHERE id = 1")
    assert cdc.sync() == 0
    assert _snapshot(cdc, "s") > seeded  # a snapshot with nothing changed closes nothing and opens nothing
    got = _versions(cdc, "s")
    update = _log(cdc, "s")[-1]["_cdc_seq"]
    assert len({(r[0], r[2]) for r in got}) == len(got) == 8  # no version twice
    assert sorted((r[0], r[1]) for r in got if r[3] is None) == _source(cdc, "s", "id, v")
    first = {r[0]: r[2] for r in got if r[2] != update}
    assert sorted(first.values()).count(stopped) == 4 and sorted(first.values()).count(seeded) == 3  # by part
    assert (1, 1, first[1], update, False) in got and (1, 10, update, None, False) in got
    assert (7, 70, first[7], None, False) in got and (5, 50, seeded, None, False) in got
