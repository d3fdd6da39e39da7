"""GTID failover: capture pointed at a replica mid-stream continues from the checkpoint's GTID position, in the
replica's own binlog, with nothing lost or repeated, on both flavours (MariaDB: the last GTID of each domain; MySQL:
the executed GTID set, tagged transactions included, found in the replica's binlog by a GTID dump as a replica with
auto-position asks). Both servers are the project's own (cdc_assets.local_source)."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_assets import cli
from cdc_assets.cli import main
from cdc_assets.commands.runs import run_verify
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import HISTORY_SEQ_KEY, max_seq, read_query
from cdc_assets.lake.layout import ARCHIVE, HISTORY
from cdc_assets.lake.raw_batches import MANIFEST_FILE, list_batches, read_manifest, read_rows
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server
from cdc_assets.source.server import binlog_end, replica_statements
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.stage_runs import capture_and_apply, source_and_current
from cdc_assets_tests.test_pipeline import _all_change_seqs, _raw_seqs

DATABASE = "failover"


@pytest.fixture(scope="module", params=local_server.FLAVOURS)
def primary_and_replica(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[local_server.LocalServer, ...]]:
    base = tmp_path_factory.mktemp(f"failover_{request.param}")
    primary = local_server.start(base / "primary", flavour=request.param)
    replica = local_server.start_replica(primary, base / "replica")
    yield primary, replica
    local_server.stop(base / "replica")
    local_server.stop(base / "primary")


def _replication(server: local_server.LocalServer, action: str) -> None:
    """START or STOP the replica, in the words its version has."""
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        statements = replica_statements(server.flavour, str(cur.fetchone()[0]))
        cur.execute(statements.start if action == "start" else statements.stop)


def _write(server: local_server.LocalServer, first: int, count: int) -> None:
    """Inserts, updates and deletes; on MySQL every third transaction under a GTID tag."""
    mysql = server.flavour == local_server.MYSQL
    with server.admin_connection(database=DATABASE) as conn, conn.cursor() as cur:
        for i in range(first, first + count):
            if mysql:
                cur.execute(f"SET gtid_next = 'AUTOMATIC{':' + ('ledger' if i % 2 else 'audit') if i % 3 == 0 else ''}'")
            cur.execute("INSERT INTO acct VALUES (%s, %s, %s)", (i, f"owner {i} ✅", i))
            if i % 3 == 0:
                cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (i // 2,))
            if i % 7 == 0:
                cur.execute("DELETE FROM acct WHERE id = %s", (i // 3,))
        if mysql:
            cur.execute("SET gtid_next = 'AUTOMATIC'")


def _sync(env: CdcEnv) -> None:
    """A sync that must succeed. On MySQL its checks cannot take their consistent point with the test reader's grants
    yet (stage_runs): there the same capture and stages run without them."""
    if env.server.flavour == local_server.MYSQL:
        capture_and_apply(env)
    else:
        assert main(["sync"]) == 0


def _executed(server: local_server.LocalServer) -> str:
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@global.gtid_binlog_pos" if server.flavour == local_server.MARIADB else "SELECT @@global.gtid_executed")
        return str(cur.fetchone()[0]).replace("\n", "")


def _env(server: local_server.LocalServer, lakehouse: Path, monkeypatch: pytest.MonkeyPatch) -> CdcEnv:
    monkeypatch.setenv("CDC_LAKEHOUSE", str(lakehouse))
    monkeypatch.setenv("CDC_TABLES", f"{DATABASE}.*")
    monkeypatch.setenv("CDC_MYSQL_URL", server.reader_url())
    # a lakehouse's runs have a Dagster home of their own (runtime/instance.py): the test's, beside its lakehouse
    monkeypatch.setenv("DAGSTER_HOME", str(lakehouse.parent / "dagster_home"))
    for name in ("CDC_EXCLUDE_TABLES", "CDC_SERVER_ID", "CDC_MAX_BATCH_ROWS"):
        monkeypatch.delenv(name, raising=False)
    return CdcEnv(server, DATABASE, lakehouse)


def test_capture_follows_a_failover_to_a_gtid_replica_exactly_once(
    primary_and_replica: tuple[local_server.LocalServer, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    primary, replica = primary_and_replica
    mysql = primary.flavour == local_server.MYSQL
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {DATABASE}")
        cur.execute(f"CREATE TABLE {DATABASE}.acct (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)")
    env = _env(primary, tmp_path / "lakehouse", monkeypatch)

    _write(primary, 0, 40)
    _sync(env)
    _replication(replica, "stop")  # the replica falls behind
    _write(primary, 40, 30)
    _sync(env)
    before = load_checkpoint(env.lakehouse.store)
    assert before is not None and before.server_id == 1 and before.gtid
    if mysql:  # the executed set, tags and all
        assert GtidState.parse(before.gtid) == GtidState.parse(_executed(primary)) and GtidState.parse(before.gtid).tagged
        with replica.admin_connection(database=DATABASE) as conn, conn.cursor() as cur:
            # a transaction of the replica's own (errant): it lands in its binlog before the primary's 40-69
            cur.execute("INSERT INTO acct VALUES (1000, 'written on the replica', 0)")
    else:
        assert before.gtid.startswith("0-1-")

    # A failover to a replica that lacks the checkpoint's transactions: refused, and nothing moves.
    monkeypatch.setenv("CDC_MYSQL_URL", replica.reader_url())
    capsys.readouterr()
    assert main(["sync"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is server 2, not server 1 the checkpoint was taken on" in err, err
    assert before.gtid in err and "catch up" in err
    assert load_checkpoint(env.lakehouse.store) == before
    if not mysql:  # on MySQL verify and snapshot stop earlier, at their consistent point (stage_runs): re-enable then
        assert main(["verify"]) == 2  # the checkpoint's offsets are the primary's: verify asks for the sync first
        assert "run `cdc-lakehouse sync` first, so that capture follows it by GTID, then compare" in capsys.readouterr().err
        assert main(["snapshot", f"{DATABASE}.acct"]) == 2  # so does a snapshot
        assert "then take the snapshot" in capsys.readouterr().err

    _replication(replica, "start")
    local_server.wait_caught_up(replica, primary)
    _write(primary, 70, 30)  # captured from the replica only, in its binlog under its own files and offsets
    local_server.wait_caught_up(replica, primary)
    began = time.monotonic()
    env = _env(replica, tmp_path / "lakehouse", monkeypatch)
    _sync(env)
    print(f"failover: the first sync from the replica ended in {time.monotonic() - began:.1f} s")

    after = load_checkpoint(env.lakehouse.store)
    assert after is not None and after.server_id == 2 and after.position.epoch == 1
    # exactly the replica's transactions, all of them (on MySQL its own errant one too, with the primary's 40-69
    # that followed it in its binlog skipped: they were captured from the primary)
    assert GtidState.parse(after.gtid) == GtidState.parse(_executed(replica))
    names = list_batches(env.lakehouse.store)
    assert names[-1].startswith("g0001-") and not names[0].startswith("g")  # the replica's batches sort last
    if mysql:
        source, current = source_and_current(env, "acct")
        assert current.equals(source) and 1000 in current["id"].to_pylist()
        # no transaction captured from both servers: the primary's 40-69 after the errant one were skipped
        primary_gtids, replica_gtids = _gtids_by_epoch(env)
        assert primary_gtids and replica_gtids and not primary_gtids & replica_gtids
        assert any(g.startswith(_server_uuid(replica)) for g in replica_gtids)  # the errant one
    else:
        [result] = run_verify(settings_now())
        assert result.ok and result.source_rows == result.lakehouse_rows, result.describe()
    _assert_exactly_once(env)


def _gtids_by_epoch(env: CdcEnv) -> tuple[set[str], set[str]]:
    """The GTIDs of the row changes captured from the first server, and from the one failed over to."""
    store = env.lakehouse.store
    found: tuple[set[str], set[str]] = (set(), set())
    for name in list_batches(store):
        gtids = read_rows(store, read_manifest(store, name)).column("gtid").to_pylist()
        found[name.startswith("g")].update(g for g in gtids if g)
    return found


def _server_uuid(server: local_server.LocalServer) -> str:
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@server_uuid")
        return str(cur.fetchone()[0])


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
    _replication(replica, "stop")  # a connected replica's dump thread keeps its binlog from being purged
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS purged")
        cur.execute("CREATE TABLE purged.p (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO purged.p VALUES (1)")
    env = _env(primary, tmp_path / "lakehouse", monkeypatch)
    monkeypatch.setenv("CDC_TABLES", "purged.*")
    _sync(env)
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO purged.p VALUES (2)")  # behind: in the binlog, not captured
        cur.execute("FLUSH BINARY LOGS")
        newest = binlog_end(conn).log_file
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


def _purge_to_newest(server: local_server.LocalServer) -> None:
    """Every binlog but a new one purged, as expiry purges them (PURGE BINARY LOGS)."""
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        newest = binlog_end(conn).log_file
        for _ in range(50):  # a file is purged once its transactions are in InnoDB (MariaDB's binlog checkpoint)
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            if [row[0] for row in cur.fetchall()] == [newest]:
                return
            time.sleep(0.1)
    raise AssertionError("the binlogs before the newest were not purged")


def test_following_the_purged_checkpoint_sentence_leads_to_a_clean_sync(
    primary_and_replica: tuple[local_server.LocalServer, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A user follows the sentence of a purged checkpoint word for word (issue 27, item 13): removes the folders it
    names, runs `cdc-lakehouse snapshot`; the next `sync` exits 0, verify finds the table equal and the raw batches
    are one chain. The batches of before the purge (a chain the new one does not continue: other files) are moved
    out of raw/ by the first capture of the new lakehouse and kept, whole, under archive/.

    The history (CDC_HISTORY_TABLES), which the sentence leaves in place, follows: the new lakehouse's seqs go on
    above every seq it holds (they began at 1 again, so its versions were taken as newer than every change after
    the recovery, and its rows changed or deleted in the gap stayed open), each key's open version is its row in
    the source, its versions from before the gap are kept, and the snapshot says what it cannot know: the changes
    inside the gap."""
    primary, replica = primary_and_replica
    _replication(replica, "stop")  # a connected replica's dump thread keeps its binlog from being purged
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS anew")
        cur.execute("CREATE TABLE anew.r (id INT PRIMARY KEY, note VARCHAR(20), b BLOB)")
        cur.execute("INSERT INTO anew.r VALUES (1, 'one', X'FF00FE'), (2, 'two', NULL), (3, 'three', X'C3A9')")
        cur.execute("UPDATE anew.r SET note = 'three!' WHERE id = 3")
        # the history's b holds bytes of both kinds (binary); the new lakehouse's change log only text: not narrowed
        cur.execute("ALTER TABLE anew.r MODIFY b TEXT CHARACTER SET latin1")
    lakehouse_dir = tmp_path / "lakehouse"
    _env(primary, lakehouse_dir, monkeypatch)
    monkeypatch.setenv("CDC_TABLES", "anew.*")
    monkeypatch.setenv("CDC_HISTORY_TABLES", "anew.*")
    assert main(["sync"]) == 0
    lakehouse = Lakehouse(str(lakehouse_dir))
    before = list_batches(lakehouse.store)
    known = _history_rows(lakehouse)
    known_seq = max_seq(lakehouse.open(HISTORY, TableRef("anew", "r")), HISTORY_SEQ_KEY)
    with primary.admin_connection() as conn, conn.cursor() as cur:  # in the binlog, not captured, then purged
        cur.execute("UPDATE anew.r SET note = 'behind' WHERE id = 1")
        cur.execute("DELETE FROM anew.r WHERE id = 2")
        cur.execute("INSERT INTO anew.r (id, note) VALUES (5, 'gap')")
    _purge_to_newest(primary)
    capsys.readouterr()
    assert main(["sync"]) == 2
    sentence = capsys.readouterr().err
    folders = re.search(r"remove its ([^)]*)\)", sentence)
    assert folders is not None and "run `cdc-lakehouse snapshot`" in sentence, sentence
    for folder in re.findall(r"([\w.-]+)/", folders.group(1)):
        shutil.rmtree(lakehouse_dir / folder)
    with primary.admin_connection() as conn, conn.cursor() as cur:  # after the gap, before the snapshot
        cur.execute("UPDATE anew.r SET note = 'kept' WHERE id = 1")
    with monkeypatch.context() as terminal:  # as at a terminal: the progress display, not the run's log lines
        terminal.setattr(cli, "_shows_progress", lambda args: True)
        assert main(["snapshot"]) == 0
    out = capsys.readouterr().out
    told = [line for line in out.splitlines() if "purged" in line]  # what the history cannot know: the gap
    assert len(told) == 1 and told[0].startswith("warning: anew.r: its history") and f"(seq {known_seq}," in told[0], out
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO anew.r VALUES (4, 'four', 'þ')")
        cur.execute("UPDATE anew.r SET note = 'after', b = 'ÿ' WHERE id = 3")
    capsys.readouterr()
    assert main(["sync"]) == 0, capsys.readouterr()
    results = run_verify(settings_now())
    assert [r.table for r in results] == [TableRef("anew", "r")] and all(r.ok for r in results), [r.describe() for r in results]
    source_rows, current_rows = source_and_current(CdcEnv(primary, "anew", lakehouse_dir), "r")
    assert current_rows.num_rows == 4 and current_rows.equals(source_rows)
    assert batch_chain_breaks(lakehouse) == []
    assert not set(before) & set(list_batches(lakehouse.store))
    archived = {p.parent.name for p in (lakehouse_dir / ARCHIVE).rglob(MANIFEST_FILE)}
    assert archived == set(before)  # nothing lost: the old chain's batches are kept

    history = _history_rows(lakehouse)
    chains: dict[int, list[dict]] = {}
    for version in history:
        chains.setdefault(version["id"], []).append(version)
    for chain in chains.values():  # one version after another, only the last one open
        for earlier, later in zip(chain, chain[1:], strict=False):
            assert earlier["_cdc_valid_to_seq"] is not None and earlier["_cdc_valid_to_seq"] <= later["_cdc_valid_from_seq"], chain
    open_rows = sorted((c[-1]["id"], c[-1]["note"], c[-1]["b"]) for c in chains.values() if c[-1]["_cdc_is_current"])
    text = [None if b is None else b.encode() for b in source_rows["b"].to_pylist()]  # text as its UTF-8 bytes
    assert open_rows == sorted(zip(source_rows["id"].to_pylist(), source_rows["note"].to_pylist(), text, strict=True))
    old = {(r["id"], r["note"], r["b"], r["_cdc_valid_from_seq"]) for r in known}
    assert old <= {(r["id"], r["note"], r["b"], r["_cdc_valid_from_seq"]) for r in history}  # its past is kept
    assert chains[1][0]["b"] == b"\xff\x00\xfe"  # every byte of it
    assert [r["_cdc_deleted"] for r in chains[2]] == [False, True]  # deleted in the gap: closed as deleted


