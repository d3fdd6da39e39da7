"""A dedicated MariaDB or Oracle MySQL with a ROW binlog, for the demo, `make dev` and the tests.

It never touches a server the machine may already run: it gets its own data directory, socket and a free port on
127.0.0.1. Starting is idempotent: a running instance is reused. MariaDB comes from Debian's package; MySQL from the
project's own unpacked copy (`mysql_dist`). The CDC reader gets exactly the grants RDS and Aurora give a CDC user.
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

from cdc_assets.core.settings import DEMO_FLAVOURS, demo_flavour_of
from cdc_assets.local_source import mysql_dist
from cdc_assets.local_source.processes import free_port, pid_alive, port_is_free, terminate

READER_USER = "cdc_reader"
MARIADB = "mariadb"
MYSQL = "mysql"
FLAVOURS = DEMO_FLAVOURS  # (MARIADB, MYSQL)
DEFAULT_BASE_DIR = Path(".local") / "mariadb"
DEMO_SOURCE_ENV = "CDC_DEMO_SOURCE"  # which flavour the demo, `make dev` and `make workload` run (`make ... SOURCE=`)
# The reader's grants on each flavour: what RDS and Aurora give a CDC user (MariaDB names the monitor privilege
# BINLOG MONITOR), and nothing that takes a global read lock (no RELOAD, no SUPER).
READER_GRANTS = {
    MARIADB: "REPLICATION SLAVE, BINLOG MONITOR, SELECT",
    MYSQL: "REPLICATION SLAVE, REPLICATION CLIENT, SELECT",
}
# The server id of the source; the reader uses a different one (see settings.DEFAULT_SERVER_ID).
SOURCE_SERVER_ID = 1


@dataclass(frozen=True)
class LocalServer:
    """Where a running local server can be reached, and which flavour it is."""

    base_dir: Path
    port: int
    flavour: str = MARIADB

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
        """A root connection over the unix socket, for loading schemas and running workloads. Without TLS, which a
        local socket does not need: PyMySQL's default would build a TLS context for each connection, reading the
        system's CA store (about 40 ms a connection: 5% of the time of test modules that connect once per statement)."""
        return pymysql.connect(
            unix_socket=str(self.socket_path),
            user="root",
            password="",
            database=database,
            charset="utf8mb4",
            autocommit=autocommit,
            ssl_disabled=True,
        )


def demo_flavour() -> str:
    """The flavour `python -m cdc_assets.local_source` manages (`make local-source-start SOURCE=`, `make workload`)."""
    return demo_flavour_of(os.environ.get(DEMO_SOURCE_ENV))


def demo_source_dir(flavour: str | None = None) -> Path:
    """Where a demo server lives, relative to the checkout: `.local/mariadb` or `.local/mysql` (default: the
    flavour of CDC_DEMO_SOURCE)."""
    return Path(".local") / (flavour or demo_flavour())


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


def _flavour_of(base_dir: Path) -> str:
    flavour_file = base_dir / "flavour"
    return flavour_file.read_text().strip() if flavour_file.exists() else MARIADB


def _initialise(
    flavour: str, data_dir: Path, as_root: list[str], log_path: Path, tmp_dir: Path | None = None, attempts: int = 2
) -> None:
    """A new data directory: root on the socket with an empty password, no test database.

    The initialising server keeps its temporary files in `tmp_dir` (the server's own, see `_server_command`): a
    server starting beside it in a shared /tmp removes every #sql* file there.

    The initialiser's output goes to `log_path`, and a failed run is tried once more on a fresh directory: one failed
    initialisation on a busy machine (CI, three workers starting servers at once) must not error a third of the suite
    with nothing saying why."""
    if flavour == MARIADB:
        command = [
            _find_binary("mariadb-install-db"), "--no-defaults", *as_root, f"--datadir={data_dir}",
            "--auth-root-authentication-method=normal", "--skip-test-db",
        ]  # fmt: skip  (the script hands the options it does not know, --tmpdir, to the server)
    else:
        command = [*mysql_dist.mysqld_command(), *as_root, "--initialize-insecure", f"--datadir={data_dir}"]
    if tmp_dir is not None:
        command.append(f"--tmpdir={tmp_dir}")
    for attempt in range(1, attempts + 1):
        shutil.rmtree(data_dir, ignore_errors=True)
        with open(log_path, "ab") as log:
            log.write(f"--- initialising {data_dir} (attempt {attempt}): {' '.join(command)}\n".encode())
            log.flush()
            returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        if returncode == 0:
            return
    shutil.rmtree(data_dir, ignore_errors=True)  # a half-made directory would pass for a made one at the next start
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    raise RuntimeError(
        f"Initialising the local {flavour} server's data directory failed {attempts} times (exit {returncode}): "
        f"see {log_path}. Its last lines:\n{tail}"
    )


