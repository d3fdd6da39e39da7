"""The MySQLSource component in a Dagster project of a user's: two sources declared in defs.yaml files load into one
code location without a collision, each under its own name, and the CLI works on each by name (`--source`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from deltalake import DeltaTable

from cdc_assets.components.mysql_source import MySQLSource, settings_of
from cdc_assets.core.errors import CdcUserError
from cdc_assets.local_source.server import LocalServer
from cdc_assets_tests.conftest import CdcEnv, _database_name
from cdc_assets_tests.dagster_dev import write_project

SOURCES = ("orders_db", "crm_db")


@pytest.fixture
def project(source: LocalServer, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two sources, two schemas of the test's server, each with a table of its own and a lakehouse of its own."""
    root = tmp_path / "project"
    cdc = CdcEnv(source, "mysql", tmp_path / "unused")
    database = _database_name(request.node.name)
    schemas = {name: f"{database[:40]}_{i}" for i, name in enumerate(SOURCES)}
    for name, schema in schemas.items():
        cdc.execute(
            f"DROP DATABASE IF EXISTS `{schema}`",
            f"CREATE DATABASE `{schema}`",
            f"CREATE TABLE `{schema}`.accounts (id INT PRIMARY KEY, owner VARCHAR(20))",
            f"INSERT INTO `{schema}`.accounts SELECT seq, CONCAT('{name}-', seq) FROM {cdc.numbers(5 + len(name))}",
        )
        monkeypatch.setenv(f"{name.upper()}_URL", cdc.server.reader_url())
    for variable in [v for v in os.environ if v.startswith("CDC_")]:
        monkeypatch.delenv(variable)  # a named source is its attributes, whatever the environment says
    write_project(
        root, {n: tmp_path / f"lake-{n}" for n in SOURCES}, {n: f"{s}.*" for n, s in schemas.items()}, attributes="  owners: [team:data]\n"
    )
    monkeypatch.syspath_prepend(str(root))
    return root


def test_two_sources_load_into_one_code_location_each_under_its_own_name(project: Path) -> None:
    defs = dg.load_from_defs_folder(path_within_project=project / "shop_project")
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    keys = {key for a in repository.asset_graph.asset_nodes for key in [a.key]}
    assert {key.path[0] for key in keys} == set(SOURCES), keys
    for name in SOURCES:
        assert dg.AssetKey([name, "raw_binlog_batches"]) in keys
    jobs = [job.name for job in repository.get_all_jobs() if not job.name.startswith("__")]
    sensors = [sensor.name for sensor in repository.sensor_defs]
    schedules = [schedule.name for schedule in repository.schedule_defs]
    resources = list(repository.get_top_level_resources())
    for names in (jobs, sensors, schedules, resources):
        assert names and all(n.split("__", 1)[0] in SOURCES for n in names), names
        assert len(names) == len(set(names))
    for name in SOURCES:
        assert f"{name}__sync" in jobs and f"{name}__capture" in jobs


def test_the_cli_syncs_each_source_by_name_from_the_projects_folder(project: Path, tmp_path: Path) -> None:
    for name in SOURCES:
        done = subprocess.run(
            [sys.executable, "-m", "cdc_assets.cli", "--source", name, "sync"],
            cwd=project, capture_output=True, text=True, timeout=600,
            env={**os.environ, "DAGSTER_HOME": str(tmp_path / f"home-{name}")},
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    for name in SOURCES:
        current = next((tmp_path / f"lake-{name}" / "current").glob("*/accounts"))
        rows = DeltaTable(str(current)).to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["owner"]) for r in rows) == [(i, f"{name}-{i}") for i in range(1, 6 + len(name))]


def test_an_unknown_source_name_is_one_sentence_naming_the_projects_sources(project: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", "--source", "billing", "status"],
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: The project at {project} has no MySQLSource named 'billing' (its sources: crm_db, orders_db): give "
        "one of those names to --source."
    ]


def test_a_source_without_a_name_or_with_a_variable_of_another_kind_is_refused_with_the_fix() -> None:
    with pytest.raises(CdcUserError, match="needs a `name`"):
        settings_of(MySQLSource(mysql_url="mysql://u@h:3306"), {})
    with pytest.raises(CdcUserError, match="takes only the CDC_\\* variables"):
        settings_of(MySQLSource(name="a", settings={"PATH": "/"}), {})
    with pytest.raises(CdcUserError, match="both under `settings` and as an attribute"):
        settings_of(MySQLSource(name="a", lakehouse="x", settings={"CDC_LAKEHOUSE": "y"}), {})
    with pytest.raises(CdcUserError, match="cannot name Dagster asset keys"):
        settings_of(MySQLSource(name="Orders-DB"), {})
    with pytest.raises(CdcUserError, match="sets both mysql_url and demo_source"):
        settings_of(MySQLSource(name="a", mysql_url="mysql://u@h:3306", demo_source="mysql"), {})
    with pytest.raises(CdcUserError, match="CDC_DEMO_SOURCE=oracle is not a server the demo runs: set it to mariadb or mysql"):
        settings_of(MySQLSource(name="a", demo_source="Oracle"), {})


