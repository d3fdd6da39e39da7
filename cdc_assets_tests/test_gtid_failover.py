"""GTID failover: capture pointed at a replica mid-stream continues from the checkpoint's GTID position, in the
replica's own binlog, with nothing lost or repeated. Both servers are the project's own (cdc_assets.local_source)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_assets.cli import main
from cdc_assets.defs.runs import run_verify
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_pipeline import _all_change_seqs, _raw_seqs

DATABASE = "failover"


@pytest.fixture(scope="module")
def primary_and_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[local_server.LocalServer, ...]]:
    base = tmp_path_factory.mktemp("failover")
    primary = local_server.start(base / "primary")
    replica = local_server.start_replica(primary, base / "replica")
    yield primary, replica
    local_server.stop(base / "replica")
    local_server.stop(base / "primary")


def _write(server: local_server.LocalServer, first: int, count: int) -> None:
    with server.admin_connection(database=DATABASE) as conn, conn.cursor() as cur:
        for i in range(first, first + count):
            cur.execute("INSERT INTO acct VALUES (%s, %s, %s)", (i, f"owner {i} ✅", i))
            if i % 3 == 0:
                cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (i // 2,))
            if i % 7 == 0:
                cur.execute("DELETE FROM acct WHERE id = %s", (i // 3,))


def test_capture_follows_a_failover_to_a_gtid_replica_exactly_once(
    primary_and_replica: tuple[local_server.LocalServer, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary, replica = primary_and_replica
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute(f"CREATE TABLE {DATABASE}.acct (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)")
    env = CdcEnv(primary, DATABASE, tmp_path / "lakehouse")
    monkeypatch.setenv("CDC_LAKEHOUSE", str(env.lakehouse_dir))
    monkeypatch.setenv("CDC_TABLES", f"{DATABASE}.*")
    monkeypatch.setenv("CDC_MYSQL_URL", primary.reader_url())
    for name in ("CDC_EXCLUDE_TABLES", "CDC_SERVER_ID", "CDC_MAX_BATCH_ROWS"):
        monkeypatch.delenv(name, raising=False)

    _write(primary, 0, 40)
    assert main(["sync"]) == 0
    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("STOP SLAVE")  # the replica falls behind
    _write(primary, 40, 30)
    assert main(["sync"]) == 0
    before = load_checkpoint(env.lakehouse.store)
    assert before is not None and before.server_id == 1 and before.gtid and before.gtid.startswith("0-1-")

    # A failover to a replica that lacks the checkpoint's transactions: refused, and nothing moves.
    monkeypatch.setenv("CDC_MYSQL_URL", replica.reader_url())
    capsys.readouterr()
    assert main(["sync"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is server 2, not server 1 the checkpoint was taken on" in err, err
    assert f"GTID position {before.gtid}" in err and "catch up" in err
    assert load_checkpoint(env.lakehouse.store) == before
    assert main(["verify"]) == 2  # the checkpoint's offsets are the primary's: verify asks for the sync first
    assert "run `cdc-lakehouse sync` first, so that capture follows it by GTID" in capsys.readouterr().err

    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("START SLAVE")
    local_server.wait_caught_up(replica, primary)
    _write(primary, 70, 30)  # captured from the replica only, in its binlog under its own files and offsets
    position = local_server.wait_caught_up(replica, primary)
    began = time.monotonic()
    assert main(["sync"]) == 0
    print(f"failover: the first sync from the replica ended in {time.monotonic() - began:.1f} s")

    after = load_checkpoint(env.lakehouse.store)
    assert after is not None and after.server_id == 2 and after.position.epoch == 1
    assert after.gtid == position  # exactly the primary's transactions, all of them
    names = list_batches(env.lakehouse.store)
    assert names[-1].startswith("g0001-") and not names[0].startswith("g")  # the replica's batches sort last
    [result] = run_verify()
    assert result.ok and result.source_rows == result.lakehouse_rows, result.describe()
    _assert_exactly_once(env)


def _assert_exactly_once(env: CdcEnv) -> None:
    lakehouse: Lakehouse = env.lakehouse
    assert batch_chain_breaks(lakehouse) == [] and duplicate_seqs(lakehouse) == {}
    changes = _all_change_seqs(env)
    assert changes == _raw_seqs(env) and len(set(changes)) == len(changes)
    assert changes == list(range(changes[0], changes[0] + len(changes)))  # no gap


def test_a_checkpoint_purged_while_behind_names_snapshot(
    primary_and_replica: tuple[local_server.LocalServer, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The binlog the checkpoint lies in is purged (PURGE BINARY LOGS, as expiry does) while capture is behind: one
    sentence naming `cdc-lakehouse snapshot`, and nothing written. On this module's own primary: it purges."""
    primary, replica = primary_and_replica
    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("STOP SLAVE")  # a connected replica's dump thread keeps its binlog from being purged
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS purged")
        cur.execute("CREATE TABLE purged.p (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO purged.p VALUES (1)")
    monkeypatch.setenv("CDC_LAKEHOUSE", str(tmp_path / "lakehouse"))
    monkeypatch.setenv("CDC_TABLES", "purged.*")
    monkeypatch.setenv("CDC_MYSQL_URL", primary.reader_url())
    assert main(["sync"]) == 0
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO purged.p VALUES (2)")  # behind: in the binlog, not captured
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        newest = cur.fetchone()[0]
        for _ in range(50):  # a file is purged once its transactions are in InnoDB (MariaDB's binlog checkpoint)
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            if [row[0] for row in cur.fetchall()] == [newest]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the binlog before the checkpoint's was not purged")
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    batches = list_batches(lakehouse.store)
    capsys.readouterr()
    assert main(["sync"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "purged" in err and "run `cdc-lakehouse snapshot`" in err, err
    assert list_batches(lakehouse.store) == batches
