"""The MySQL/MariaDB source: connecting, checking it is set up for CDC, and where its binlog ends.

Every problem a user can fix becomes a `CdcUserError` whose one sentence names the cause and the fix.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import pymysql
import pymysql.connections
import pymysql.cursors

from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import (
    DEFAULT_SNAPSHOT_CHUNK_ROWS,
    DEMO_FLAVOURS,
    DEMO_SOURCE,
    MySQLUrl,
    SourceSettings,
    TableFilter,
)
from cdc_assets.local_source import server as local_server

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MIN_MARIADB = (10, 5)
MIN_MYSQL = (5, 7)
SAME_SERVER_ID_MARIADB = 4052  # MariaDB's error for a binlog stream ended by another replica with the same server id


class _Connection(pymysql.connections.Connection):
    """PyMySQL's connection with one TLS context per process for its default "preferred" TLS (encrypt when the
    server offers it, no certificate check): PyMySQL makes a new one for every connection, reading the system's
    CA store each time (about 20 ms), and a sync or a check connects several times."""

    _preferred: ClassVar[ssl.SSLContext | None] = None

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp:
            return super()._create_ssl_ctx(sslp)
        if _Connection._preferred is None:
            _Connection._preferred = super()._create_ssl_ctx(sslp)
        return _Connection._preferred


def connect(url: MySQLUrl, connect_timeout: int = 10) -> pymysql.Connection:
    """A connection to the source, with errors a user can fix turned into one sentence."""
    try:
        return _Connection(
            host=url.host,
            port=url.port,
            user=url.user,
            password=url.password,
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=connect_timeout,
            init_command="SET time_zone = '+00:00'",
        )
    except pymysql.err.MySQLError as exc:
        raise describe_error(exc, url) from exc


def local_source_dir(flavour: str) -> Path:
    """The demo server's directory (`.local/<flavour>`): under the working directory, else under the project
    checkout."""
    relative = local_server.demo_source_dir(flavour)
    for base in (Path.cwd(), PROJECT_ROOT):
        if (base / relative / "port").exists():
            return base / relative
    return PROJECT_ROOT / relative


class DemoServerNotRunning(CdcUserError):
    """A source without a URL reads a local demo server, and that server is not started: not a fault of a running
    source, so the binlog sensors wait for it without launching runs that would fail (defs/sensors)."""


def resolve_mysql_url(configured: str | None, demo_flavour: str = DEMO_FLAVOURS[0]) -> MySQLUrl:
    """The source URL: the configured one (CDC_MYSQL_URL), else the local demo server's (CDC_DEMO_SOURCE)."""
    if configured:
        return MySQLUrl.parse(configured)
    local = local_server.running(local_source_dir(demo_flavour))
    if local is None:
        start = "make local-source-start" + ("" if demo_flavour == DEMO_FLAVOURS[0] else f" SOURCE={demo_flavour}")
        raise DemoServerNotRunning(
            f"No source configured and the local demo {demo_flavour} server is not running: set "
            f"CDC_MYSQL_URL=mysql://user:password@host:port, or start that server with `{start}`."
        )
    return MySQLUrl.parse(local.reader_url())


def source_settings(
    mysql_url: str | None,
    server_id: int,
    tables: str | None,
    exclude_tables: str | None,
    max_batch_rows: int,
    max_batches: int | None = None,
    snapshot_chunk_rows: int = DEFAULT_SNAPSHOT_CHUNK_ROWS,
    global_read_lock: bool = False,
    column_policy: ColumnPolicy | None = None,
    demo_flavour: str = DEMO_FLAVOURS[0],
) -> SourceSettings:
    """The source's settings from their texts (BinlogResource's fields), its URL looked up when unset; a bad URL
    or table pattern raises CdcUserError with the fix."""
    return SourceSettings(
        url=resolve_mysql_url(mysql_url, demo_flavour),
        server_id=server_id,
        table_filter=TableFilter.parse(tables, exclude_tables),
        max_batch_rows=max_batch_rows,
        max_batches=max_batches,
        snapshot_chunk_rows=snapshot_chunk_rows,
        global_read_lock=global_read_lock,
        column_policy=column_policy or ColumnPolicy(),
        demo_flavour=demo_flavour,
    )