def test_the_projects_second_demo_source_reads_the_demo_mysql_server_into_its_own_lakehouse() -> None:
    """`make demo SOURCE=mysql` is the project's second component instance (cdc_assets/sources/demo_mysql): its own
    name, lakehouse and replica id beside the `demo` source, reading the local demo MySQL server (no URL)."""
    from cdc_assets.components.project import named_source_settings
    from cdc_assets.core.settings import DEMO_SOURCE, Settings

    root = Path(__file__).resolve().parents[1]
    mysql = named_source_settings("demo_mysql", root, {"CDC_LAKEHOUSE": "elsewhere", "CDC_MYSQL_URL": "mysql://u@h"}, {})
    demo = Settings.from_env({})
    assert mysql.name == "demo_mysql" and mysql.source.url == DEMO_SOURCE and mysql.source.demo_flavour == "mysql"
    assert mysql.lakehouse.location == "lakehouse-mysql" != demo.lakehouse.location
    assert mysql.source.server_id != demo.source.server_id  # both may read one server (CDC_DEMO_SOURCE=mysql)
    assert "shop.orders" in mysql.lakehouse.history
    make = subprocess.run(["make", "-n", "demo", "SOURCE=mysql"], cwd=root, capture_output=True, text=True, check=True)
    assert "cdc-lakehouse --source demo_mysql demo" in make.stdout


def test_each_attribute_is_the_setting_of_its_variable() -> None:
    source = MySQLSource.resolve_from_yaml(
        """
name: orders_db
mysql_url: mysql://reader@db.internal:3306
lakehouse: s3://lake/orders
tables: [shop.*, billing.invoices]
exclude_tables: [shop.tmp_*]
server_id: 4200777
spark: {master: "spark://spark:7077", min_rows: 0, conf: {spark.executor.memory: 2g}}
history_tables: [shop.orders]
soft_delete_tables: [shop.customers]
freshness: {warn_minutes: 5, fail_minutes: 15, tables: {shop.orders: 1/3}}
owners: [team:data]
settings: {CDC_MAX_BATCH_ROWS: "5000"}
"""
    )
    settings = settings_of(source, {"CDC_LAKEHOUSE": "ignored", "AWS_REGION": "eu-west-1"})
    assert settings.name == "orders_db"
    assert settings.source.url.host == "db.internal"
    assert settings.source.server_id == 4200777
    assert settings.source.max_batch_rows == 5000
    assert settings.source.table_filter.matches("billing", "invoices")
    assert not settings.source.table_filter.matches("shop", "tmp_x")
    assert settings.lakehouse.location == "s3://lake/orders"
    assert settings.engine.spark_master == "spark://spark:7077" and settings.engine.spark_min_rows == 0
    assert dict(settings.engine.spark_conf)["spark.executor.memory"] == "2g"
    assert "shop.orders" in settings.lakehouse.history and "shop.customers" in settings.lakehouse.soft_deletes
    assert settings.cadence.freshness_windows == (5, 15)
    assert settings.cadence.table_freshness_windows("shop.orders") == (1, 3)
    assert settings.cadence.asset_owners == ("team:data",)
    assert settings.environment["AWS_REGION"] == "eu-west-1"


@pytest.mark.parametrize("page", ["docs/dagster-project.md", "README.md"])
def test_the_yaml_of_two_sources_in_the_docs_loads_as_written(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pages' defs.yaml examples, each resolved as Dagster resolves it and turned into settings."""
    text = (Path(__file__).parents[1] / page).read_text()
    documents = [d for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(block)]
    assert len(documents) == 2
    monkeypatch.setenv("ORDERS_DB_URL", "mysql://reader:s3cret@orders.internal:3306")
    monkeypatch.setenv("CRM_DB_URL", "mysql://reader:s3cret@crm.internal:3306")
    monkeypatch.setenv("CRM_HASH_KEY", "a-key-of-at-least-16-characters")
    names = []
    for document in documents:
        assert document["type"] == "cdc_assets.components.MySQLSource"
        source = MySQLSource.resolve_from_yaml(yaml.safe_dump(document["attributes"]))
        settings = settings_of(source)
        names.append(settings.name)
        assert settings.source.url.password == "s3cret"
    assert names == ["orders_db", "crm_db"]


def test_a_password_comes_from_the_environment_and_stays_its_envvar(monkeypatch: pytest.MonkeyPatch) -> None:
    """`"{{ env.X }}"` in defs.yaml: the source's resources hold the URL as EnvVar("X"), never its text; a password
    written in the YAML itself is refused with the fix."""
    from cdc_assets.defs.keys import SourceKeys
    from cdc_assets.defs.resources import resources_of

    monkeypatch.setenv("ORDERS_DB_URL", "mysql://reader:s3cret@orders.internal:3306")
    source = MySQLSource.resolve_from_yaml('name: orders_db\nmysql_url: "{{ env.ORDERS_DB_URL }}"\nlakehouse: lake\n')
    binlog = resources_of(settings_of(source)).by_key(SourceKeys("orders_db"))["orders_db__binlog"]
    assert binlog.mysql_url == dg.EnvVar("ORDERS_DB_URL")
    assert "s3cret" not in repr(binlog)
    written = MySQLSource(name="orders_db", mysql_url="mysql://reader:written@orders.internal:3306")
    with pytest.raises(CdcUserError, match=r"password or key written in its defs.yaml \(mysql_url\)"):
        settings_of(written, {})


def test_dg_lists_and_launches_a_sources_assets_in_the_project(project: Path, tmp_path: Path) -> None:
    """`dg list defs` and `dg launch --assets` in the user's project: the capture of one source, by its key."""
    dg_cli = str(Path(sys.executable).with_name("dg"))
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1]), "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    listed = subprocess.run(
        [dg_cli, "list", "defs", "--json"], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stderr
    assert "orders_db/raw_binlog_batches" in listed.stdout and "crm_db/raw_binlog_batches" in listed.stdout
    launched = subprocess.run(
        [dg_cli, "launch", "--assets", "key:orders_db/raw_binlog_batches"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    assert list((tmp_path / "lake-orders_db" / "raw").rglob("*.parquet")), "the capture wrote no raw batch"
    assert not (tmp_path / "lake-crm_db").exists()
