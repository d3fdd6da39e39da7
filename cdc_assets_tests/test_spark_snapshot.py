"""Snapshots on the Spark engine: tasks read primary-key chunks without a lock while the source writes, the
run process records and commits; a stopped snapshot resumes with the chunks it has not read. Each ends with
the lakehouse equal to the source."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.delta import SEED_SEQ_KEY, read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY
from cdc_assets.stages.snapshot.records import TableSnapshot, decode_key, encode_key, snapshots_in_progress
from cdc_assets_tests.conftest import CdcEnv, run_cli
from cdc_assets_tests.test_cli import _run

ROWS = 3_000


def test_a_key_survives_the_record() -> None:
    key = (7, "naïve ✅", b"\x00\xff", decimal.Decimal("-12.50"), dt.datetime(2026, 1, 2, 3, 4, 5, 6), dt.date(2026, 1, 2))
    key += (dt.timedelta(hours=-838, microseconds=1), 2.5)
    assert decode_key(encode_key(key)) == key


def create_tables(cdc: CdcEnv) -> None:
    """An integer key, a composite key with text in it, and no key at all."""
    cdc.execute(
        "CREATE TABLE ints (id INT PRIMARY KEY, n INT NOT NULL, note VARCHAR(40))",
        "CREATE TABLE texts (region VARCHAR(10), code VARCHAR(20), qty DECIMAL(9,2), PRIMARY KEY (region, code))",
        "CREATE TABLE bag (a INT, b VARCHAR(10))",
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO ints VALUES (%s, 0, 'start')", [(i,) for i in range(ROWS)])
        rows = [(f"r{i % 7}", f"Code-{i:05d} ✅", i / 4) for i in range(ROWS)]
        cur.executemany("INSERT INTO texts VALUES (%s, %s, %s)", rows)
        cur.executemany("INSERT INTO bag VALUES (%s, %s)", [(i % 5, "same") for i in range(200)])


@contextmanager
def writing(cdc: CdcEnv) -> Iterator[list[int]]:
    """Writes to every table (updates, deletes, inserts, a key moved) until the block ends."""
    stop = threading.Event()
    writes = [0]

    def write() -> None:
        with cdc.admin() as conn, conn.cursor() as cur:
            i = 0
            while not stop.is_set():
                cur.execute("UPDATE ints SET n = n + 1, note = %s WHERE id = %s", (f"w{i}", (i * 7919) % ROWS))
                cur.execute("UPDATE texts SET qty = qty + 1 WHERE region = %s AND code = %s", (f"r{i % 7}", f"Code-{(i * 31) % ROWS:05d} ✅"))
                if i % 5 == 0:
                    cur.execute("DELETE FROM ints WHERE id = %s", ((i * 104729) % ROWS,))
                    cur.execute("INSERT INTO ints VALUES (%s, 0, 'new')", (1_000_000 + i,))
                    cur.execute("UPDATE ints SET id = %s WHERE id = %s", (2_000_000 + i, (i * 15485863) % ROWS))
                    cur.execute("INSERT INTO bag VALUES (%s, 'later')", (i % 3,))
                    cur.execute("DELETE FROM bag WHERE a = %s LIMIT 1", (i % 5,))
                i += 1
                writes[0] = i
                stop.wait(0.005)  # a busy source, not a flood: the syncs after the snapshot stay short

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield writes
    finally:
        stop.set()
        writer.join()


@pytest.fixture
def spark_snapshots(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> CdcEnv:
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # every run on Spark, whatever its size
    monkeypatch.setenv("CDC_SNAPSHOT_CHUNK_ROWS", "250")
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.ints,{cdc.database}.texts")  # seeded by the snapshots
    return cdc


def _assert_equal(cdc: CdcEnv, tables: int) -> None:
    results = cdc.verify()
    assert len(results) == tables
    assert [r.describe() for r in results if not r.ok] == []


@pytest.mark.both_sources
def test_a_snapshot_on_spark_reads_chunks_while_the_source_writes(spark_snapshots: CdcEnv, capsys) -> None:
    cdc = spark_snapshots
    create_tables(cdc)
    with writing(cdc) as writes:
        code, out, err = _run(["snapshot"], capsys)
        assert code == 0, out + err
        during = writes[0]
    assert during > 20  # the source really changed while the chunks were read
    [planned] = re.findall(r"(\d+) chunks to read in 2 tables", out)  # 2 keyed tables, CDC_SNAPSHOT_CHUNK_ROWS each
    assert 2 * (ROWS // 250) - 2 <= int(planned) <= 2 * (ROWS // 250) + 2
    assert re.search(rf"{planned} of {planned} chunks read, [\d,]+ rows, [\d,]+ rows/s", out)  # progress
    ints = cdc.lakehouse.open(CURRENT, TableRef(cdc.database, "ints"))
    assert ints is not None and len(ints.file_uris()) >= ROWS // 250 - 1  # written a chunk at a time
    assert snapshots_in_progress(cdc.lakehouse.store) == []  # nothing left to resume
    assert cdc.sync() == 0
    _assert_equal(cdc, 3)
    _assert_history_follows_the_log(cdc)


def _assert_history_follows_the_log(cdc: CdcEnv) -> None:
    """The history `ints` was seeded with (CDC_HISTORY_TABLES, see `spark_snapshots`) and kept since: the rows were
    read after the snapshot's seq S while the source wrote, so each seeded version must hold its row as it was at
    S (the before-image of the key's first change after S), a key inserted after S has no seeded version, every
    later version is a change of the log, and the open versions are the source's rows."""
    table = TableRef(cdc.database, "ints")
    history = cdc.lakehouse.open(HISTORY, table)
    assert history is not None
    seed = history.transaction_version(SEED_SEQ_KEY)
    versions = read_query(history, "SELECT * FROM history", "history").to_pylist()
    log = cdc.lakehouse.open(CHANGES, table)
    changes = read_query(log, f"SELECT * FROM changes WHERE _cdc_seq > {seed} ORDER BY _cdc_seq", "changes").to_pylist()
    first: dict[int, dict] = {}  # each key's first change after S, as it concerns the key
    for c in changes:
        before = (c["_cdc_before"] or {}).get("id") if c["_cdc_op"] == "update" else None
        if before is not None:
            first.setdefault(before, {"op": "update", "image": c["_cdc_before"]})
        if c["_cdc_op"] == "delete":
            first.setdefault(c["id"], {"op": "delete", "image": c})
        elif c["id"] != before:  # an insert, or an update moving a row into this key
            first.setdefault(c["id"], {"op": "insert"})
    seeded = [v for v in versions if v["_cdc_valid_from_seq"] == seed]
    assert len(seeded) > ROWS / 2
    fixed = 0
    for v in seeded:
        change = first.get(v["id"])
        assert change is None or change["op"] != "insert", v  # a key written after S had no row at S
        if change is not None:
            assert (v["n"], v["note"]) == (change["image"]["n"], change["image"]["note"]), v
            fixed += 1
    assert fixed > 10
    seqs = {c["_cdc_seq"] for c in changes}
    assert all(v["_cdc_valid_from_seq"] in seqs for v in versions if v["_cdc_valid_from_seq"] != seed)
    assert len({(v["_cdc_key"], v["_cdc_valid_from_seq"]) for v in versions}) == len(versions)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, n, note FROM ints ORDER BY id")
        source = [tuple(r) for r in cur.fetchall()]
    assert sorted((v["id"], v["n"], v["note"]) for v in versions if v["_cdc_is_current"]) == source


def killed_mid_snapshot(env: dict[str, str], log_path: Path) -> list[TableSnapshot]:
    """`cdc-lakehouse snapshot` SIGKILLed while its Spark job is reading chunks: each Python worker of the
    executors stalls after recording its second chunk (`env` arms that failpoint for them), so some chunks are
    recorded and others are not, for certain. Returns the records of the keyed tables as the kill left them."""
    store = initialized_resources().lakehouse.get().store
    with log_path.open("w") as log:
        snapshot = subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.cli", "snapshot"],
            env={**os.environ, **env}, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not any(r.done for r in snapshots_in_progress(store)):
                assert time.monotonic() < deadline and snapshot.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(1)  # the other workers record theirs too
        finally:
            os.killpg(snapshot.pid, signal.SIGKILL)  # the driver and its JVM
            snapshot.wait()
    stopped = [r for r in snapshots_in_progress(store) if r.keyed]
    assert len(stopped) == 2
    assert 0 < sum(len(r.done) for r in stopped) < sum(r.chunks for r in stopped)
    return stopped


def assert_resumed(stopped: list[TableSnapshot], output: str, current: dict[str, set[str]]) -> None:
    """The snapshot started again said what it had read already (at least what the kill left recorded: on a
    cluster, tasks under way may still finish after their driver is killed), read the rest, and committed the
    recorded chunks' files as they were."""
    for record in stopped:
        [(read, total)] = re.findall(rf"{re.escape(str(record.table))}: resuming its snapshot, (\d+) of (\d+) chunks", output)
        assert len(record.done) <= int(read) < int(total) == record.chunks
        assert {a["path"] for actions in record.done.values() for a in actions} <= current[record.table.table]


def test_a_snapshot_killed_mid_way_resumes_with_the_chunks_it_has_not_read(spark_snapshots: CdcEnv, tmp_path: Path) -> None:
    cdc = spark_snapshots
    create_tables(cdc)
    with writing(cdc) as writes:
        stalls = {"CDC_SPARK_MASTER": "local[2]", "CDC_FAILPOINTS": "snapshot.chunk_written=sleep:600@2"}
        stopped = killed_mid_snapshot(stalls, tmp_path / "killed.log")
        resumed = run_cli("snapshot", env={"CDC_SPARK_MASTER": "local[2]"})
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
        assert writes[0] > 20  # the source changed throughout
    assert snapshots_in_progress(cdc.lakehouse.store) == []  # nothing left to resume
    assert_resumed(stopped, resumed.stdout, committed_files(cdc))
    assert cdc.sync() == 0
    _assert_equal(cdc, 3)


def committed_files(cdc: CdcEnv) -> dict[str, set[str]]:
    """The data files of each current-state table of the test's database."""
    lakehouse = initialized_resources().lakehouse.get()
    found = {}
    for table in ("ints", "texts"):
        current = lakehouse.open(CURRENT, TableRef(cdc.database, table))
        assert current is not None
        found[table] = set(current.get_add_actions(flatten=True).column("path").to_pylist())
    return found
