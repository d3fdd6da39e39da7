"""Every durable step crashed on purpose: a `cdc-lakehouse` process ends right there (`os._exit`, as a SIGKILL
would) while a writer keeps changing the source; the next run must end with every table equal to the source and
every change in its change log exactly once. docs/architecture.md ("Crash points") says why for each point.

One lakehouse is reused across the whole walk: each point starts from what the points before it left, as a
pipeline that crashed many times in its life would.

Each crashing command is a process of its own, forked from a server that imported the CLI, Dagster and the
definitions once (cdc_assets_tests/forked_cli.py): a fresh interpreter for each cost the walk about half its CPU.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc_assets.capture.run import capture
from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import BinlogResource
from cdc_assets.lake.delta import SMALL_FILES_BEFORE_COMPACTION
from cdc_assets.lake.layout import CHANGES, CURRENT
from cdc_assets.stages.changes.log import CHANGE_LOG_FILE_BYTES
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.rows import CURRENT_PIECE_BYTES
from cdc_assets.stages.current.run import apply_pending
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once
from cdc_assets_tests.forked_cli import CliServer
from spark_resources.engine import Transforms

# Failpoints this walk does not take, and the test that crashes or fails the pipeline there instead.
WALKED_ELSEWHERE = {
    "capture.upload_part": "test_restart.py::test_a_killed_multipart_upload_is_aborted_at_the_next_start (S3 only)",
    "snapshot.chunk_written": "test_spark_snapshot.py, test_spark_cluster.py (in a Spark executor)",
    "sinks.published_unconfirmed": "test_sinks.py (the broker stopped there)",
    "sinks.window_acknowledged": "test_sinks.py (the CLI killed there)",
    "verify.in_snapshot": "test_consistency.py (DDL in flight during a verify)",
    "history.before_commit": "test_history.py (the CLI killed there; history needs CDC_HISTORY_TABLES)",
    "history.before_seed_commit": "test_history.py::test_a_seed_stopped_part_way_is_done_once (the CLI killed there)",
    "rewrite.raw_data_written": "test_forget.py::test_a_forget_killed_at_each_failpoint_and_run_again_finishes",
    "rewrite.raw_manifest_switched": "test_forget.py::test_a_forget_killed_at_each_failpoint_and_run_again_finishes",
    "rewrite.layer_committed": "test_forget.py::test_a_forget_killed_at_each_failpoint_and_run_again_finishes",
    "rewrite.layer_vacuumed": "test_forget.py::test_a_forget_killed_at_each_failpoint_and_run_again_finishes",
    "forget.layers_rewritten": "test_forget.py::test_a_forget_killed_at_each_failpoint_and_run_again_finishes",
}

BATCH_ROWS = 40  # small raw batches: a capture writes several, so it can be stopped between two
TABLES = ["acct", "bulk", "events", "ledger", "snap", "trunc", "wide"]


class Churn:
    """The source's writer: row changes on keyed and keyless tables, in a thread while a crashing run runs."""

    def __init__(self, cdc: CdcEnv, seed: int) -> None:
        self.cdc = cdc
        self.rng = random.Random(seed)
        self.next_event = 1
        self.transactions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, transactions: int) -> None:
        with self.cdc.admin() as conn, conn.cursor() as cur:
            for _ in range(transactions):
                self._transaction(cur)

    def _transaction(self, cur) -> None:
        rng = self.rng
        cur.execute("BEGIN")
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(1, 120)
            op = rng.random()
            if op < 0.45:
                cur.execute(
                    "INSERT INTO acct (id, owner, balance) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE balance = balance + 1",
                    (k, f"owner {k} ✅", rng.randint(0, 1000)),
                )
            elif op < 0.7:
                cur.execute("UPDATE acct SET balance = balance - 1, owner = CONCAT('o', %s) WHERE id = %s", (k, k))
            elif op < 0.8:
                cur.execute("DELETE FROM acct WHERE id = %s", (k,))
            elif op < 0.9:
                cur.execute("INSERT INTO ledger (a, note) VALUES (%s, 'dup')", (k % 7,))
            elif op < 0.95:
                cur.execute("DELETE FROM ledger WHERE a = %s LIMIT 1", (k % 7,))
            else:
                cur.execute("UPDATE snap SET v = v + 1 WHERE id = %s", (k % 50,))
        cur.execute("INSERT INTO events (id, what) VALUES (%s, 'e')", (self.next_event,))
        self.next_event += 1
        cur.execute("COMMIT")
        self.transactions += 1

    def __enter__(self) -> Churn:
        self._stop.clear()

        def loop() -> None:
            with self.cdc.admin() as conn, conn.cursor() as cur:
                while not self._stop.is_set():
                    self._transaction(cur)
                    time.sleep(0.01)

        self._thread = threading.Thread(target=loop, name="churn", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)