def _server_command(flavour: str, server: LocalServer, data_dir: Path, server_id: int, binlog: bool) -> list[str]:
    base_dir = server.base_dir
    common = [
        f"--datadir={data_dir}",
        f"--port={server.port}",
        "--bind-address=127.0.0.1",
        f"--socket={server.socket_path}",
        f"--pid-file={base_dir / 'mysqld.pid'}",
        f"--log-error={base_dir / 'mysqld.err'}",
        # a tmpdir of its own: a starting server removes every #sql* file in its tmpdir, another server's temporary
        # tables among them when they share /tmp (the other's query then fails)
        f"--tmpdir={base_dir / 'tmp'}",
        f"--server-id={server_id}",
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_unicode_ci",
        "--innodb-buffer-pool-size=128M",
        "--skip-name-resolve",
    ]
    row_binlog = [
        f"--log-bin={data_dir / 'binlog' / 'mysql-bin'}",
        "--binlog-format=ROW",
        "--binlog-row-image=FULL",
        "--binlog-row-metadata=FULL",
    ]
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    if flavour == MARIADB:
        # A replica's binlog holds what it replicates too: a failover target.
        return [_find_binary("mariadbd"), "--no-defaults", *as_root, *common,
                *([*row_binlog, "--log-slave-updates"] if binlog else [])]  # fmt: skip
    return [
        *mysql_dist.mysqld_command(), *as_root, *common,
        "--secure-file-priv=",  # the default names /var/lib/mysql-files, which does not exist: the server aborts
        "--mysqlx=OFF",
        "--performance-schema=OFF",  # ~400 MB less on a 2-core test machine; nothing here reads it
        *([*row_binlog, "--gtid-mode=ON", "--enforce-gtid-consistency=ON", "--log-replica-updates"]
          if binlog else ["--skip-log-bin"]),  # MySQL logs a binlog unless told not to
    ]  # fmt: skip


