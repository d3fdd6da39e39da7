"""Configuration: one typed settings value built once from an environment (URLs, table filters and their error
sentences), handed to every stage; nothing below the CLI and the Dagster resources reads the environment, so two
values in one process are two pipelines."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from cdc_assets.core import settings as settings_module
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import LAKEHOUSE_ENV, SOURCE_ENV, MySQLUrl, Settings, TableFilter, TableSelection
from cdc_assets.lake.store import lakehouse_from
from cdc_assets.source.server import resolved_source


def test_url_never_shows_its_password() -> None:
    url = MySQLUrl.parse("mysql://reader:s%40cret@db.example:3307")
    assert (url.host, url.port, url.user, url.password) == ("db.example", 3307, "reader", "s@cret")
    assert "s@cret" not in repr(url) and "s@cret" not in str(url)
    assert MySQLUrl.parse("mysql://reader@localhost").port == 3306


@pytest.mark.parametrize("bad", ["", "localhost:3306", "postgres://u:p@h:1", "mysql://u:p@h:notaport"])
def test_bad_urls_name_the_fix(bad: str) -> None:
    with pytest.raises(CdcUserError, match="mysql://user:password@host:port"):
        MySQLUrl.parse(bad)


def test_table_filter() -> None:
    default = TableFilter.parse(None, None)
    assert default.matches("shop", "orders")
    assert not default.matches("mysql", "user")
    shop = TableFilter.parse("shop.*, inventory.stock_*", "shop.tmp_*")
    assert shop.matches("shop", "orders") and shop.matches("inventory", "stock_moves")
    assert not shop.matches("shop", "tmp_1") and not shop.matches("inventory", "warehouses")
    assert shop.matches_schema("inventory") and not shop.matches_schema("other")
    with pytest.raises(CdcUserError, match="schema.table"):
        TableFilter.parse("orders", None)


@pytest.mark.parametrize("value", ["2", "-1", "soon"])
def test_a_lock_ttl_below_three_seconds_is_refused_with_the_fix(value: str) -> None:
    with pytest.raises(CdcUserError, match="CDC_LOCK_TTL_SECONDS"):
        Settings.from_env({"CDC_LOCK_TTL_SECONDS": value})
    settings = Settings.from_env({"CDC_LOCK_TTL_SECONDS": "7.5"})
    assert settings.lakehouse.lock_ttl_seconds == lakehouse_from(settings.lakehouse).lock_ttl_seconds == 7.5


@pytest.mark.parametrize("value", ["0", "-4", "big"])
def test_a_current_file_size_below_one_kb_is_refused_with_the_fix(value: str) -> None:
    """CDC_CURRENT_FILE_KB (its effect on the files: test_pipeline, copy on write by file): the stages take it from
    the lakehouse they are given."""
    assert lakehouse_from(Settings.from_env({}).lakehouse).current_piece_bytes == 32 * 1024
    with pytest.raises(CdcUserError, match="CDC_CURRENT_FILE_KB"):
        Settings.from_env({"CDC_CURRENT_FILE_KB": value})
    assert lakehouse_from(Settings.from_env({"CDC_CURRENT_FILE_KB": "4096"}).lakehouse).current_piece_bytes == 4096 * 1024


def test_s3_retry_settings_reach_every_s3_client_from_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """CDC_S3_MAX_ATTEMPTS / CDC_S3_TIMEOUT_SECONDS configure boto3, delta-rs and pyarrow alike (their effect on a
    real endpoint: test_s3_faults); a bad value is refused with the fix."""
    from cdc_assets.defs.resources import initialized_resources

    for name, bad in (("CDC_S3_MAX_ATTEMPTS", "0"), ("CDC_S3_MAX_ATTEMPTS", "2.5"), ("CDC_S3_TIMEOUT_SECONDS", "-1")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(CdcUserError, match=f"{name}='{bad}' is not"):
            initialized_resources()
        monkeypatch.delenv(name)
    monkeypatch.setenv("CDC_LAKEHOUSE", "s3://bucket/prefix")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("CDC_S3_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("CDC_S3_TIMEOUT_SECONDS", "2.5")
    lakehouse = initialized_resources().lakehouse.get()
    config = lakehouse.s3.client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 7}
    assert (config.connect_timeout, config.read_timeout) == (2.5, 2.5)
    options = lakehouse.storage_options() or {}
    assert {k: options[k] for k in ("max_retries", "timeout", "connect_timeout")} == {
        "max_retries": "6", "timeout": "2500ms", "connect_timeout": "2500ms"}  # fmt: skip
    assert lakehouse.file_access().retries == lakehouse.s3.retries
    assert lakehouse.file_access().filesystem().type_name == "s3"


def test_table_selection_selects_nothing_by_default_and_names_a_bad_glob() -> None:
    """CDC_HISTORY_TABLES / CDC_SOFT_DELETES: unlike CDC_TABLES, unset selects no table."""
    assert "shop.orders" not in TableSelection.parse(None, "CDC_HISTORY_TABLES")
    assert "shop.orders" not in TableSelection.parse(" , ", "CDC_HISTORY_TABLES")
    chosen = TableSelection.parse("shop.ord*, `d.ot`.t", "CDC_SOFT_DELETES")
    assert "shop.orders" in chosen and TableRef("d.ot", "t") in chosen
    assert "shop.items" not in chosen and "other.orders" not in chosen
    with pytest.raises(CdcUserError, match="CDC_SOFT_DELETES has no schema"):
        TableSelection.parse("orders", "CDC_SOFT_DELETES")


SETTINGS_ENV = {
    "CDC_MYSQL_URL": "mysql://reader:s3cret@db.example:3307",
    "CDC_SERVER_ID": "77",
    "CDC_TABLES": "shop.*",
    "CDC_EXCLUDE_TABLES": "shop.tmp_*",
    "CDC_MAX_BATCH_ROWS": "1234",
    "CDC_SNAPSHOT_CHUNK_ROWS": "5000",
    "CDC_GLOBAL_READ_LOCK": "on",
    "CDC_HASH_COLUMNS": "shop.customers.email",
    "CDC_HASH_KEY": "a-secret-of-sixteen-or-more",
    "CDC_LOCK_WAIT_SECONDS": "9",
    "CDC_LOCK_TTL_SECONDS": "11",
    "CDC_HISTORY_TABLES": "shop.orders",
    "CDC_SOFT_DELETES": "shop.customers",
    "CDC_CURRENT_FILE_KB": "64",
    "CDC_SPARK_MASTER": "spark://127.0.0.1:7077",
    "CDC_SPARK_CONF": '{"spark.executor.memory": "2g"}',
    "CDC_CHECK_INTERVAL_SECONDS": "30",
    "CDC_LAG_WARN_SECONDS": "40",
}


def test_the_resources_are_built_from_the_settings_field_for_field(tmp_path: Path) -> None:
    """The runs' resources (the Dagster layer) are built from the settings value and give back the same plain
    settings the stages take, and a sync's forked child takes those very settings without Dagster."""
    from cdc_assets.defs.resources import BinlogResource, LakehouseResource, initialized_resources

    # Every resource field is one of the shared variables, or a typed setting, or no variable (a run's own, or S3's).
    assert set(BinlogResource.model_fields) == set(SOURCE_ENV) | {"max_batches", "snapshot_chunk_rows", "global_read_lock"}
    typed = {"lock_wait_seconds", "lock_ttl_seconds", "current_file_kb", "s3_max_attempts", "s3_timeout_seconds"}
    assert set(LakehouseResource.model_fields) == set(LAKEHOUSE_ENV) | typed | {"s3"}

    settings = Settings.from_env(SETTINGS_ENV | {"CDC_LAKEHOUSE": str(tmp_path / "lake")})
    resources = initialized_resources(settings)
    source = resolved_source(settings.source)
    assert source == settings.source == resources.binlog.settings()
    assert (source.server_id, source.max_batch_rows, source.snapshot_chunk_rows) == (77, 1234, 5000)
    assert source.global_read_lock and source.column_policy.hash == (("shop", "customers", "email"),)
    assert source.table_filter.matches("shop", "orders") and not source.table_filter.matches("shop", "tmp_1")
    house, theirs = lakehouse_from(settings.lakehouse), resources.lakehouse.get()
    assert resources.lakehouse.settings() == settings.lakehouse
    described = lambda h: (h.location, h.lock_wait_seconds, h.lock_ttl_seconds, h.history, h.soft_deletes, h.current_piece_bytes)  # noqa: E731
    assert described(house) == described(theirs) == (
        str(tmp_path / "lake"), 9.0, 11.0, TableSelection(("shop.orders",)), TableSelection(("shop.customers",)), 64 * 1024
    )
    assert resources.transforms.min_rows == settings.engine.spark_min_rows == 0  # a cluster's default
    assert resources.pyspark.spark_config["spark.executor.memory"] == "2g"
    assert resources.cadence.check_interval_seconds == 30 and resources.cadence.lag_thresholds == (40.0, 300.0)

    with pytest.raises(CdcUserError, match="CDC_MAX_BATCH_ROWS='many' is not a whole number"):
        Settings.from_env(SETTINGS_ENV | {"CDC_MAX_BATCH_ROWS": "many"})


