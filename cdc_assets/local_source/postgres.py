"""A dedicated PostgreSQL server for a Dagster instance with PostgreSQL storage: the tests' and anyone's trying one.

As the local MariaDB (`server`), it never touches a server the machine may already run (Debian's cluster on 5432
is left alone): it gets its own data directory, a free port on 127.0.0.1 and its unix socket in its data directory.
Starting is idempotent: a running server is reused. It comes from Debian's `postgresql` package (`make install`
installs it). PostgreSQL refuses to run as root: as root, initdb and the server run as the `postgres` user, which
then owns the directory; as anyone else, as that user. Connections on 127.0.0.1 and the socket are trusted (no
password): a local server for one machine's tests and trials, never one to expose.

`python -m cdc_assets.local_source.postgres start|stop|url [DATABASE]` manages the one under `.local/postgres`.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_assets.local_source.processes import free_port, pid_alive, port_is_free

DEFAULT_BASE_DIR = Path(".local") / "postgres"
SUPERUSER = "postgres"
SERVICE_USER = "postgres"  # the system user the server runs as when we are root
# A server for tests and trials: no fsync (a crash of the machine may lose it; nothing here is kept for long), a
# small footprint beside the other local servers.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
}


@dataclass(frozen=True)
class LocalPostgres:
    """Where a running local PostgreSQL can be reached."""

    base_dir: Path
    port: int

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    def url(self, database: str = "postgres") -> str:
        """URL of the superuser on 127.0.0.1 (trusted: no password), as a dagster.yaml's `postgres_url` takes it: with
        the driver dagster-postgres needs, psycopg2 (SQLAlchemy 2.1 would open a plain postgresql:// with psycopg 3)."""
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> Any:
        """A connection as the superuser, in autocommit (psycopg2, dagster-postgres's driver: imported only here)."""
        import psycopg2

        connection = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=database, connect_timeout=5
        )
        connection.autocommit = True
        return connection

    def create_database(self, name: str) -> str:
        """A new, empty database `name` (dropped first when it exists); its URL."""
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
        return self.url(name)

    def execute(self, *statements: str, database: str = "postgres") -> list[tuple]:
        """Run `statements` one by one, each on its own (CREATE DATABASE takes no transaction); the last one's rows."""
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()


def bin_dir() -> Path:
    """The newest PostgreSQL of Debian's packages (`/usr/lib/postgresql/<major>/bin`)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run `make install` (it installs Debian's postgresql).")
    return found[-1].parent


def _as_server_user(command: list[str]) -> list[str]:
    """`command` as the user the server runs as: the `postgres` system user when we are root, else ourselves."""
    return ["runuser", "-u", SERVICE_USER, "--", *command] if os.geteuid() == 0 else command


def _hand_over(base_dir: Path) -> None:
    """As root, the directory belongs to the server's user, who must also reach it through its parents."""
    if os.geteuid() != 0:
        return
    account = pwd.getpwnam(SERVICE_USER)
    os.chown(base_dir, account.pw_uid, account.pw_gid)
    probe = subprocess.run(_as_server_user(["test", "-w", str(base_dir)]), check=False)
    if probe.returncode != 0:
        raise RuntimeError(
            f"The {SERVICE_USER} user cannot reach {base_dir}: PostgreSQL does not run as root, so as root its "
            "directory must be somewhere that user can open (not under a private home or /tmp/pytest-of-root)."
        )


def _answers(server: LocalPostgres) -> bool:
    import psycopg2

    try:
        server.connect().close()
    except psycopg2.OperationalError:
        return False
    return True


def _postmaster_pid(data_dir: Path) -> Path:
    """A file holding only the postmaster's pid (PostgreSQL's own postmaster.pid has more lines)."""
    pid_file = data_dir.parent / "postgres.pid"
    try:
        pid_file.write_text((data_dir / "postmaster.pid").read_text().splitlines()[0] + "\n")
    except (FileNotFoundError, IndexError):
        pid_file.unlink(missing_ok=True)
    return pid_file


def running(base_dir: Path = DEFAULT_BASE_DIR) -> LocalPostgres | None:
    """The server under `base_dir` if it is up, else None."""
    base_dir = Path(base_dir).resolve()
    port_file = base_dir / "port"
    if not port_file.exists() or not pid_alive(_postmaster_pid(base_dir / "data")):
        return None
    server = LocalPostgres(base_dir, int(port_file.read_text()))
    return server if _answers(server) else None


def start(base_dir: Path = DEFAULT_BASE_DIR, port: int | None = None, timeout_s: float = 60.0) -> LocalPostgres:
    """Start (or reuse) the dedicated server under `base_dir`."""
    base_dir = Path(base_dir).resolve()
    reused = running(base_dir)
    if reused is not None:
        return reused
    base_dir.mkdir(parents=True, exist_ok=True)
    _hand_over(base_dir)
    data_dir = base_dir / "data"
    binaries = bin_dir()
    if not (data_dir / "PG_VERSION").exists():
        shutil.rmtree(data_dir, ignore_errors=True)
        subprocess.run(
            _as_server_user([
                str(binaries / "initdb"), "-D", str(data_dir), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
                "--no-locale", "--no-sync", "--no-instructions",
            ]),
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
    port_file = base_dir / "port"
    if port is None:
        previous = int(port_file.read_text()) if port_file.exists() else None
        port = previous if previous and port_is_free(previous) else free_port()
    port_file.write_text(str(port))
    options = " ".join(
        [f"-p {port}", f"-c unix_socket_directories='{data_dir}'", *(f"-c {k}={v}" for k, v in SETTINGS.items())]
    )
    log = base_dir / "postgres.log"
    started = subprocess.run(
        _as_server_user([
            str(binaries / "pg_ctl"), "start", "-D", str(data_dir), "-l", str(log), "-o", options, "-w",
            "-t", str(int(timeout_s)),
        ]),
        check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    server = LocalPostgres(base_dir, port)
    if started.returncode != 0 or not _answers(server):
        raise RuntimeError(f"The local PostgreSQL did not start within {timeout_s:.0f}s: see {log}.")
    _postmaster_pid(data_dir)
    return server


def stop(base_dir: Path = DEFAULT_BASE_DIR, timeout_s: float = 30.0) -> bool:
    """Stop the server under `base_dir` (fast: open connections are closed); True if one was running."""
    base_dir = Path(base_dir).resolve()
    data_dir = base_dir / "data"
    if pid_alive(_postmaster_pid(data_dir)) is None:
        return False
    subprocess.run(
        _as_server_user([str(bin_dir() / "pg_ctl"), "stop", "-D", str(data_dir), "-m", "fast", "-w", "-t", str(int(timeout_s))]),
        check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while pid_alive(_postmaster_pid(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_source.postgres", description=__doc__)
    parser.add_argument("command", choices=["start", "stop", "url"])
    parser.add_argument(
        "database", nargs="?", default="dagster", help="for start and url: the database (default: dagster)"
    )
    args = parser.parse_args(argv)
    if args.command == "stop":
        print("stopped" if stop() else "not running")
        return 0
    server = start() if args.command == "start" else running()
    if server is None:
        print("not running", file=sys.stderr)
        return 1
    if args.command == "start":
        name = args.database.replace('"', '""')
        if not server.execute(f"SELECT 1 FROM pg_database WHERE datname = '{name.replace(chr(39), chr(39) * 2)}'"):
            server.execute(f'CREATE DATABASE "{name}"')
    print(server.url(args.database))
    return 0


if __name__ == "__main__":
    sys.exit(main())
