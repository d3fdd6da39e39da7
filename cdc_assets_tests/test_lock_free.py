"""Consistent points without a lock: the checks after an apply, `verify` and snapshots run with the grants RDS and
Aurora give a CDC user, and never wait for, or make a writer wait behind, a global read lock. A global read lock is
an option the user turns on (CDC_GLOBAL_READ_LOCK=on), and then it is taken."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cdc_assets.cli import main
from cdc_assets.core.names import TableRef
from cdc_assets.stages.snapshot.loaded_tables import seq_seen_at
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

LOCK_WAIT_SECONDS = 5  # a global read lock waiting behind the held table lock gives up after this


@contextmanager
def _a_table_write_locked(cdc: CdcEnv) -> Iterator[None]:
    """A session holding LOCK TABLES ... WRITE on a table nothing captures, as a long write would: FLUSH TABLES WITH
    READ LOCK waits behind it (and every other writer would wait behind that). A lock wait gives up after
    LOCK_WAIT_SECONDS meanwhile, so a global read lock taken by mistake fails the test rather than hanging it."""
    other = f"{cdc.database}_other"
    cdc.execute(f"CREATE DATABASE IF NOT EXISTS `{other}`", f"CREATE TABLE IF NOT EXISTS `{other}`.held (id INT PRIMARY KEY)")
    with cdc.server.admin_connection() as admin, admin.cursor() as cur:
        cur.execute("SELECT @@global.lock_wait_timeout")
        previous = cur.fetchone()[0]
        cur.execute(f"SET GLOBAL lock_wait_timeout = {LOCK_WAIT_SECONDS}")
        holder = cdc.server.admin_connection()
        try:
            with holder.cursor() as held:
                held.execute(f"LOCK TABLES `{other}`.held WRITE")
            yield
        finally:
            holder.close()  # releases the table lock
            cur.execute(f"SET GLOBAL lock_wait_timeout = {previous}")


def _grant_reload(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader with RDS's grants plus RELOAD, so that a global read lock would be allowed, not refused."""
    grants = "REPLICATION SLAVE, BINLOG MONITOR" if cdc.server.flavour == "mariadb" else "REPLICATION SLAVE, REPLICATION CLIENT"
    cdc.execute(
        "DROP USER IF EXISTS 'cdc_reload'@'127.0.0.1'",
        "CREATE USER 'cdc_reload'@'127.0.0.1' IDENTIFIED BY 'reload-pw'",
        f"GRANT {grants}, SELECT, RELOAD ON *.* TO 'cdc_reload'@'127.0.0.1'",
    )
    monkeypatch.setenv("CDC_MYSQL_URL", f"mysql://cdc_reload:reload-pw@127.0.0.1:{cdc.server.port}")


def test_checks_verify_and_snapshot_never_take_a_global_read_lock(cdc: CdcEnv, monkeypatch, capsys) -> None:
    _grant_reload(cdc, monkeypatch)
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "CREATE TABLE k (v INT)")
    cdc.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')", "INSERT INTO k VALUES (1), (1)")
    with _a_table_write_locked(cdc):
        assert cdc.sync() == 0  # capture, apply and the equality checks after it
        cdc.execute("UPDATE t SET v = 'c' WHERE id = 2", "INSERT INTO k VALUES (2)")
        assert cdc.sync() == 0
        assert main(["snapshot", f"{cdc.database}.t", f"{cdc.database}.k"]) == 0  # a keyed and a keyless table
        cdc.execute("DELETE FROM t WHERE id = 1")
        assert cdc.sync() == 0
        results = cdc.verify()
    capsys.readouterr()
    assert [(str(r.table), r.ok, r.compared_rows) for r in results] == [
        (str(TableRef(cdc.database, "k")), True, 3),
        (str(TableRef(cdc.database, "t")), True, 1),
    ]


def test_a_global_read_lock_only_when_asked_for(cdc: CdcEnv, monkeypatch, capsys) -> None:
    if cdc.server.flavour == "mariadb":
        pytest.skip("MariaDB gives a consistent snapshot's position without any lock: the setting changes nothing")
    _grant_reload(cdc, monkeypatch)
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_GLOBAL_READ_LOCK", "on")
    with _a_table_write_locked(cdc):  # the lock waits behind the held table, and gives up
        assert main(["verify"]) == 2
        assert "Lock wait timeout" in capsys.readouterr().err
    assert main(["verify"]) == 0  # taken, now that nothing holds a table
    monkeypatch.setenv("CDC_GLOBAL_READ_LOCK", "maybe")
    assert main(["verify"]) == 2
    assert "CDC_GLOBAL_READ_LOCK='maybe' is not on or off" in capsys.readouterr().err


U = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def test_a_keyless_table_s_seq_is_the_last_change_its_snapshot_saw() -> None:
    """MySQL's executed GTID sets read right before and after the snapshot began sort the table's changes between
    the watermarks into seen (in the first), unseen (in neither) and unknown (only in the second)."""
    before, after = f"{U}:1-10", f"{U}:1-12"
    assert seq_seen_at([], 100, None, None) == 100  # no change between the watermarks: exact whatever the server
    assert seq_seen_at([(101, f"{U}:9"), (103, f"{U}:10")], 100, before, after) == 103  # all seen
    assert seq_seen_at([(101, f"{U}:9"), (104, f"{U}:13")], 100, before, after) == 101  # seen, then unseen
    assert seq_seen_at([(104, f"{U}:13")], 100, before, after) == 100  # none seen
    assert seq_seen_at([(101, f"{U}:9"), (102, f"{U}:11")], 100, before, after) is None  # committed as it began
    assert seq_seen_at([(101, f"{U}:13"), (102, f"{U}:9")], 100, before, after) is None  # seen after unseen
    assert seq_seen_at([(101, None)], 100, before, after) is None  # a TRUNCATE or DDL: no GTID known
    assert seq_seen_at([(101, f"{U}:9")], 100, None, None) is None  # no GTIDs (MariaDB's point is exact anyway)


def test_a_keyless_table_is_snapshot_only_at_a_point_where_it_did_not_change(cdc: CdcEnv, capsys) -> None:
    """Its copies are counted, so the point must be exact: on MySQL a lock-free snapshot lies between two watermarks,
    and the executed GTID sets read around its start tell which of the table's changes between them it saw; one
    committed just as it began is unknown, and the table is read again (MariaDB's point is exact: read once)."""
    cdc.execute("CREATE TABLE k (v INT)", "INSERT INTO k VALUES (1), (1), (2)")
    assert cdc.sync() == 0
    stop = threading.Event()

    def write() -> None:  # busy while the first point is taken (it waits a second between its watermarks), then quiet
        with cdc.admin() as conn, conn.cursor() as cur:
            for i in range(150):
                if stop.is_set():
                    break
                cur.execute("INSERT INTO k VALUES (%s)", (i % 3,))
                stop.wait(0.01)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        code = main(["snapshot", f"{cdc.database}.k"])
    finally:
        stop.set()
        writer.join()
    out = capsys.readouterr().out
    assert code == 0, out
    assert cdc.sync() == 0
    [result] = cdc.verify()
    assert result.ok and result.not_compared is None, result.describe()
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM k")
        assert result.compared_rows == cur.fetchone()[0]
