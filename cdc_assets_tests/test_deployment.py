"""Issue 44's "Done when": two MySQL sources in one Dagster deployment, as a team that runs Dagster as a platform has
it. A user's `dg` project with two MySQLSource components (a MariaDB source and a MySQL one, each with a lakehouse of
its own and short freshness windows), served by `dg dev` (webserver and daemon) on a PostgreSQL-backed instance (the
dagster.yaml of docs/operating.md, with its run-queue limits). Nobody launches anything: the automation keeps both
sources' tables equal to their sources; GraphQL lists both sources' assets under their names; three idle minutes
launch no run (freshness still passes, the lag is still recorded); and with one source's server stopped only that
source's runs fail while the other's new rows still arrive."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetCheckKey, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.definitions.freshness import FreshnessState
from deltalake import DeltaTable

from cdc_assets.defs.keys import SourceKeys
from cdc_assets.defs.table_checks import LAG_CHECK
from cdc_assets.local_source import server as local_server
from cdc_assets.local_source.server import LocalServer
from cdc_assets.runtime.instance import SOURCE_TAG, STAGE_TAG
from cdc_assets_tests.conftest import _database_name
from cdc_assets_tests.dagster_dev import dg_dev, listed_asset_keys, wait_for, write_project
from cdc_assets_tests.test_postgres_instance import _user_home

LIVE, STOPPED = "shop_db", "crm_db"  # the MariaDB source, and the MySQL one whose server the test stops
IDLE_SECONDS = 180
PIPELINE_STAGES = {"capture", "apply", "sync"}


class Source:
    """One source of the deployment: its server, its schema (a table `accounts`) and its lakehouse."""

    def __init__(self, name: str, server: LocalServer, schema: str, lakehouse: Path) -> None:
        self.name, self.server, self.schema, self.lakehouse = name, server, schema, lakehouse
        self.keys = SourceKeys(name)

    def execute(self, *statements: str) -> None:
        with self.server.admin_connection(database=self.schema) as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def source_rows(self) -> list[tuple]:
        with self.server.admin_connection(database=self.schema) as conn, conn.cursor() as cur:
            cur.execute("SELECT id, owner, balance FROM accounts ORDER BY id")
            return [tuple(r) for r in cur.fetchall()]

    def current_rows(self) -> list[tuple]:
        """The Delta current state of `accounts`, its source's columns only."""
        table = DeltaTable(str(self.lakehouse / "current" / self.schema / "accounts")).to_pyarrow_table()
        return sorted((r["id"], r["owner"], r["balance"]) for r in table.to_pylist())

    def equal(self) -> bool:
        try:
            return self.current_rows() == self.source_rows()
        except Exception:  # noqa: BLE001 - a Delta commit in progress: looked at again on the next poll
            return False

    def runs(self, instance: DagsterInstance, **filters: object) -> list:
        return list(instance.get_runs(filters=RunsFilter(tags={SOURCE_TAG: self.name}, **filters)))


@pytest.fixture
def mysql_of_its_own(tmp_path: Path) -> Iterator[LocalServer]:
    """A MySQL server for this test alone (the session's is other tests' too): the one the test stops."""
    base = tmp_path / "crm-mysql"
    server = local_server.start(base, flavour=local_server.MYSQL)
    yield server
    local_server.stop(base)


def _latest_lag(instance: DagsterInstance, source: Source) -> tuple[float, bool] | None:
    """When the table's lag check was last recorded, and whether it passed."""
    key = AssetCheckKey(source.keys.table_asset_key(f"{source.schema}.accounts"), LAG_CHECK)
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key]).get(key)
    if record is None or record.event is None:
        return None
    return record.event.timestamp, bool(record.event.dagster_event.event_specific_data.passed)


