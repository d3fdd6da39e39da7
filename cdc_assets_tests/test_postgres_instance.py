"""A Dagster instance of the user's own (docs/operating.md, "Your own Dagster instance (PostgreSQL)"): the dagster.yaml
documented there, with PostgreSQL run, event-log and schedule storage on the project's own local PostgreSQL, is used
as it is by two sources with lakehouses of their own, and their runs and materializations are in PostgreSQL. What
keeps the CLI from opening such an instance (dagster-postgres not installed, the database not answering) is one
sentence and exit 2. And the embedded default without its event batching (CDC_EVENT_BATCHES=0)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from cdc_assets.commands.runs import run_verify
from cdc_assets.core.settings import Settings
from cdc_assets.defs.keys import SourceKeys
from cdc_assets.local_source.processes import free_port
from cdc_assets.local_source.server import LocalServer
from cdc_assets.runtime import instance as home_setup
from cdc_assets_tests.conftest import run_cli

OPERATING = Path(__file__).resolve().parent.parent / "docs" / "operating.md"
SECTION = "## Your own Dagster instance (PostgreSQL)"


def _documented_yaml() -> str:
    """The dagster.yaml of docs/operating.md's section, as written there."""
    section = OPERATING.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return block


def test_the_documented_run_queue_snippet_is_the_one_the_pipeline_needs() -> None:
    """A user's own dagster.yaml takes QUEUE_LIMITS under `concurrency: runs:`: the section shows exactly it."""
    documented = _documented_yaml()
    assert home_setup.QUEUE_LIMITS in documented
    config = yaml.safe_load(documented)
    assert config["concurrency"]["runs"]["tag_concurrency_limits"] == yaml.safe_load(
        "concurrency:\n  runs:\n" + home_setup.QUEUE_LIMITS
    )["concurrency"]["runs"]["tag_concurrency_limits"]
    assert set(config["storage"]["postgres"]["postgres_db"]) >= {"hostname", "port", "username", "db_name"}


