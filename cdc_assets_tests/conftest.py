"""Shared real parts: one MariaDB and one Oracle MySQL (the project's own scripts) and one SparkSession per session.

`make test` runs the suite in three pytest-xdist workers, each a session of its own: every session fixture here
(servers, brokers, moto, Spark) lives under the worker's own temporary directory on ports the system hands out, so
the workers share only what `make install` built (.local/mysql-dist, the caches under ~/.cache/cdc-lakehouse).

Each test gets its own database, its own lakehouse directory and a table filter for its database,
so tests share the server's binlog without seeing each other's tables. A test reaches its server through the
`source` fixture: MariaDB, or each flavour in turn where the test (or its module) is marked `both_sources`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pymysql
import pytest

from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_server.LocalServer]:
    base = tmp_path_factory.mktemp("mariadb")
    started = local_server.start(base, flavour=local_server.MARIADB)
    yield started
    local_server.stop(base)


@pytest.fixture(scope="session")
def mysql(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_server.LocalServer]:
    """Oracle MySQL from Debian's packages (`make install` unpacks it under .local/mysql-dist)."""
    base = tmp_path_factory.mktemp("mysql")
    started = local_server.start(base, flavour=local_server.MYSQL)
    yield started
    local_server.stop(base)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `both_sources` runs once against each flavour (ids `[mariadb]`, `[mysql]`), unless it is marked
    `lakehouse_side` too: what it proves is the lakehouse's (S3, storage), whatever the source."""
    definition = metafunc.definition
    if (
        "source" in metafunc.fixturenames
        and definition.get_closest_marker("both_sources")
        and not definition.get_closest_marker("lakehouse_side")
    ):
        metafunc.parametrize("source", local_server.FLAVOURS, indirect=True)


# The modules that take longest, longest first (seconds each in `make test`'s three workers on a 2-core machine, from
# its --durations). xdist hands modules out in collection order (`--no-loadscope-reorder`), so these start first and
# none of them starts near the end to hold the suite's last minutes alone. Order only: every other module follows,
# in its collection order.
LONGEST_FIRST = (  # seconds each took in a fresh clone's `make test` (3 workers, 2026-12-07, pytest 19:34 in all)
    "test_deployment",  # 334
    "test_failpoints",  # 169
    "test_spark_cluster",  # 153
    "test_hands_off",  # 141
    "test_ui_browser",  # 128
    "test_consistency",  # 94
    "test_huge_values",  # 89
    "test_schema_changes",  # 86
    "test_forked_capture",  # 83
    "test_forget",  # 81
    "test_s3_faults",  # 79
    "test_restart",  # 77
    "test_spark_snapshot",  # 77
    "test_source_faults",  # 77
    "test_continuous",  # 74
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (LONGEST_FIRST); a module's tests keep their order."""
    here = Path(__file__).parent
    missing = [name for name in LONGEST_FIRST if not (here / f"{name}.py").is_file()]
    if missing:
        raise pytest.UsageError(f"conftest.LONGEST_FIRST names modules that do not exist: {missing}; update the list")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture
def source(request: pytest.FixtureRequest) -> local_server.LocalServer:
    """The test's source server: the session's MariaDB, or the flavour `both_sources` parametrized."""
    return request.getfixturevalue(getattr(request, "param", local_server.MARIADB))


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One RabbitMQ broker per session, started by the project's own script (cdc_assets.local_brokers) from the
    Debian package, on its own port, data directory, node name and cookie (a system broker on 5672 is left alone)."""
    from cdc_assets.local_brokers import rabbitmq as local_rabbitmq

    base = tmp_path_factory.mktemp("rabbitmq")
    yield local_rabbitmq.start(base)
    local_rabbitmq.stop(base)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One PostgreSQL per session, started by the project's own script (cdc_assets.local_source.postgres) from the
    Debian package, on its own port and data directory (a system server on 5432 is left alone): the storage of a
    Dagster instance of a user's own. As root it runs as the `postgres` user, who cannot enter pytest's base
    directory (root's alone): its directory is then one of its own under the system's temporary directory."""
    import shutil
    import tempfile

    from cdc_assets.local_source import postgres as local_postgres

    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="cdc-test-postgres-")) if as_root else tmp_path_factory.mktemp("postgres")
    try:
        yield local_postgres.start(base)
    finally:
        local_postgres.stop(base)
        if as_root:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def spark() -> object:
    """The session dagster-pyspark's resource makes from our settings: the one the runs of the session reuse."""
    from dagster_pyspark import LazyPySparkResource

    from spark_resources.session import spark_config

    return LazyPySparkResource(spark_config=spark_config("local[2]")).spark_session


def on_spark(session: Callable[[], object]) -> Callable[[int], object]:
    """The stages' engine choice pinned to Spark, whatever the size of the run."""
    from spark_resources.engine import Transforms

    return lambda changes: Transforms(session)


@pytest.fixture(scope="session", autouse=True)
def dagster_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("dagster_home")
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("DAGSTER_HOME", None)
    else:
        os.environ["DAGSTER_HOME"] = previous