def start(
    base_dir: Path = DEFAULT_BASE_DIR,
    port: int | None = None,
    timeout_s: float = 60.0,
    binlog: bool = True,
    server_id: int = SOURCE_SERVER_ID,
    flavour: str | None = None,
) -> LocalServer:
    """Start (or reuse) the dedicated server under `base_dir` and make sure the reader user exists.

    `flavour` is `mariadb` or `mysql`; None keeps the one the directory already holds (MariaDB for a new one).
    `binlog=False` starts it without a binary log, as a server not set up for CDC (for the preflight tests).
    """
    base_dir = Path(base_dir).resolve()
    data_dir = base_dir / "data"
    port_file = base_dir / "port"
    pid_file = base_dir / "mysqld.pid"
    if flavour is not None and flavour not in FLAVOURS:
        raise ValueError(f"unknown server flavour {flavour!r}: use one of {', '.join(FLAVOURS)}")
    if (data_dir / "mysql").exists() and flavour is not None and _flavour_of(base_dir) != flavour:
        raise RuntimeError(
            f"{base_dir} holds a {_flavour_of(base_dir)} server, not {flavour}: stop it and remove the folder first."
        )
    flavour = flavour or _flavour_of(base_dir)

    if pid_alive(pid_file) and port_file.exists():
        server = LocalServer(base_dir, int(port_file.read_text()), flavour)
        if _answers(server):
            return server

    base_dir.mkdir(parents=True, exist_ok=True)
    (base_dir / "tmp").mkdir(exist_ok=True)
    if not (data_dir / "mysql").exists():
        as_root = ["--user=root"] if os.geteuid() == 0 else []
        _initialise(flavour, data_dir, as_root, base_dir / "initialise.log", tmp_dir=base_dir / "tmp")
        (base_dir / "reader.password").unlink(missing_ok=True)
        (base_dir / "instance_id").unlink(missing_ok=True)
        (base_dir / "flavour").write_text(flavour + "\n")
    instance_file = base_dir / "instance_id"
    if not instance_file.exists():  # names this data directory's binlog history (see the demo's guard)
        instance_file.write_text(uuid.uuid4().hex + "\n")
    (data_dir / "binlog").mkdir(exist_ok=True)

    if port is None:
        previous = int(port_file.read_text()) if port_file.exists() else None
        port = previous if previous and port_is_free(previous) else free_port()
    port_file.write_text(str(port))
    server = LocalServer(base_dir, port, flavour)

    log = open(base_dir / "mysqld.log", "ab")  # noqa: SIM115 - handed to the server process
    process = subprocess.Popen(
        _server_command(flavour, server, data_dir, server_id, binlog),
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while not _answers(server):
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(
                f"The local {flavour} server did not answer within {timeout_s:.0f}s: see {base_dir / 'mysqld.err'}."
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
        cur.execute(f"GRANT {READER_GRANTS[server.flavour]} ON *.* TO '{READER_USER}'@'127.0.0.1'")
    fd = os.open(server.reader_password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")


def start_replica(primary: LocalServer, base_dir: Path, server_id: int = 2, timeout_s: float = 60.0) -> LocalServer:
    """A second dedicated server of the primary's flavour under `base_dir`, on a free port, replicating `primary` by
    GTID from its first transaction (MariaDB: `MASTER_USE_GTID=slave_pos`; MySQL: `SOURCE_AUTO_POSITION=1`), with a
    binlog of its own that holds the same GTIDs at its own files and offsets: what a failover points capture at. It
    replicates as the primary's CDC reader (REPLICATION SLAVE)."""
    replica = start(base_dir, timeout_s=timeout_s, server_id=server_id, flavour=primary.flavour)
    password = primary.reader_password_file.read_text().strip()
    with replica.admin_connection() as conn, conn.cursor() as cur:
        if primary.flavour == MARIADB:
            cur.execute("SHOW SLAVE STATUS")
            if cur.fetchone() is None:
                cur.execute(
                    "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER=%s, MASTER_PASSWORD=%s, "
                    "MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                    (primary.port, READER_USER, password),
                )
            cur.execute("START SLAVE")
        else:
            cur.execute("SHOW REPLICA STATUS")
            if cur.fetchone() is None:
                cur.execute(
                    "CHANGE REPLICATION SOURCE TO SOURCE_HOST='127.0.0.1', SOURCE_PORT=%s, SOURCE_USER=%s, "
                    "SOURCE_PASSWORD=%s, SOURCE_AUTO_POSITION=1, GET_SOURCE_PUBLIC_KEY=1, SOURCE_CONNECT_RETRY=1",
                    (primary.port, READER_USER, password),
                )
            cur.execute("START REPLICA")
    return replica


def wait_caught_up(replica: LocalServer, primary: LocalServer, timeout_s: float = 30.0) -> str:
    """Wait until `replica` has applied everything `primary` has binlogged now; returns that GTID position (set)."""
    mariadb = primary.flavour == MARIADB
    with primary.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@global.gtid_binlog_pos" if mariadb else "SELECT @@global.gtid_executed")
        position = str(cur.fetchone()[0]).replace("\n", "")
    wait = "SELECT MASTER_GTID_WAIT(%s, %s)" if mariadb else "SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, %s)"
    with replica.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(wait, (position, timeout_s))
        if cur.fetchone()[0] != 0:
            raise RuntimeError(f"The replica under {replica.base_dir} did not reach {position} in {timeout_s:.0f}s.")
    return position


def running(base_dir: Path = DEFAULT_BASE_DIR) -> LocalServer | None:
    """The server under `base_dir` if it is up, else None."""
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if not port_file.exists() or not pid_alive(base_dir / "mysqld.pid"):
        return None
    server = LocalServer(base_dir, int(port_file.read_text()), _flavour_of(base_dir))
    return server if _answers(server) else None


def stop(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 30.0) -> bool:
    """Stop the server under `base_dir`; True if one was running."""
    pid_file = Path(base_dir).resolve() / "mysqld.pid"
    pid = pid_alive(pid_file)
    if pid is None:
        return False
    terminate(pid, timeout_s)
    return True