def _history_rows(lakehouse: Lakehouse) -> list[dict]:
    history = lakehouse.open(HISTORY, TableRef("anew", "r"))
    assert history is not None
    return read_query(history, "SELECT * FROM history ORDER BY id, _cdc_valid_from_seq", "history").to_pylist()


def test_a_failover_target_with_transactions_without_gtids_names_the_fix(
    primary_and_replica: tuple[local_server.LocalServer, ...],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A MySQL server that went from gtid_mode OFF to ON has binlogs with anonymous transactions. When one lies where
    the GTID dump for the checkpoint's set must start (here: written in ON_PERMISSIVE, before a transaction of its
    own), MySQL refuses with its own text; capture says what it means and how to fix it. The server holds the
    checkpoint's transactions as one restored from a backup of the primary does (gtid_purged)."""
    primary, _ = primary_and_replica
    if primary.flavour != local_server.MYSQL:
        pytest.skip("MySQL's anonymous transactions (gtid_mode OFF); MariaDB's GTIDs are always on")
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS anon")
        cur.execute("CREATE TABLE IF NOT EXISTS anon.t (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO anon.t VALUES (1)")
    env = _env(primary, tmp_path / "lakehouse", monkeypatch)
    monkeypatch.setenv("CDC_TABLES", "anon.*")
    _sync(env)
    before = load_checkpoint(env.lakehouse.store)

    base = tmp_path_factory.mktemp("upgraded")
    upgraded = local_server.start(base, server_id=3, flavour=local_server.MYSQL)
    try:
        with upgraded.admin_connection() as conn, conn.cursor() as cur:
            cur.execute("SET GLOBAL gtid_mode = ON_PERMISSIVE")  # on the way from OFF to ON (a new binlog file)
            cur.execute("SET gtid_next = 'ANONYMOUS'")
            cur.execute("CREATE DATABASE old_days")  # a transaction without a GTID
            cur.execute("SET gtid_next = 'AUTOMATIC'")
            cur.execute("CREATE DATABASE own_work")  # one with a GTID of this server's, not in the checkpoint
            cur.execute("SET GLOBAL gtid_mode = ON")
            # It holds the checkpoint's transactions as a server restored from the primary's backup does.
            cur.execute("SET GLOBAL gtid_purged = %s", ("+" + str(before.gtid),))
        monkeypatch.setenv("CDC_MYSQL_URL", upgraded.reader_url())
        capsys.readouterr()
        assert main(["sync"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is server 3, not server 1 the checkpoint was taken on" in err, err
        assert "transactions without a GTID (written before its gtid_mode was ON)" in err
        assert "PURGE BINARY LOGS" in err and "Cannot replicate" not in err
        assert load_checkpoint(env.lakehouse.store) == before
    finally:
        local_server.stop(base)