@dataclass
class CdcEnv:
    """One test's source database and lakehouse, with the environment the CLI reads pointing at them."""

    server: local_server.LocalServer
    database: str
    lakehouse_dir: Path

    def admin(self) -> pymysql.Connection:
        return self.server.admin_connection(database=self.database)

    def numbers(self, n: int) -> str:
        """A table expression of the integers 1..n in a column `seq`, on either flavour (MariaDB's SEQUENCE engine
        table `seq_1_to_n`; on MySQL a cross join of digits)."""
        return numbers_sql(n, self.server.flavour)

    def execute(self, *statements: str, params: tuple | None = None) -> None:
        with self.admin() as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement, params)

    @property
    def lakehouse(self) -> Lakehouse:
        return Lakehouse(str(self.lakehouse_dir))

    def sync(self, *extra: str) -> int:
        from cdc_assets.cli import main

        return main(["sync", *extra])

    def verify(self) -> list:
        from cdc_assets.commands.runs import run_verify
        from cdc_assets_tests.env_settings import settings_now

        return run_verify(settings_now())


def numbers_sql(n: int, flavour: str) -> str:
    """See `CdcEnv.numbers`."""
    if flavour == local_server.MARIADB:
        return f"seq_1_to_{n}"
    digits = "(" + " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10)) + ")"
    places = len(str(max(n - 1, 1)))
    value = " + ".join(f"{10**i} * d{i}.d" for i in range(places))
    joins = " CROSS JOIN ".join(f"{digits} AS d{i}" for i in range(places))
    return f"(SELECT {value} + 1 AS seq FROM {joins} WHERE {value} < {n}) AS seq_1_to_{n}"


def _database_name(node_name: str) -> str:
    """A database per test: its name, shortened, and a digest of all of it (parametrized tests differ at the end)."""
    digest = hashlib.sha1(node_name.encode()).hexdigest()[:6]
    return "t_" + re.sub(r"[^a-z0-9]+", "_", node_name.lower())[:42] + "_" + digest


@pytest.fixture
def cdc(
    source: local_server.LocalServer,
    spark: object,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> CdcEnv:
    database = _database_name(request.node.name)
    with source.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    env = CdcEnv(source, database, tmp_path / "lakehouse")
    monkeypatch.setenv("CDC_MYSQL_URL", source.reader_url())
    monkeypatch.setenv("CDC_LAKEHOUSE", str(env.lakehouse_dir))
    monkeypatch.setenv("CDC_TABLES", f"{database}.*")
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[2]")
    # a lakehouse's runs have a Dagster home of their own (runtime/instance.py): the test's, beside its lakehouse
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    for name in ("CDC_EXCLUDE_TABLES", "CDC_SERVER_ID", "CDC_MAX_BATCH_ROWS"):
        monkeypatch.delenv(name, raising=False)
    return env


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in its own process: delta-rs holds the GIL while it waits on some requests, so an
    in-process (threaded) server could not answer them."""
    port = local_server.free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline and server.poll() is None, "moto_server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)


def use_s3(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point the standard AWS settings at the local S3 endpoint."""
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)


@dataclass
class S3Faults:
    """The fault-injecting proxy in front of the local S3 endpoint (cdc_assets_tests.s3_fault_proxy)."""

    url: str
    rules_file: Path

    def set(self, *rules: dict) -> None:
        """Replace the rules (counts start again); every matched request is logged."""
        Path(f"{self.rules_file}.log").unlink(missing_ok=True)
        tmp = self.rules_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(rules)))
        tmp.replace(self.rules_file)

    def clear(self) -> None:
        self.set()

    def injected(self) -> list[dict]:
        """The requests rules matched since the last `set`."""
        log = Path(f"{self.rules_file}.log")
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture(scope="session")
def _s3_proxy(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Faults]:
    rules = tmp_path_factory.mktemp("s3_faults") / "rules.json"
    rules.write_text("[]")
    port = local_server.free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets_tests.s3_fault_proxy", "--upstream", s3_endpoint, "--port", str(port),
         "--rules", str(rules)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline and proxy.poll() is None, "the S3 fault proxy did not start"
        time.sleep(0.1)
    yield S3Faults(f"http://127.0.0.1:{port}", rules)
    proxy.terminate()
    proxy.wait(timeout=10)


@pytest.fixture
def s3_faults(_s3_proxy: S3Faults) -> Iterator[S3Faults]:
    """The proxy with no rule; the test sets its own, and they are cleared afterwards."""
    _s3_proxy.clear()
    yield _s3_proxy
    _s3_proxy.clear()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Spark standalone master and two workers (one core each) from the pyspark wheel, on 127.0.0.1."""
    from cdc_assets.local_spark import cluster

    state = tmp_path_factory.mktemp("spark_cluster")
    started = cluster.start(state, workers=2)
    yield started
    cluster.stop(state)


def run_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`cdc-lakehouse` in a process of its own (a Spark cluster's driver must not share this one's JVM)."""
    return subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", *argv],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
