"""What differs between MySQL 8.0, 8.4, 9.x and MariaDB, chosen by the server's version (`source.server`): each choice
as a pure function of the version string, for the versions the tests' servers are not; and the path of the servers
they are (MySQL 9.7, MariaDB 10.11) exercised for real."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from cdc_assets.local_source.server import MARIADB as MARIADB_FLAVOUR
from cdc_assets.local_source.server import LocalServer, _initialise
from cdc_assets.source.server import (
    binlog_status,
    binlog_status_statement,
    has_tagged_gtids,
    has_transaction_compression,
    has_vector_type,
    logs_foreign_key_cascades,
    replica_statements,
    server_version,
)

MYSQL_80 = "8.0.36"
MYSQL_81 = "8.1.0"
MYSQL_82 = "8.2.0"
MYSQL_84 = "8.4.3-log"
MYSQL_95 = "9.5.0"
MYSQL_96 = "9.6.0"
MYSQL_97 = "9.7.4-2"  # Debian's build, as the tests' server reports it
MARIADB = "10.11.19-MariaDB-0+deb12u1-log"
MARIADB_HANDSHAKE = "5.5.5-10.11.19-MariaDB-0+deb12u1-log"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (MYSQL_80, ("mysql", (8, 0, 36))),
        (MYSQL_84, ("mysql", (8, 4, 3))),
        (MYSQL_97, ("mysql", (9, 7, 4))),
        ("8.0.20-aurora", ("mysql", (8, 0, 20))),
        (MARIADB, ("mariadb", (10, 11, 19))),
        (MARIADB_HANDSHAKE, ("mariadb", (10, 11, 19))),  # not 5.5.5
        ("11.4.2-MariaDB", ("mariadb", (11, 4, 2))),
    ],
)
def test_server_version_reads_the_flavour_and_number(text: str, parsed: tuple) -> None:
    assert server_version(text) == parsed


@pytest.mark.parametrize(
    ("version", "statement"),
    [
        (MYSQL_80, "SHOW MASTER STATUS"),
        (MYSQL_81, "SHOW MASTER STATUS"),
        (MYSQL_82, "SHOW BINARY LOG STATUS"),
        (MYSQL_84, "SHOW BINARY LOG STATUS"),  # SHOW MASTER STATUS is gone from 8.4
        (MYSQL_97, "SHOW BINARY LOG STATUS"),
        (MARIADB, "SHOW MASTER STATUS"),
        (MARIADB_HANDSHAKE, "SHOW MASTER STATUS"),
    ],
)
def test_the_binlog_status_statement_follows_the_version(version: str, statement: str) -> None:
    assert binlog_status_statement(version) == statement


@pytest.mark.parametrize(
    ("flavor", "version", "cascades", "tags", "vector", "compression"),
    [
        ("mysql", "8.0.19", False, False, False, False),
        ("mysql", MYSQL_80, False, False, False, True),
        ("mysql", "8.0.20", False, False, False, True),
        ("mysql", "8.2.0", False, False, False, True),
        ("mysql", "8.3.0", False, True, False, True),
        ("mysql", MYSQL_84, False, True, False, True),
        ("mysql", "9.0.1", False, True, True, True),
        ("mysql", MYSQL_95, False, True, True, True),
        ("mysql", MYSQL_96, True, True, True, True),
        ("mysql", MYSQL_97, True, True, True, True),
        ("mariadb", MARIADB, False, False, False, False),
        ("mariadb", "11.8.1-MariaDB", False, False, False, False),
    ],
)
def test_what_each_version_logs(
    flavor: str, version: str, cascades: bool, tags: bool, vector: bool, compression: bool
) -> None:
    assert logs_foreign_key_cascades(flavor, version) is cascades
    assert has_tagged_gtids(flavor, version) is tags
    assert has_vector_type(flavor, version) is vector
    assert has_transaction_compression(flavor, version) is compression


@pytest.mark.parametrize(
    ("flavor", "version", "stop", "status", "change"),
    [
        ("mysql", "8.0.21", "STOP SLAVE", "SHOW SLAVE STATUS", "CHANGE MASTER TO"),
        ("mysql", "8.0.22", "STOP REPLICA", "SHOW REPLICA STATUS", "CHANGE MASTER TO"),
        ("mysql", "8.0.23", "STOP REPLICA", "SHOW REPLICA STATUS", "CHANGE REPLICATION SOURCE TO"),
        ("mysql", MYSQL_84, "STOP REPLICA", "SHOW REPLICA STATUS", "CHANGE REPLICATION SOURCE TO"),
        ("mysql", MYSQL_97, "STOP REPLICA", "SHOW REPLICA STATUS", "CHANGE REPLICATION SOURCE TO"),
        ("mariadb", MARIADB, "STOP SLAVE", "SHOW SLAVE STATUS", "CHANGE MASTER TO"),
    ],
)
def test_replication_terminology_follows_the_version(
    flavor: str, version: str, stop: str, status: str, change: str
) -> None:
    statements = replica_statements(flavor, version)
    assert (statements.stop, statements.status, statements.change_source) == (stop, status, change)
    assert statements.start == stop.replace("STOP", "START")
    assert statements.option_prefix == ("SOURCE_" if "SOURCE" in change else "MASTER_")


@pytest.mark.both_sources
def test_the_binlog_end_is_read_with_the_statement_the_server_has(source: LocalServer) -> None:
    """On MySQL 9.7 only SHOW BINARY LOG STATUS exists, on MariaDB only SHOW MASTER STATUS: the one chosen by the
    handshake's version answers, with the executed GTID set on MySQL."""
    with source.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS version_probe")  # a transaction, so GTIDs are executed
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        assert server_version(str(conn.server_version)) == server_version(version)
        other = "SHOW MASTER STATUS" if source.flavour == "mysql" else "SHOW BINARY LOG STATUS"
        with pytest.raises(pymysql.err.ProgrammingError):
            cur.execute(other)
        end, executed = binlog_status(conn)
        cur.execute(binlog_status_statement(version))
        row = cur.fetchone()
        assert (end.log_file, end.log_pos) == (row[0], int(row[1]))
        if source.flavour == "mysql":
            cur.execute("SELECT @@global.gtid_executed")
            assert executed == str(cur.fetchone()[0]).replace("\n", "") and executed
        else:
            assert executed == ""


@pytest.mark.both_sources
def test_each_local_server_keeps_its_temporary_tables_in_a_tmpdir_of_its_own(source: LocalServer) -> None:
    """A starting server removes every #sql* file in its tmpdir: with /tmp shared, a replica or a benchmark's server
    starting removed the session server's temporary tables in the middle of a query (`Error on delete of
    '/tmp/#sql-temptable-…'`)."""
    with source.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@tmpdir")
        assert Path(str(cur.fetchone()[0])).resolve() == (source.base_dir / "tmp").resolve()


def test_a_failed_initialisation_is_tried_again_and_says_why(tmp_path: Path) -> None:
    """CI once errored a worker's every MariaDB test on `mariadb-install-db` exiting 1, with its output thrown away.
    The initialiser now runs twice before giving up, and the error quotes its log."""
    in_a_file = tmp_path / "a-file"
    in_a_file.write_text("not a directory\n")
    log = tmp_path / "initialise.log"
    with pytest.raises(RuntimeError, match="failed 2 times") as raised:
        _initialise(MARIADB_FLAVOUR, in_a_file / "data", [], log)
    assert str(log) in str(raised.value)
    assert log.read_text().count("--- initialising") == 2
    assert len(str(raised.value).splitlines()) > 1  # the log's last lines, not only a pointer to it