def test_a_text_of_the_environment_stays_an_envvar_and_a_flags_is_given_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runs the CLI launches get its settings through their resources: a text the process's environment holds
    (a password's) as its EnvVar, out of run config; one only a flag gave (never a password) as the value."""
    from dagster import EnvVar

    from cdc_assets.defs.resources import resources_of

    monkeypatch.setenv("CDC_MYSQL_URL", "mysql://reader:s3cret@db.example:3307")
    monkeypatch.setenv("CDC_TABLES", "shop.*")
    monkeypatch.delenv("CDC_LAKEHOUSE", raising=False)
    flags = {"CDC_TABLES": "shop.orders", "CDC_LAKEHOUSE": str(tmp_path / "lake")}
    resources = resources_of(Settings.from_env({**os.environ, **flags}))
    assert resources.binlog.mysql_url == EnvVar("CDC_MYSQL_URL")
    assert resources.binlog.tables == "shop.orders" and resources.lakehouse.location == str(tmp_path / "lake")


@pytest.mark.parametrize(
    ("master", "min_rows"),
    [("local[2]", None), ("local[2]", "5000"), ("spark://127.0.0.1:7077", None), ("sc://127.0.0.1:15002", "10")],
)
def test_the_forked_stages_choose_the_engine_the_run_would(master: str, min_rows: str | None) -> None:
    """A sync's forked child takes the stages only where the run would take them on Arrow: its threshold is the
    run's, from the same settings; at or above it the child leaves the stage to the run."""
    from cdc_assets.defs.resources import initialized_resources
    from cdc_assets.runtime.forked_stages import LeftToRun, arrow_only

    settings = Settings.from_env({"CDC_SPARK_MASTER": master} | ({"CDC_SPARK_MIN_ROWS": min_rows} if min_rows else {}))
    threshold = initialized_resources(settings).transforms.min_rows
    assert settings.engine.spark_min_rows == threshold
    for changes in (0, threshold - 1, threshold, threshold + 1):
        if changes < 0:
            continue
        run_engine = initialized_resources(settings).transforms.for_changes(changes).engine
        if run_engine == "arrow":
            assert arrow_only(settings.engine.spark_min_rows)(changes).engine == "arrow"
        else:
            with pytest.raises(LeftToRun):
                arrow_only(settings.engine.spark_min_rows)(changes)


def test_the_settings_defaults_are_the_engines_own() -> None:
    """spark_resources keeps the master's and the threshold's defaults for a session built without settings (the
    benchmarks'): the same as the settings'."""
    from spark_resources import engine, session

    assert (settings_module.DEFAULT_SPARK_MASTER, settings_module.DEFAULT_SPARK_MIN_ROWS) == (
        session.DEFAULT_SPARK_MASTER, engine.DEFAULT_SPARK_MIN_ROWS
    )


def test_the_forked_child_imports_no_dagster() -> None:
    """Its point is to work while the parent imports Dagster: importing it there would double that work."""
    import subprocess
    import sys

    code = (
        "import sys, cdc_assets.runtime.forked_capture, cdc_assets.runtime.forked_stages; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'dagster_pyspark', 'pyspark')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


ROOT = Path(__file__).resolve().parents[1]
# The modules that may read the process's environment, and why: the CLI and the Dagster layer build the settings
# value from it; the others read what is no setting of the pipeline's. Everything else takes its settings as a value.
ENVIRONMENT_READERS = {
    "cdc_assets.cli": "builds the command's settings from the environment with its flags over it",
    "cdc_assets.defs.resources": "the Dagster layer: a text the environment holds is given to a run as its EnvVar",
    "cdc_assets.defs.code_location": "the code location's settings, read once as it loads (build_definitions())",
    "cdc_assets.components.mysql_source": "a component's settings as it loads: the AWS_* credentials every source shares, and the demo source's CDC_* variables (`from_environment`)",
    "cdc_assets.commands.demo": "writes the local servers' URLs, which hold their passwords, for the runs to take as EnvVars",
    "cdc_assets.core.failpoints": "CDC_FAILPOINTS: a test hook, armed in child processes too, no setting",
    "cdc_assets.runtime.instance": "DAGSTER_HOME, DAGSTER_EVENT_BATCH_SIZE: Dagster's own variables",
    "cdc_assets.runtime.empty_home": "XDG_CACHE_HOME: where the process's caches go",
    "spark_resources.session": "PYSPARK_PYTHON, SPARK_LOCAL_IP: the Spark processes' environment",
    "spark_resources.class_archive": "JAVA_HOME, XDG_CACHE_HOME, PYSPARK_PYTHON, SPARK_LOCAL_IP: the JVM's and Python's",
    "cdc_assets.local_source.server": "CDC_DEMO_SOURCE: which flavour the demo's server is",
    "cdc_assets.local_source.mysql_dist": "CDC_MYSQL_DIST: where the demo's MySQL is unpacked",
    "cdc_assets.local_brokers.destinations": "the demo's brokers: whether their variables are set already",
    "cdc_assets.local_brokers.rabbitmq": "the environment of the broker process it starts",
    "cdc_assets.local_spark.cluster": "the environment of the Spark processes it starts",
    "cdc_assets.local_spark.connect_server": "the environment of the Spark Connect server it starts",
    "cdc_assets.local_dev": "`make dev`: the environment of the `dagster dev` it starts",
}
# Of those, the ones that may name a CDC_* variable of the pipeline's settings in their reads.
SETTINGS_READERS = ("cdc_assets.cli", "cdc_assets.defs.resources", "cdc_assets.defs.code_location", "cdc_assets.local_dev")


def _environment_reads(path: Path) -> list[tuple[int, str | None]]:
    """Each read of the process's environment (os.environ, os.getenv, an `environ`/`getenv` imported from os): its
    line and the variable it names, when a literal does."""
    tree = ast.parse(path.read_text())
    reads: list[tuple[int, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            reads += [(node.lineno, None) for a in node.names if a.name in ("environ", "getenv", "getenvb", "environb")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr in ("environ", "getenv", "getenvb", "environb", "putenv"):
                reads.append((node.lineno, None))
    for node in ast.walk(tree):  # the variable a read names: os.environ.get("X"), os.environ["X"], os.getenv("X")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            if isinstance(func, ast.Attribute) and ast.unparse(func) in ("os.environ.get", "os.getenv", "os.environ.setdefault"):
                reads.append((node.lineno, str(node.args[0].value)))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            if isinstance(node.slice, ast.Constant):
                reads.append((node.lineno, str(node.slice.value)))
    return reads


def test_no_module_reads_the_environment_below_the_cli_and_the_resources() -> None:
    """A setting is read once, into the value every stage is given (issue 43): a new read of the environment
    anywhere else shows here, and a CDC_* setting read outside the CLI and the Dagster layer too."""
    found, settings_read, readers = [], [], set()
    for path in sorted([*(ROOT / "cdc_assets").rglob("*.py"), *(ROOT / "spark_resources").rglob("*.py")]):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for line, variable in _environment_reads(path):
            readers.add(module)
            where = f"{path.relative_to(ROOT)}:{line}"
            if module not in ENVIRONMENT_READERS:
                found.append(where)
            elif variable and variable.startswith("CDC_") and module not in SETTINGS_READERS:
                allowed = {"cdc_assets.local_source.server": "CDC_DEMO_SOURCE", "cdc_assets.local_source.mysql_dist": "CDC_MYSQL_DIST"}
                if allowed.get(module) != variable:
                    settings_read.append(f"{where} {variable}")
    assert found == [], f"these read the environment: take the setting from the settings value instead: {found}"
    assert settings_read == [], f"a CDC_* setting read outside the CLI and the Dagster layer: {settings_read}"
    # every exception still reads it (a stale one would hide a new read)
    assert set(ENVIRONMENT_READERS) <= readers, set(ENVIRONMENT_READERS) - readers


def _rows(conn: object, house: object, table: TableRef) -> tuple[object, object]:
    """The source table's rows and its current state's, in the source's columns, sorted by key."""
    from cdc_assets.source.rows import read_source_table, source_shapes
    from cdc_assets.stages.current.apply import read_current

    shape = source_shapes(conn, [table])[table]  # type: ignore[arg-type]
    assert shape is not None
    source_rows = read_source_table(conn, table, list(shape.columns))  # type: ignore[arg-type]
    current = read_current(house, table, [c.name for c in shape.columns])  # type: ignore[arg-type]
    assert current is not None, f"{table} has no current state"
    return source_rows.sort_by("id"), current.select(source_rows.column_names).sort_by("id")


def test_two_settings_in_one_process_are_two_pipelines(
    mariadb: object, mysql: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two settings values, each its own source (MariaDB, MySQL) into its own lakehouse, each run by the pipeline's
    driver in one process, turn about (capture, change logs, current state and the checks): each lakehouse equals its
    own source row for row, its checks say so, and it holds nothing of the other's. The process's environment points
    elsewhere all along: a stage that read it would show."""
    from cdc_assets.lake.layout import CHANGES, CURRENT
    from cdc_assets.lake.state import known_tables
    from cdc_assets.pipeline.driver import Checked, Pending, drive

    for name, value in {
        "CDC_MYSQL_URL": "mysql://nobody@127.0.0.1:9",
        "CDC_LAKEHOUSE": str(tmp_path / "ambient"),
        "CDC_TABLES": "nothing.*",
        "CDC_CURRENT_FILE_KB": "1",
        "CDC_SOFT_DELETES": "*.*",
        "CDC_EXCLUDE_COLUMNS": "*.*.note",  # a stage that took the environment's column policy would drop it
    }.items():
        monkeypatch.setenv(name, value)
    servers = {"a": mariadb, "b": mysql}
    tables = {"a": ("orders", "customers"), "b": ("orders", "stock")}  # a table of the same name on both
    pipelines = {}
    for side, server in servers.items():
        database = f"t_two_settings_{side}"
        with server.admin_connection() as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
            for n, table in enumerate(tables[side]):
                cur.execute(f"CREATE TABLE `{database}`.`{table}` (id INT PRIMARY KEY, note VARCHAR(40), qty INT)")
                values = ", ".join(f"({i}, '{side}-{table}-{i}', {i * (n + 2)})" for i in range(1, 6 + 3 * n))
                cur.execute(f"INSERT INTO `{database}`.`{table}` VALUES {values}")
        settings = Settings.from_env({
            "CDC_MYSQL_URL": server.reader_url(),  # type: ignore[attr-defined]
            "CDC_TABLES": f"{database}.*",
            "CDC_LAKEHOUSE": str(tmp_path / side),
            "CDC_SERVER_ID": "4200711" if side == "a" else "4200712",
            "CDC_MAX_BATCH_ROWS": "3" if side == "a" else "1000",
            "CDC_CURRENT_FILE_KB": "8" if side == "a" else "64",
        })  # fmt: skip
        pipelines[side] = (server, database, resolved_source(settings.source), lakehouse_from(settings.lakehouse))

    def run_both() -> None:
        for side, (_, database, source, house) in pipelines.items():
            reports = list(drive(source, house, owner=f"test {side}"))
            pending = next(r.tables for r in reports if isinstance(r, Pending))  # the tables the run took in
            assert pending and all(t.startswith(f"{database}.") for t in pending), (side, pending)
            checked = [r for r in reports if isinstance(r, Checked)]
            assert len(checked) == 1, side
            found = {str(c.table): c.status for c in checked[0].comparisons}
            assert found == dict.fromkeys(pending, "ok"), (side, found)

    run_both()
    for side, (server, database, _, _) in pipelines.items():  # changes on both, captured and applied again
        with server.admin_connection() as conn, conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"UPDATE `{database}`.orders SET qty = qty + 100 WHERE id % 2 = 0")
            cur.execute(f"DELETE FROM `{database}`.orders WHERE id = 1")
            cur.execute(f"INSERT INTO `{database}`.orders VALUES (50, '{side}-late', 50)")
    run_both()

    assert pipelines["a"][3].current_piece_bytes == 8 * 1024 and pipelines["b"][3].current_piece_bytes == 64 * 1024
    for side, (server, database, _, house) in pipelines.items():
        own = sorted(f"{database}.{t}" for t in tables[side])
        assert known_tables(house.store) == own
        for layer in (CHANGES, CURRENT):
            assert sorted(str(t) for t in house.tables(layer)) == own
        with server.admin_connection() as conn:  # type: ignore[attr-defined]
            for table in tables[side]:
                source_rows, current = _rows(conn, house, TableRef(database, table))
                assert current.equals(source_rows), (side, table)
                assert all(note.startswith(f"{side}-") for note in current.column("note").to_pylist())
    assert not (tmp_path / "ambient").exists()  # no stage made the environment's lakehouse