def _user_home(path: Path, port: int, database: str = "dagster", **replaced: str) -> Path:
    """A DAGSTER_HOME with the documented dagster.yaml, its database the local one (`replaced`: other settings)."""
    config = yaml.safe_load(_documented_yaml())
    postgres_db = config["storage"]["postgres"]["postgres_db"]
    del postgres_db["password"]  # trusted on 127.0.0.1
    postgres_db.update({"hostname": "127.0.0.1", "port": port, "username": "postgres", "db_name": database, **replaced})
    path.mkdir(parents=True)
    (path / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# `cdc-lakehouse sync` in a process of its own that then says what of our event batching it took: the alembic patch
# (runtime/event_log.share_alembic_scripts) and DAGSTER_EVENT_BATCH_SIZE
PROBED_SYNC = """
import json, os, sys
from alembic.script import ScriptDirectory
from cdc_assets.cli import main
code = main(["sync"])
patched = getattr(ScriptDirectory.from_config, "__func__", None).__name__ == "_shared_from_config"
print(json.dumps({"code": code, "patched": patched, "batch_size": os.environ.get("DAGSTER_EVENT_BATCH_SIZE")}))
"""


def _probed_sync(env: dict[str, str]) -> dict:
    """A sync (PROBED_SYNC) in the environment of this process with `env`, and none of its DAGSTER_EVENT_BATCH_SIZE."""
    full = {k: v for k, v in {**os.environ, **env}.items() if k != "DAGSTER_EVENT_BATCH_SIZE"}
    done = subprocess.run([sys.executable, "-c", PROBED_SYNC], env=full, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _source_env(mariadb: LocalServer, name: str, tables: str, lakehouse: Path, home: Path) -> dict[str, str]:
    return {
        "CDC_SOURCE_NAME": name,
        "CDC_MYSQL_URL": mariadb.reader_url(),
        "CDC_TABLES": tables,
        "CDC_LAKEHOUSE": str(lakehouse),
        "DAGSTER_HOME": str(home),
        "CDC_SPARK_MASTER": "local[2]",
    }


@pytest.fixture
def database(mariadb: LocalServer) -> str:
    with mariadb.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS pg_instance")
        cur.execute("CREATE DATABASE pg_instance")
        cur.execute("CREATE TABLE pg_instance.orders (id INT PRIMARY KEY, total DECIMAL(10,2))")
        cur.execute("CREATE TABLE pg_instance.users (id INT PRIMARY KEY, name VARCHAR(20))")
        cur.execute("INSERT INTO pg_instance.orders VALUES (1, 9.50), (2, 20.00)")
        cur.execute("INSERT INTO pg_instance.users VALUES (1, 'ann'), (2, 'bob'), (3, 'cy')")
    return "pg_instance"


def test_two_sources_sync_into_one_postgres_instance(
    mariadb: LocalServer, postgres, database: str, tmp_path: Path
) -> None:
    postgres.create_database("dagster_two_sources")
    home = _user_home(tmp_path / "dagster_home", postgres.port, "dagster_two_sources")
    written = (home / "dagster.yaml").read_text()
    sources = {"orders_db": f"{database}.orders", "users_db": f"{database}.users"}
    envs = {name: _source_env(mariadb, name, tables, tmp_path / name, home) for name, tables in sources.items()}
    for name, env in envs.items():
        # nothing of our SQLite event batching on this instance: no alembic patch, no DAGSTER_EVENT_BATCH_SIZE
        assert _probed_sync(env) == {"code": 0, "patched": False, "batch_size": None}, name

    # the user's dagster.yaml is used as it is, claimed by no lakehouse, and nothing of SQLite is made there
    assert (home / "dagster.yaml").read_text() == written
    assert not (home / home_setup.HOME_MARK).exists() and not [*home.rglob("*.db")]
    # each lakehouse equals its source's tables
    for name, env in envs.items():
        [compared] = run_verify(Settings.from_env({**os.environ, **env}))
        assert compared.ok and str(compared.table) == sources[name] and compared.compared_rows in (2, 3), compared
    # both sources' runs and materializations are in PostgreSQL, each under its source's name
    dagster = DagsterInstance.from_config(str(home))
    try:
        assert type(dagster.event_log_storage).__name__ == "PostgresEventLogStorage"
        runs = dagster.get_runs()
        assert sorted(r.tags.get(home_setup.SOURCE_TAG) for r in runs) == sorted(sources)
        assert all(r.is_success for r in runs)
        for name, table in sources.items():
            [record] = dagster.fetch_materializations(SourceKeys(name).table_asset_key(table), limit=5).records
            assert record.run_id in {r.run_id for r in runs if r.tags.get(home_setup.SOURCE_TAG) == name}
    finally:
        dagster.dispose()
    [(count,)] = postgres.execute("SELECT count(*) FROM runs", database="dagster_two_sources")
    assert count == 2


def test_an_unreachable_instance_database_is_one_sentence(mariadb: LocalServer, tmp_path: Path) -> None:
    home = _user_home(tmp_path / "dagster_home", free_port())
    env = _source_env(mariadb, "orders_db", "nothing.*", tmp_path / "lakehouse", home)
    done = run_cli("status", env=env)
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "PostgreSQL database of the Dagster instance" in line and "cannot be reached" in line, line
    assert str(home / "dagster.yaml") in line and "Traceback" not in done.stderr


def test_a_missing_dagster_postgres_is_one_sentence(mariadb: LocalServer, tmp_path: Path) -> None:
    """In a Python where dagster_postgres cannot be imported (an import hook in sitecustomize takes it away, as an
    environment without the package), a dagster.yaml naming PostgreSQL storage is one sentence naming the package."""
    shim = tmp_path / "no_dagster_postgres"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        textwrap.dedent(
            """\
            import sys


            class NotInstalled:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] == "dagster_postgres":
                        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                    return None


            sys.meta_path.insert(0, NotInstalled())
            """
        )
    )
    home = _user_home(tmp_path / "dagster_home", free_port())
    env = _source_env(mariadb, "orders_db", "nothing.*", tmp_path / "lakehouse", home)
    done = run_cli("status", env={**env, "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "needs the Python package dagster-postgres, which is not installed" in line, line
    assert "pip install dagster-postgres" in line and "Traceback" not in done.stderr


def test_a_driver_dagster_postgres_cannot_work_with_is_one_sentence(mariadb: LocalServer, tmp_path: Path) -> None:
    """`postgresql://` without a driver is psycopg 3's under SQLAlchemy 2.1, with which dagster-postgres's runs fail
    at their first event: refused before the instance is opened, naming the scheme to write."""
    home = _user_home(tmp_path / "dagster_home", free_port(), scheme="postgresql")
    env = _source_env(mariadb, "orders_db", "nothing.*", tmp_path / "lakehouse", home)
    done = run_cli("status", env=env)
    assert done.returncode == 2, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "dagster-postgres works only with psycopg2" in line and "scheme: postgresql+psycopg2" in line, line


def test_without_event_batches_the_embedded_instance_is_dagsters_own_sqlite(
    mariadb: LocalServer, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CDC_EVENT_BATCHES=0: our dagster.yaml names no event log of ours, and a sync runs on Dagster's own SQLite event
    log without our batching (no alembic patch, no DAGSTER_EVENT_BATCH_SIZE). Turned back on, the dagster.yaml names
    ours again, over the same files: the run written without it reads back."""
    home = tmp_path / "dagster_home"
    env = _source_env(mariadb, "orders_db", f"{database}.orders", tmp_path / "lakehouse", home)
    assert _probed_sync({**env, "CDC_EVENT_BATCHES": "0"}) == {"code": 0, "patched": False, "batch_size": None}
    written = (home / "dagster.yaml").read_text()
    assert written.startswith(home_setup.MANAGED_HEADER) and home_setup.BATCHING_STORAGE not in written
    asset = SourceKeys("orders_db").table_asset_key(f"{database}.orders")
    dagster = DagsterInstance.from_config(str(home))
    try:
        assert type(dagster.event_log_storage).__name__ == "SqliteEventLogStorage"
        [run] = dagster.get_runs()
        assert run.is_success and dagster.fetch_materializations(asset, limit=1).records[0].run_id == run.run_id
    finally:
        dagster.dispose()

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CDC_EVENT_BATCHES", raising=False)
    assert home_setup.ensure_dagster_home(str(tmp_path / "lakehouse")) == home.resolve()
    assert home_setup.writes_event_batches(home)
    dagster = DagsterInstance.from_config(str(home))
    try:
        assert type(dagster.event_log_storage).__name__ == "BatchingSqliteEventLogStorage"
        assert dagster.fetch_materializations(asset, limit=1).records[0].run_id == run.run_id
    finally:
        dagster.dispose()