def resolved_source(settings: SourceSettings) -> SourceSettings:
    """`settings` with the local demo server's URL when CDC_MYSQL_URL was unset (core.settings.DEMO_SOURCE), looked
    up where the source is about to be read; one sentence with the fix when no source is configured or running."""
    if settings.url != DEMO_SOURCE:
        return settings
    return replace(settings, url=resolve_mysql_url(None, settings.demo_flavour))


def describe_error(exc: BaseException, url: MySQLUrl) -> CdcUserError:
    """The user-facing sentence for a connection or permission error."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    if code in (2006, 2013):  # an open connection lost: the server restarted, or the connection was killed
        return CdcUserError(
            f"The connection to the MySQL server at {url.host}:{url.port} was lost mid-way (the server restarted or "
            "the connection was killed): nothing past the last complete raw batch was recorded; run the command "
            "again once the server answers."
        )
    if code in (2003, 2005):
        return CdcUserError(
            f"Cannot reach the MySQL server at {url.host}:{url.port}: check that it is running and that "
            "CDC_MYSQL_URL has the right host and port."
        )
    if code in (1045, 1698):
        return CdcUserError(
            f"The MySQL server at {url.host}:{url.port} rejected user '{url.user}' (wrong user or password): "
            "fix the credentials in CDC_MYSQL_URL."
        )
    if code in (1227, 1142, 1044, 1370):
        return CdcUserError(
            f"User '{url.user}' lacks a privilege the pipeline needs: GRANT REPLICATION SLAVE, "
            "BINLOG MONITOR (MariaDB) or REPLICATION CLIENT (MySQL), and SELECT ON *.* TO that user."
        )
    if code == 1412:
        return CdcUserError(
            "A table's definition changed while it was being read in a consistent snapshot (a DDL or TRUNCATE ran "
            "meanwhile): run the command again."
        )
    text = str(exc.args[1] if len(exc.args) > 1 else exc).lower()
    if code == SAME_SERVER_ID_MARIADB or (code == 1236 and ("server_id" in text or "server_uuid" in text)):
        # MySQL: 1236 ending the older stream; MariaDB: 4052 ER_CONNECTION_ALREADY_EXISTS, "A slave with the same
        # server_uuid/server_id as this slave has connected to the master"
        return CdcUserError(
            "Another replica connected to the source with the same server id and the source ended this one's binlog "
            "stream: set CDC_SERVER_ID to an id no other replica uses (nothing past the last complete raw batch was "
            "recorded)."
        )
    if code == 1236:
        if "purged" in text or "could not find" in text or "not find first log" in text:
            return CdcUserError(
                "The MySQL server can no longer serve the binlog from the checkpoint (it was purged): "
                "re-initialise the lakehouse (remove its _state/, changes/ and current/), run "
                "`cdc-lakehouse snapshot`, and keep binlogs longer than the pipeline can be down."
            )
        return CdcUserError(f"The MySQL server stopped serving the binlog ({exc.args[-1]}): check its error log.")
    return CdcUserError(f"The MySQL server at {url.host}:{url.port} refused the request ({exc}).")


@dataclass(frozen=True)
class ServerInfo:
    """What the pipeline needs to know about the source."""

    flavor: str  # "mariadb" or "mysql"
    version: str
    server_id: int
    has_gtid: bool

    def to_json(self) -> dict[str, object]:
        return {"flavor": self.flavor, "version": self.version, "server_id": self.server_id}

    @property
    def logs_foreign_key_cascades(self) -> bool:
        return logs_foreign_key_cascades(self.flavor, self.version)

    @property
    def has_tagged_gtids(self) -> bool:
        return has_tagged_gtids(self.flavor, self.version)


def _variables(cur: pymysql.cursors.Cursor, names: list[str]) -> dict[str, str]:
    placeholders = ",".join(["%s"] * len(names))
    cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({placeholders})", names)
    return {name.lower(): str(value) for name, value in cur.fetchall()}


# -- what differs between server versions --------------------------------------------------------------------
# Each difference CDC feels is one function of the flavour and the version, so the choice is made in one place and
# tested without a server (the tests' own servers are MySQL 9.7 and MariaDB 10.11: the other branches run elsewhere).

_MARIADB_HANDSHAKE_PREFIX = "5.5.5-"  # MariaDB's handshake puts it before its version, for old MySQL clients


def server_version(version: str) -> tuple[str, tuple[int, int, int]]:
    """("mariadb" or "mysql", (major, minor, patch)) of a version string, as SELECT VERSION() or the connection's
    handshake (PyMySQL's `server_version`) gives it."""
    flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
    if flavor == "mariadb" and version.startswith(_MARIADB_HANDSHAKE_PREFIX):
        version = version[len(_MARIADB_HANDSHAKE_PREFIX) :]
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return flavor, (0, 0, 0)
    return flavor, (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def _mysql_from(version: str, minimum: tuple[int, int, int]) -> bool:
    flavor, number = server_version(version)
    return flavor == "mysql" and number >= minimum


def binlog_status_statement(version: str) -> str:
    """The statement that reports where the binlog ends: `SHOW BINARY LOG STATUS` from MySQL 8.2 (the only form
    from 8.4 on), `SHOW MASTER STATUS` on MySQL 8.0 and 8.1 and on MariaDB."""
    return "SHOW BINARY LOG STATUS" if _mysql_from(version, (8, 2, 0)) else "SHOW MASTER STATUS"


def logs_foreign_key_cascades(flavor: str, version: str) -> bool:
    """Whether the server writes the row changes a foreign key's ON DELETE/UPDATE CASCADE or SET NULL makes into
    the binlog: MySQL from 9.6 on (the SQL layer applies them); MySQL 8.0 and 8.4 and MariaDB apply them inside
    InnoDB, out of the binlog's sight, so they must be derived."""
    return flavor == "mysql" and _mysql_from(version, (9, 6, 0))


def has_tagged_gtids(flavor: str, version: str) -> bool:
    """Whether GTIDs may carry a tag (`uuid:tag:n`, GTID_TAGGED_LOG_EVENT, the tagged GTID set encoding): MySQL 8.3+."""
    return flavor == "mysql" and _mysql_from(version, (8, 3, 0))


def has_vector_type(flavor: str, version: str) -> bool:
    """Whether the server has the VECTOR column type: MySQL 9.0+ (MariaDB 11.7's VECTOR is another type)."""
    return flavor == "mysql" and _mysql_from(version, (9, 0, 0))


def has_transaction_compression(flavor: str, version: str) -> bool:
    """Whether the server can write zstd TRANSACTION_PAYLOAD events (binlog_transaction_compression): MySQL 8.0.20+."""
    return flavor == "mysql" and _mysql_from(version, (8, 0, 20))


@dataclass(frozen=True)
class ReplicaStatements:
    """The statements that run a replica, in the server's own terminology."""

    start: str
    stop: str
    status: str
    change_source: str  # followed by its options, named with `option_prefix` (SOURCE_HOST or MASTER_HOST, ...)
    option_prefix: str


def replica_statements(flavor: str, version: str) -> ReplicaStatements:
    """MySQL says REPLICA from 8.0.22 and CHANGE REPLICATION SOURCE from 8.0.23 (the SLAVE/MASTER forms are gone
    from 8.4); MariaDB and older MySQL say SLAVE and CHANGE MASTER."""
    replica = flavor == "mysql" and _mysql_from(version, (8, 0, 22))
    source_words = flavor == "mysql" and _mysql_from(version, (8, 0, 23))
    word = "REPLICA" if replica else "SLAVE"
    return ReplicaStatements(
        start=f"START {word}",
        stop=f"STOP {word}",
        status=f"SHOW {word} STATUS",
        change_source="CHANGE REPLICATION SOURCE TO" if source_words else "CHANGE MASTER TO",
        option_prefix="SOURCE_" if source_words else "MASTER_",
    )


def supported_flavor(version: str) -> str:
    """"mariadb" or "mysql" for a server version string (SELECT VERSION()); refuses versions too old."""
    flavor, number = server_version(version)
    minimum = MIN_MARIADB if flavor == "mariadb" else MIN_MYSQL
    if number[:2] < minimum:
        raise CdcUserError(
            f"The source runs {flavor} {version}, which is not supported: upgrade it to "
            f"{'MariaDB' if flavor == 'mariadb' else 'MySQL'} {minimum[0]}.{minimum[1]} or later."
        )
    return flavor


def preflight(conn: pymysql.Connection, url: MySQLUrl, reader_server_id: int) -> ServerInfo:
    """Check the server is set up for row-based CDC and the user may read its binlog."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        flavor = supported_flavor(version)
        names = [
            "log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "server_id",
            "gtid_mode", "gtid_binlog_pos",
        ]  # fmt: skip
        v = _variables(cur, names)
    if v.get("log_bin", "OFF").upper() not in ("ON", "1"):
        raise CdcUserError(
            "Binary logging is off on the source (log_bin=OFF): start the server with --log-bin and "
            "--binlog-format=ROW, then sync again."
        )
    if v.get("binlog_format", "").upper() != "ROW":
        raise CdcUserError(
            f"The source logs statements, not rows (binlog_format={v.get('binlog_format')}): set "
            "binlog_format=ROW in the server configuration (SET GLOBAL binlog_format='ROW' until restart)."
        )
    if v.get("binlog_row_image", "FULL").upper() != "FULL":
        raise CdcUserError(
            f"The source logs partial rows (binlog_row_image={v.get('binlog_row_image')}): set "
            "binlog_row_image=FULL in the server configuration (SET GLOBAL binlog_row_image='FULL')."
        )
    if "binlog_row_metadata" not in v:
        raise CdcUserError(
            f"The source ({flavor} {version}) cannot log column names in the binlog (binlog_row_metadata), "
            "so old events could not be read with the columns they had: upgrade it to MySQL 8.0.1+ or MariaDB 10.5+."
        )
    if v["binlog_row_metadata"].upper() != "FULL":
        raise CdcUserError(
            f"The source does not log column names (binlog_row_metadata={v['binlog_row_metadata']}): set "
            "binlog_row_metadata=FULL in the server configuration (SET GLOBAL binlog_row_metadata='FULL')."
        )
    source_id = int(v.get("server_id", "0"))
    if source_id == reader_server_id:
        raise CdcUserError(
            f"CDC_SERVER_ID={reader_server_id} is the source's own server_id: set CDC_SERVER_ID to an id "
            "no server in the replication topology uses."
        )
    _check_privileges(conn, url)
    has_gtid = bool(v.get("gtid_binlog_pos")) or v.get("gtid_mode", "OFF").upper() == "ON"
    return ServerInfo(flavor=flavor, version=version, server_id=source_id, has_gtid=has_gtid)


def _check_privileges(conn: pymysql.Connection, url: MySQLUrl) -> None:
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS FOR CURRENT_USER()")
        grants = " ".join(str(row[0]).upper() for row in cur.fetchall())
    replication = any(p in grants for p in ("ALL PRIVILEGES ON *.*", "REPLICATION SLAVE", "REPLICATION REPLICA"))
    try:
        binlog_files(conn)
        monitor = True
    except CdcUserError:
        monitor = False
    if not (replication and monitor):
        raise CdcUserError(
            f"User '{url.user}' cannot read the binlog: GRANT REPLICATION SLAVE, BINLOG MONITOR (MariaDB) or "
            "REPLICATION CLIENT (MySQL), and SELECT ON *.* TO that user."
        )


def binlog_files(conn: pymysql.Connection) -> list[tuple[str, int]]:
    """(file name, size) of every binlog the server still has, oldest first."""
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [(str(row[0]), int(row[1])) for row in cur.fetchall()]
    except pymysql.err.MySQLError as exc:
        raise CdcUserError(
            "The source cannot list its binlogs (binary logging off, or the user lacks BINLOG MONITOR / "
            "REPLICATION CLIENT): enable log_bin and grant the privilege."
        ) from exc


def binlog_status(conn: pymysql.Connection) -> tuple[BinlogPosition, str]:
    """Where the binlog ends now (always a transaction boundary), and the MySQL executed GTID set there ('' on
    MariaDB and without GTIDs), from the statement the server's version has."""
    with conn.cursor() as cur:
        cur.execute(binlog_status_statement(str(conn.server_version)))
        row = cur.fetchone()
    if not row:
        raise CdcUserError("Binary logging is off on the source (log_bin=OFF): start the server with --log-bin.")
    executed = str(row[4] or "") if len(row) > 4 else ""
    return BinlogPosition(str(row[0]), int(row[1])), executed.replace("\n", "")


def binlog_end(conn: pymysql.Connection) -> BinlogPosition:
    """Where the binlog ends now: always a transaction boundary."""
    return binlog_status(conn)[0]


def oldest_position(conn: pymysql.Connection) -> BinlogPosition:
    """The start of the oldest binlog still on the server."""
    files = binlog_files(conn)
    if not files:
        raise CdcUserError("Binary logging is off on the source (log_bin=OFF): start the server with --log-bin.")
    return BinlogPosition(files[0][0], 4)


def check_available(conn: pymysql.Connection, position: BinlogPosition) -> None:
    """Fail with the fix when the checkpoint's binlog is gone from the server, or lies past its end."""
    files = binlog_files(conn)
    names = dict(files)
    if position.log_file in names and position.log_pos <= names[position.log_file]:
        return
    newest = BinlogPosition(*files[-1]) if files else None
    if newest is not None and newest < position:
        raise CdcUserError(
            f"The checkpoint {position} lies past the end of the source's binlog ({newest}): the lakehouse was built "
            "from another server, or this one's binlog was reset (RESET MASTER); point CDC_MYSQL_URL at the server "
            "the lakehouse came from, or re-initialise the lakehouse (remove its _state/, changes/ and current/) "
            "and run `cdc-lakehouse snapshot`."
        )
    oldest = files[0][0] if files else "none"
    raise CdcUserError(
        f"The checkpoint {position} is no longer on the source (oldest binlog: {oldest}; it was purged): "
        "re-initialise the lakehouse (remove its _state/, changes/ and current/), run `cdc-lakehouse snapshot`, and "
        "keep binlogs longer (binlog_expire_logs_seconds) than the pipeline can be down."
    )


def lag_bytes(conn: pymysql.Connection, position: BinlogPosition) -> int:
    """Bytes of binlog between `position` and the end."""
    total = 0
    for name, size in binlog_files(conn):
        here = BinlogPosition(name, size)
        if here.sort_key[0] < position.sort_key[0]:
            continue
        if name == position.log_file:
            total += max(size - position.log_pos, 0)
        else:
            total += max(size - 4, 0)
    return total


# How long a lock-free consistent point on MySQL lets the transactions binlogged before its low watermark finish
# their engine commit before the read snapshot begins (see `consistent_snapshot`): MySQL writes a transaction to the
# binlog, then commits it in InnoDB, microseconds later unless the server stalls in between.
MYSQL_SETTLE_SECONDS = 1.0


@dataclass(frozen=True)
class SnapshotPoint:
    """Where a consistent read snapshot lies in the binlog: every transaction at or before `low` is visible in it,
    none after `high`. MariaDB, and MySQL under a global read lock, give one exact position (`low == high`); a
    lock-free snapshot on MySQL lies somewhere between its two watermarks."""

    low: BinlogPosition
    high: BinlogPosition
    # MySQL with GTIDs: the executed GTID sets read right before and right after the snapshot began. A transaction in
    # the first was committed in the engine before, so the snapshot sees it; one in neither was committed after, so it
    # does not; one only in the second may be seen or not.
    committed_before: str | None = None
    committed_after: str | None = None

    @property
    def exact(self) -> bool:
        return self.low == self.high

    def __str__(self) -> str:
        return str(self.high) if self.exact else f"{self.low}..{self.high}"


def _executed_gtids(cur: pymysql.cursors.Cursor) -> str:
    cur.execute("SELECT @@global.gtid_executed")
    return str(cur.fetchone()[0]).replace("\n", "")


@contextmanager
def consistent_snapshot(
    conn: pymysql.Connection, server: ServerInfo, global_read_lock: bool = False, settle_seconds: float = 0.0
) -> Iterator[SnapshotPoint]:
    """A read transaction, and where it lies in the binlog (`SnapshotPoint`), with no lock on the source.

    MariaDB reports the binlog position of a consistent snapshot itself. MySQL does not: its binlog end is read
    before (the low watermark) and after (the high one) the snapshot begins. A transaction after the high watermark
    was written to the binlog after the snapshot began, and MySQL commits in the engine only after the binlog
    write, so the snapshot cannot see it. One before the low watermark was in the binlog before the snapshot began;
    its engine commit follows within microseconds, and `settle_seconds` (a snapshot's load, where it counts) waits
    that out before the snapshot begins. No privilege beyond SELECT and REPLICATION CLIENT is needed, and no
    writer waits. `global_read_lock` (CDC_GLOBAL_READ_LOCK=on, MySQL only) instead pairs the two with a moment of
    FLUSH TABLES WITH READ LOCK, as before: exact, but it needs RELOAD and stalls every writer meanwhile.
    """
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        try:
            if server.flavor == "mariadb":
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                cur.execute("SHOW STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')")
                status = {name.lower(): value for name, value in cur.fetchall()}
                position = BinlogPosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
                point = SnapshotPoint(position, position)
            elif global_read_lock:
                cur.execute("FLUSH TABLES WITH READ LOCK")
                try:
                    position = binlog_end(conn)
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                finally:
                    cur.execute("UNLOCK TABLES")
                point = SnapshotPoint(position, position)
            else:
                low = binlog_end(conn)
                if settle_seconds:
                    time.sleep(settle_seconds)
                before = _executed_gtids(cur) if server.has_gtid else None
                cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                after = _executed_gtids(cur) if server.has_gtid else None
                point = SnapshotPoint(low, binlog_end(conn), before, after)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (1227, 1044):
                raise CdcUserError(
                    "The source user may not take a global read lock (CDC_GLOBAL_READ_LOCK=on needs RELOAD on "
                    "MySQL): GRANT RELOAD ON *.* to it, or unset CDC_GLOBAL_READ_LOCK to read without a lock."
                ) from exc
            raise
        try:
            yield point
        finally:
            cur.execute("ROLLBACK")


def source_tables(conn: pymysql.Connection, table_filter: TableFilter) -> list[TableRef]:
    """Base tables of the source that the filter includes."""
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED')")
        rows = cur.fetchall()
    return sorted((TableRef(s, t) for s, t in rows if table_filter.matches(s, t)), key=str)


class ServerCharsets:
    """The source server as the converter of charsets Python has no exact codec for (core/mysql_charsets): one
    connection, opened at the first need (most captures never have one) and closed with `close`."""

    def __init__(self, url: MySQLUrl) -> None:
        self.url = url
        self._conn: pymysql.Connection | None = None

    def _cursor(self) -> pymysql.cursors.Cursor:
        if self._conn is None:
            self._conn = connect(self.url)
        return self._conn.cursor()

    @staticmethod
    def _checked(charset: str) -> str:
        if not charset.isalnum():
            raise ValueError(f"not a charset name: {charset!r}")
        return charset

    def table(self, charset: str) -> str:
        """A single-byte charset's 256 characters as the server converts each byte to utf8mb4, in one query."""
        name = self._checked(charset)
        select = ", ".join(f"HEX(CONVERT(CONVERT(UNHEX('{b:02X}') USING {name}) USING utf8mb4))" for b in range(256))
        with self._cursor() as cur:
            cur.execute(f"SELECT {select}")
            row = cur.fetchone()
        chars = [bytes.fromhex(h or "").decode("utf-8") for h in row]
        return "".join(c if len(c) == 1 else "?" for c in chars)

    def value(self, charset: str, data: bytes) -> str:
        """One value of `charset` as the server converts it to utf8mb4."""
        with self._cursor() as cur:
            cur.execute(f"SELECT HEX(CONVERT(CONVERT(UNHEX(%s) USING {self._checked(charset)}) USING utf8mb4))", (data.hex(),))
            return bytes.fromhex(cur.fetchone()[0] or "").decode("utf-8")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