@dataclass
class Walk:
    cdc: CdcEnv
    churn: Churn
    step: int = 0

    @property
    def db(self) -> str:
        return self.cdc.database

    def stages(self, tables: int = 1) -> None:
        """Capture and both stages, called directly on Arrow (no Dagster run, no check): a cheap way to add commits."""
        capture(BinlogResource(mysql_url=self.cdc.server.reader_url(), tables=f"{self.db}.*").settings(), self.cdc.lakehouse)
        process_new_batches(self.cdc.lakehouse, lambda _: Transforms())
        apply_pending(self.cdc.lakehouse, lambda _: Transforms())


def _rows(walk: Walk) -> None:
    walk.churn.write(6)


def _add_shape(walk: Walk) -> None:
    walk.cdc.execute(f"ALTER TABLE wide ADD COLUMN x{walk.step} INT DEFAULT {walk.step}", "INSERT INTO wide (id) VALUES (NULL)")
    _rows(walk)


def _widen_type(walk: Walk) -> None:
    walk.cdc.execute("ALTER TABLE wide MODIFY m INT", "INSERT INTO wide (id, m) VALUES (NULL, 100000)")
    _rows(walk)


def _alter(walk: Walk) -> None:
    walk.cdc.execute(f"ALTER TABLE acct ADD COLUMN c{walk.step} VARCHAR(12) DEFAULT 'v{walk.step}'")
    _rows(walk)


def _truncate(walk: Walk) -> None:
    walk.cdc.execute("TRUNCATE TABLE trunc", f"INSERT INTO trunc VALUES (1, {walk.step}), (2, {walk.step})")
    _rows(walk)


def _keyless(walk: Walk) -> None:
    walk.cdc.execute(
        "INSERT INTO ledger (a, note) VALUES (1, 'k'), (1, 'k'), (2, 'k')",
        "UPDATE ledger SET note = 'kk' WHERE a = 1 LIMIT 1",
        "DELETE FROM ledger WHERE a = 2 LIMIT 1",
    )
    _rows(walk)


def _drop(walk: Walk) -> None:
    name = f"scratch{walk.step}"
    walk.cdc.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY)", f"INSERT INTO {name} VALUES (1), (2)")
    walk.stages()
    walk.cdc.execute(f"DROP TABLE {name}")
    _rows(walk)


def _huge_transaction(walk: Walk) -> None:
    """More rows in one transaction than capture holds in memory (spool.CHUNK_ROWS): they spill to disk."""
    with walk.cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.executemany("INSERT INTO bulk VALUES (%s, 'b')", [(i,) for i in range(21_000)])
        cur.execute("DELETE FROM bulk WHERE id % 3 <> 0")
        cur.execute("COMMIT")
        cur.execute("DELETE FROM bulk")
    _rows(walk)