def test_two_sources_in_one_deployment_flow_fresh_stay_quiet_when_idle_and_fail_apart(
    mariadb: LocalServer,
    mysql_of_its_own: LocalServer,
    postgres: object,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    schema = _database_name(request.node.name)[:40]
    sources = {
        LIVE: Source(LIVE, mariadb, schema, tmp_path / f"lake-{LIVE}"),
        STOPPED: Source(STOPPED, mysql_of_its_own, schema, tmp_path / f"lake-{STOPPED}"),
    }
    for source in sources.values():
        with source.server.admin_connection() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{schema}`")
            cur.execute(f"CREATE DATABASE `{schema}`")
        source.execute(
            "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(10,2))",
            f"INSERT INTO accounts VALUES (1, '{source.name} 1', 10.00), (2, '{source.name} 2', 20.00)",
        )
    project = write_project(
            tmp_path / "project",
            {n: s.lakehouse for n, s in sources.items()},
            {n: f"{s.schema}.*" for n, s in sources.items()},
            package="platform_project",
            attributes="  freshness: {warn_minutes: 1, fail_minutes: 2}\n",  # the automation acts every minute
        )
    postgres.create_database("dagster_deployment")  # type: ignore[attr-defined]
    home = _user_home(tmp_path / "dagster_home", postgres.port, "dagster_deployment")  # type: ignore[attr-defined]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}  # a source is its component's attributes
    env |= {"DAGSTER_HOME": str(home), **{f"{n.upper()}_URL": s.server.reader_url() for n, s in sources.items()}}

    # each source's first sync, by name from the project's folder: its table is in its registry as the definitions load
    first = [
        subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.cli", "--source", name, "sync"],
            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for name in sources
    ]
    for done in first:
        output = done.communicate(timeout=600)[0]
        assert done.returncode == 0, output[-3000:]
    instance = DagsterInstance.from_config(str(home))
    started = time.monotonic()
    try:
        with dg_dev(project, env, tmp_path / "dg-dev.log") as port:
            # changes on both sources (while the deployment starts): the automation brings each lakehouse to equal its
            # source, row for row
            for source in sources.values():
                source.execute(
                    f"INSERT INTO accounts VALUES (3, '{source.name} 3', 30.00), (4, '{source.name} 4', 40.00)",
                    "UPDATE accounts SET balance = balance + 1 WHERE id = 1",
                    "DELETE FROM accounts WHERE id = 2",
                )
            # GraphQL lists both sources' assets, each under its name
            wanted = {
                f"{n}/{path}" for n in sources for path in ("raw_binlog_batches", "binlog_position", f"current/{schema}/accounts")
            }
            wait_for("the webserver to list both sources' assets", lambda: wanted <= listed_asset_keys(port), 180, every_s=2)
            assert {key.split("/", 1)[0] for key in listed_asset_keys(port)} == set(sources)

            wait_for("both lakehouses to equal their sources", lambda: all(s.equal() for s in sources.values()), 240, every_s=2)
            caught_up = time.monotonic() - started

            # idle: both sources have nothing new, and nothing runs for three minutes
            wait_for(
                "the last runs to finish",
                lambda: not any(s.runs(instance, statuses=[*IN_FLIGHT]) for s in sources.values()),
                120,
                every_s=2,
            )
            before = {n: {r.run_id for r in s.runs(instance)} for n, s in sources.items()}
            idle_from = time.time()
            time.sleep(IDLE_SECONDS)
            for name, source in sources.items():
                new = [r for r in source.runs(instance) if r.run_id not in before[name]]
                # the hourly comparison of every row (check_equality) is a cadence of its own, not the pipeline's
                assert not [r for r in new if r.tags.get(STAGE_TAG) != "check"], [(r.job_name, r.tags) for r in new]
                # freshness still passes: the quiet tables confirmed current without a run
                for key in (source.keys.table_asset_key(f"{schema}.accounts"), source.keys.raw_asset):
                    record = instance.get_freshness_state_records([key]).get(key)
                    assert record is not None and record.freshness_state == FreshnessState.PASS, (key, record)
                # the lag is still recorded, without a run: passed, within the idle window
                lag = _latest_lag(instance, source)
                assert lag is not None and lag[0] > idle_from and lag[1], (name, lag)
            idle_done = time.monotonic() - started

            # one source's server stops: only its runs fail, and the other's new rows still arrive
            live, stopped = sources[LIVE], sources[STOPPED]
            before = {n: {r.run_id for r in s.runs(instance)} for n, s in sources.items()}
            local_server.stop(stopped.server.base_dir)
            live.execute(f"INSERT INTO accounts VALUES (5, '{LIVE} 5', 50.00)", "UPDATE accounts SET owner = 'moved' WHERE id = 3")

            def failed_runs(source: Source) -> list:
                runs = source.runs(instance, statuses=[DagsterRunStatus.FAILURE])
                return [r for r in runs if r.run_id not in before[source.name]]

            wait_for(
                "the stopped source's run to fail and the live source's rows to arrive",
                lambda: bool(failed_runs(stopped)) and live.equal(),
                240,
                every_s=2,
            )
            assert not failed_runs(live)
            assert [r for r in live.runs(instance) if r.run_id not in before[LIVE]], "the live source ran nothing"
            print(f"caught up after {caught_up:.0f}s, idle window ended at {idle_done:.0f}s, "
                  f"failure apart at {time.monotonic() - started:.0f}s")  # fmt: skip
    finally:
        instance.dispose()


IN_FLIGHT = (
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
)
