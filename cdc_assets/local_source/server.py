"""A dedicated MariaDB with a ROW binlog, for the demo, `make dev` and the tests.

It never touches a MariaDB the machine may already run: it gets its own data directory,
socket and a free port on 127.0.0.1. Starting is idempotent: a running instance is reused.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pymysql

from cdc_assets.local_source.processes import free_port, pid_alive, port_is_free, terminate

READER_USER = "cdc_reader"
DEFAULT_BASE_DIR = Path(".local") / "mariadb"
# The server id of the source; the reader uses a different one (see settings.DEFAULT_SERVER_ID).
SOURCE_SERVER_ID = 1


@dataclass(frozen=True)
class LocalServer:
    """Where a running local MariaDB can be reached."""

    base_dir: Path
    port: int

    @property
    def socket_path(self) -> Path:
        return self.base_dir / "mysqld.sock"

    @property
    def reader_password_file(self) -> Path:
        return self.base_dir / "reader.password"

    def reader_url(self) -> str:
        """`mysql://` URL of the least-privileged CDC reader (password included: keep private)."""
        password = self.reader_password_file.read_text().strip()
        return f"mysql://{READER_USER}:{password}@127.0.0.1:{self.port}"

    def admin_connection(self, database: str | None = None, autocommit: bool = True) -> pymysql.Connection:
        """A root connection over the unix socket, for loading schemas and running workloads."""
        return pymysql.connect(
            unix_socket=str(self.socket_path),
            user="root",
            password="",
            database=database,
            charset="utf8mb4",
            autocommit=autocommit,
        )


def _find_binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if not found:
        raise RuntimeError(f"{name} is not installed: run `make install` (it installs mariadb-server).")
    return found


def _answers(server: LocalServer) -> bool:
    try:
        server.admin_connection().close()
    except pymysql.err.MySQLError:
        return False
    return True


def start(
    base_dir: Path = DEFAULT_BASE_DIR,
    port: int | None = None,
    timeout_s: float = 30.0,
    binlog: bool = True,
    server_id: int = SOURCE_SERVER_ID,
) -> LocalServer:
    """Start (or reuse) the dedicated server under `base_dir` and make sure the reader user exists.

    `binlog=False` starts it without a binary log, as a server not set up for CDC (for the preflight tests).
    """
    base_dir = Path(base_dir).resolve()
    data_dir = base_dir / "data"
    port_file = base_dir / "port"
    pid_file = base_dir / "mysqld.pid"

    if pid_alive(pid_file) and port_file.exists():
        server = LocalServer(base_dir, int(port_file.read_text()))
        if _answers(server):
            return server

    base_dir.mkdir(parents=True, exist_ok=True)
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    if not (data_dir / "mysql").exists():
        shutil.rmtree(data_dir, ignore_errors=True)
        subprocess.run(
            [
                _find_binary("mariadb-install-db"),
                "--no-defaults",
                *as_root,
                f"--datadir={data_dir}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        (base_dir / "reader.password").unlink(missing_ok=True)
        (base_dir / "instance_id").unlink(missing_ok=True)
    instance_file = base_dir / "instance_id"
    if not instance_file.exists():  # names this data directory's binlog history (see the demo's guard)
        instance_file.write_text(uuid.uuid4().hex + "\n")
    (data_dir / "binlog").mkdir(exist_ok=True)

    if port is None:
        previous = int(port_file.read_text()) if port_file.exists() else None
        port = previous if previous and port_is_free(previous) else free_port()
    port_file.write_text(str(port))
    server = LocalServer(base_dir, port)

    log = open(base_dir / "mysqld.log", "ab")  # noqa: SIM115 - handed to the server process
    subprocess.Popen(
        [
            _find_binary("mariadbd"),
            "--no-defaults",
            *as_root,
            f"--datadir={data_dir}",
            f"--port={port}",
            "--bind-address=127.0.0.1",
            f"--socket={server.socket_path}",
            f"--pid-file={pid_file}",
            f"--log-error={base_dir / 'mysqld.err'}",
            f"--server-id={server_id}",
            *(
                [
                    f"--log-bin={data_dir / 'binlog' / 'mysql-bin'}",
                    "--binlog-format=ROW",
                    "--binlog-row-image=FULL",
                    "--binlog-row-metadata=FULL",
                    "--log-slave-updates",  # a replica's binlog holds what it replicates too: a failover target
                ]
                if binlog
                else []
            ),
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            "--innodb-buffer-pool-size=128M",
            "--skip-name-resolve",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while not _answers(server):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"The local MariaDB did not answer within {timeout_s:.0f}s: see {base_dir / 'mysqld.err'}."
            )
        time.sleep(0.2)
    _ensure_reader(server)
    return server


def _ensure_reader(server: LocalServer) -> None:
    """Create the CDC reader with exactly the privileges the pipeline needs."""
    if server.reader_password_file.exists():
        return
    password = secrets.token_urlsafe(18)
    with server.admin_connection() as conn, conn.cursor() as cur:
        # Account statements carry the password: keep them out of the binlog the pipeline reads.
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"CREATE USER IF NOT EXISTS '{READER_USER}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
        cur.execute(f"ALTER USER '{READER_USER}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
        cur.execute(f"GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO '{READER_USER}'@'127.0.0.1'")
    fd = os.open(server.reader_password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")


def start_replica(primary: LocalServer, base_dir: Path, server_id: int = 2, timeout_s: float = 30.0) -> LocalServer:
    """A second dedicated server under `base_dir`, on a free port, replicating `primary` by GTID from its first
    transaction (`MASTER_USE_GTID=slave_pos`), with a binlog of its own that holds the same GTIDs at its own files
    and offsets: what a failover points capture at. It replicates as the primary's CDC reader (REPLICATION SLAVE)."""
    replica = start(base_dir, timeout_s=timeout_s, server_id=server_id)
    password = primary.reader_password_file.read_text().strip()
    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SHOW SLAVE STATUS")
        if cur.fetchone() is None:
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER=%s, MASTER_PASSWORD=%s, "
                "MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                (primary.port, READER_USER, password),
            )
        cur.execute("START SLAVE")
    return replica


def wait_caught_up(replica: LocalServer, primary: LocalServer, timeout_s: float = 30.0) -> str:
    """Wait until `replica` has applied everything `primary` has binlogged now; returns that GTID position."""
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@global.gtid_binlog_pos")
        position = str(cur.fetchone()[0])
    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout_s))
        if cur.fetchone()[0] != 0:
            raise RuntimeError(f"The replica under {replica.base_dir} did not reach {position} in {timeout_s:.0f}s.")
    return position


def running(base_dir: Path = DEFAULT_BASE_DIR) -> LocalServer | None:
    """The server under `base_dir` if it is up, else None."""
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if not port_file.exists() or not pid_alive(base_dir / "mysqld.pid"):
        return None
    server = LocalServer(base_dir, int(port_file.read_text()))
    return server if _answers(server) else None


def stop(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 30.0) -> bool:
    """Stop the server under `base_dir`; True if one was running."""
    pid_file = Path(base_dir).resolve() / "mysqld.pid"
    pid = pid_alive(pid_file)
    if pid is None:
        return False
    terminate(pid, timeout_s)
    return True