def _small_files(walk: Walk, layer: str, table: str, target_bytes: int) -> int:
    dt = walk.cdc.lakehouse.open(layer, TableRef(walk.db, table))
    if dt is None:
        return 0
    sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
    return int(pc.sum(pc.less(sizes, target_bytes // 2)).as_py() or 0)


def _one_short_of_compaction(walk: Walk, layer: str, target_bytes: int) -> None:
    """`events` (insert-only, rising keys: every append or merge adds one small file; in current state too, as
    its key has two columns, so new rows do not join the file below them) brought to one small file short of a
    compaction, so the next run's commit to it compacts."""
    for _ in range(3 * SMALL_FILES_BEFORE_COMPACTION):
        if _small_files(walk, layer, "events", target_bytes) >= SMALL_FILES_BEFORE_COMPACTION - 1:
            break
        walk.churn.write(1)
        walk.stages()
    assert _small_files(walk, layer, "events", target_bytes) == SMALL_FILES_BEFORE_COMPACTION - 1
    walk.churn.write(1)


def _compact_current(walk: Walk) -> None:
    _one_short_of_compaction(walk, CURRENT, CURRENT_PIECE_BYTES // 2)  # only fragments are compacted


def _compact_change_log(walk: Walk) -> None:
    _one_short_of_compaction(walk, CHANGES, CHANGE_LOG_FILE_BYTES)


@dataclass(frozen=True)
class Point:
    name: str
    prepare: Callable[[Walk], None] = _rows
    snapshot: bool = False  # the crashing run is `cdc-lakehouse snapshot` of `snap` (else `sync`)


WALK = [
    Point("capture.batch_data_written"),
    Point("capture.manifest_written"),
    Point("capture.registry_saved"),
    Point("capture.schemas_written", _add_shape),
    Point("capture.checkpoint_saved"),
    Point("capture.transaction_spilled", _huge_transaction),
    Point("changes.before_commit"),
    Point("changes.log_rewritten", _widen_type),
    Point("changes.table_appended"),
    Point("changes.appended_before_progress"),
    Point("changes.progress_partly_saved"),
    Point("current.table_merged"),
    Point("current.keyless_before_commit", _keyless),
    Point("current.truncate_before_commit", _truncate),
    Point("current.alter_before_commit", _alter),
    Point("current.altered", _alter),
    Point("current.drop_log_removed", _drop),
    Point("current.merged_before_progress"),
    Point("current.progress_partly_saved"),
    Point("current.compacting", _compact_current),
    Point("changes.compacting", _compact_change_log),
    Point("snapshot.reading", snapshot=True),
    Point("snapshot.captured", snapshot=True),
    Point("snapshot.overwritten", snapshot=True),
]


@pytest.fixture(scope="module")
def cli() -> Iterator[CliServer]:
    """The module's crashing commands, each forked from one server (started at the first)."""
    with CliServer() as server:
        yield server


def _cli(cli: CliServer, *argv: str, failpoint: str) -> subprocess.CompletedProcess[str]:
    """`cdc-lakehouse *argv` in a process of its own, ended at `failpoint` (`os._exit`, as a SIGKILL would)."""
    return cli.run(*argv, env={**os.environ, failpoints.ENV: f"{failpoint}=exit"}, timeout=300)


def _in_process(*argv: str) -> int:
    from cdc_assets.cli import main

    return main(list(argv))


def _assert_recovered(walk: Walk, point: str) -> None:
    results = walk.cdc.verify()
    compared = {str(r.table).split(".", 1)[1]: r for r in results}
    assert set(TABLES) <= set(compared), point
    assert [r.describe() for r in results if not r.ok] == [], point
    assert all(r.source_rows == r.lakehouse_rows for r in results), point
    found = check_exactly_once(walk.cdc.lakehouse)
    assert found.ok, f"after a crash at {point}: {found.describe()}"


def _set_up(cdc: CdcEnv) -> Walk:
    cdc.execute(
        "CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)",
        "CREATE TABLE ledger (a INT, note VARCHAR(10))",  # no primary key: copies are counted
        "CREATE TABLE events (id INT, what VARCHAR(10), PRIMARY KEY (id, what))",
        "CREATE TABLE trunc (id INT PRIMARY KEY, v INT)",
        "CREATE TABLE wide (id INT AUTO_INCREMENT PRIMARY KEY, m TINYINT)",
        "CREATE TABLE bulk (id INT PRIMARY KEY, v VARCHAR(4))",
        "CREATE TABLE snap (id INT PRIMARY KEY, v INT)",
        "INSERT INTO trunc VALUES (1, 0), (2, 0), (3, 0)",
        "INSERT INTO wide (m) VALUES (1), (2)",
    )
    walk = Walk(cdc, Churn(cdc, seed=15))
    walk.churn.write(20)
    assert cdc.sync() == 0
    with cdc.admin() as conn, conn.cursor() as cur:  # rows the binlog never had: only a snapshot brings them
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.executemany("INSERT INTO snap VALUES (%s, %s)", [(i, i) for i in range(50)])
    assert _in_process("snapshot", f"{cdc.database}.snap") == 0
    assert cdc.sync() == 0
    _assert_recovered(walk, "the start")
    return walk


def test_every_failpoint_is_walked_or_walked_elsewhere() -> None:
    walked = [p.name for p in WALK]
    assert len(walked) == len(set(walked))
    assert set(walked) | set(WALKED_ELSEWHERE) == failpoints.FAILPOINTS
    assert not set(walked) & set(WALKED_ELSEWHERE)


def _walk_names() -> list[str]:
    """CDC_FAILPOINT_WALK=name,name walks only those (to reproduce one point quickly)."""
    only = os.environ.get("CDC_FAILPOINT_WALK")
    return [p.name for p in WALK if not only or p.name in only.split(",")]


def test_crash_at_every_durable_step_then_restart(cdc: CdcEnv, cli: CliServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", str(BATCH_ROWS))
    walk = _set_up(cdc)
    timings = []
    for point in (p for p in WALK if p.name in _walk_names()):
        walk.step += 1
        began = time.monotonic()
        point.prepare(walk)
        argv = ("snapshot", f"{cdc.database}.snap") if point.snapshot else ("sync",)
        with walk.churn:
            crashed = _cli(cli, *argv, failpoint=point.name)
        assert crashed.returncode == failpoints.EXIT_CODE, (
            f"{point.name} was not reached (exit {crashed.returncode}): {crashed.stdout[-2000:]} {crashed.stderr[-2000:]}"
        )
        recovered_at = time.monotonic()
        if point.snapshot:
            assert _in_process(*argv) == 0, point.name
        assert cdc.sync() == 0, point.name
        _assert_recovered(walk, point.name)
        timings.append((point.name, recovered_at - began, time.monotonic() - recovered_at))
    for name, crash, recovery in timings:
        print(f"{name:40} crash run {crash:5.1f} s, recovery and checks {recovery:5.1f} s")


@pytest.mark.parametrize("point", ["current.drop_log_removed", "current.merged_before_progress"])
def test_a_crash_while_dropping_a_table_a_snapshot_loaded(cdc: CdcEnv, cli: CliServer, point: str) -> None:
    """A DROP of a table whose rows came from a snapshot, crashed after its current state went (mid-delete, or
    before the progress recorded the drop): the restart took the missing table for one removed by hand and
    refused, naming `cdc-lakehouse snapshot` of a table the source no longer has. The change log holds the
    DROP, after which nothing of the snapshot's rows matters: the restart finishes the drop."""
    db = cdc.database
    cdc.execute("CREATE TABLE keep (id INT PRIMARY KEY)", "CREATE TABLE old (id INT PRIMARY KEY, v INT)")
    assert cdc.sync() == 0
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.executemany("INSERT INTO old VALUES (%s, %s)", [(i, i) for i in range(5)])
    assert _in_process("snapshot", f"{db}.old") == 0
    cdc.execute("UPDATE old SET v = 10 WHERE id = 1", "INSERT INTO keep VALUES (1)")
    assert cdc.sync() == 0
    cdc.execute("DROP TABLE old", "INSERT INTO keep VALUES (2)")
    crashed = _cli(cli, "sync", failpoint=point)
    assert crashed.returncode == failpoints.EXIT_CODE, crashed.stderr[-2000:]
    assert not cdc.lakehouse.has_table(CURRENT, TableRef(db, "old"))
    assert cdc.sync() == 0
    results = {str(r.table): r for r in cdc.verify()}
    assert results[f"{db}.keep"].ok and results[f"{db}.keep"].compared_rows == 2
    assert all(r.ok for r in results.values()), [r.describe() for r in results.values()]
    assert check_exactly_once(cdc.lakehouse).ok
    cdc.execute("CREATE TABLE old (id INT PRIMARY KEY, v INT)", "INSERT INTO old VALUES (7, 7)")  # the name again
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
