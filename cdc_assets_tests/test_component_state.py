"""The MySQLSource component's state (issue 44, item 4): the source's table list, written by a refresh (`dg utils
refresh-defs-state`, or each load under `dg dev`), from which the per-table assets are built. The definitions do not
depend on the lakehouse or the source as they are when a run loads them: a table created at the source gets its
assets at the next refresh, a run loads the tables its code server showed, and a run of tables whose lakehouse was
moved away fails with one sentence instead of Dagster's DagsterInvalidSubsetError."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from cdc_assets.components.mysql_source import settings_of
from cdc_assets.components.project import named_source
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB, SYNC_JOB, UNNAMED, SourceKeys
from cdc_assets.local_source.server import LocalServer
from cdc_assets_tests.conftest import _database_name
from cdc_assets_tests.dagster_dev import write_project

SOURCE = "orders_db"
KEYS = SourceKeys(SOURCE)


def _execute(source: LocalServer, *statements: str) -> None:
    with source.admin_connection() as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


@pytest.fixture
def schema(source: LocalServer, request: pytest.FixtureRequest) -> str:
    """A schema of the test's own on the source server, with one table of 5 rows."""
    name = _database_name(request.node.name)
    _execute(
        source,
        f"DROP DATABASE IF EXISTS `{name}`",
        f"CREATE DATABASE `{name}`",
        f"CREATE TABLE `{name}`.accounts (id INT PRIMARY KEY, owner VARCHAR(20))",
        f"INSERT INTO `{name}`.accounts VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')",
    )
    return name


@pytest.fixture
def project(source: LocalServer, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's dg project with one source, `orders_db`, whose lakehouse does not exist yet."""
    root = tmp_path / "project"
    monkeypatch.setenv(f"{SOURCE.upper()}_URL", source.reader_url())
    for variable in [v for v in os.environ if v.startswith("CDC_")]:
        monkeypatch.delenv(variable)
    monkeypatch.delenv("DAGSTER_IS_DEV_CLI", raising=False)
    write_project(root, {SOURCE: tmp_path / "lake"}, {SOURCE: f"{schema}.*"})
    monkeypatch.syspath_prepend(str(root))
    for module in [m for m in sys.modules if m.split(".")[0] == "shop_project"]:
        monkeypatch.delitem(sys.modules, module)  # another test's project of the same package name
    return root


def _state_file(project: Path) -> Path:
    return project / "shop_project" / "defs" / ".local_defs_state" / f"MySQLSource__{SOURCE}__" / "state"


def _load(project: Path, monkeypatch: pytest.MonkeyPatch, dev: bool = False) -> dg.Definitions:
    """The project's definitions as a code server loads them: under `dg dev` / `dagster dev` (`dev`: the state is
    refreshed first), or elsewhere (a deployed code server, a run's process: the state as last written)."""
    with monkeypatch.context() as scope:
        if dev:
            scope.setenv("DAGSTER_IS_DEV_CLI", "1")  # what `dagster dev` sets for its code servers
        return dg.load_from_defs_folder(path_within_project=project / "shop_project")


def _tables(defs: dg.Definitions) -> set[str]:
    keys = defs.resolve_asset_graph().get_all_asset_keys()
    return {t for k in keys if KEYS.is_current(k) and (t := KEYS.table_of_key(k)) is not None}


def test_the_state_is_the_sources_tables_and_a_new_table_appears_at_the_next_refresh(
    project: Path, schema: str, source: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no state written yet: the source loads, without per-table assets; the new-tables sensor applies every table
    defs = _load(project, monkeypatch)
    assert _tables(defs) == set()
    assert KEYS.qualified("new_tables_sensor") in {s.name for s in defs.sensors or []}

    # the documented refresh: the state holds the source's table under its filter, before capture registered it
    refreshed = subprocess.run(
        [str(Path(sys.executable).parent / "dg"), "utils", "refresh-defs-state"],
        cwd=project, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(project)},
    )  # fmt: skip
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    state = json.loads(_state_file(project).read_text())
    assert state["tables"] == [{"name": f"{schema}.accounts", "captured": False, "dropped_seq": None}]
    assert _tables(_load(project, monkeypatch)) == {f"{schema}.accounts"}

    # a table created at the source: the loaded state is kept until a refresh (dg dev refreshes at each load)
    _execute(source, f"CREATE TABLE `{schema}`.invoices (id INT PRIMARY KEY)")
    assert _tables(_load(project, monkeypatch)) == {f"{schema}.accounts"}
    assert _tables(_load(project, monkeypatch, dev=True)) == {f"{schema}.accounts", f"{schema}.invoices"}

    # a table of the source that capture has not registered yet: its run has nothing to apply, and succeeds
    job = _load(project, monkeypatch).resolve_job_def(KEYS.job(APPLY_JOB))
    run = job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), asset_selection=[KEYS.table_asset_key(f"{schema}.invoices")]
    )
    assert run.success and not run.get_asset_materialization_events()


def test_a_run_of_tables_whose_lakehouse_was_moved_fails_with_one_sentence(
    project: Path, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = dg.DagsterInstance.ephemeral()
    sync = _load(project, monkeypatch).resolve_job_def(KEYS.job(SYNC_JOB))
    assert sync.execute_in_process(instance=instance).success
    # the code server loads (dagster dev: state refreshed), with the table captured
    table = f"{schema}.accounts"
    assert _tables(_load(project, monkeypatch, dev=True)) == {table}
    assert json.loads(_state_file(project).read_text())["tables"][0]["captured"] is True

    shutil.move(tmp_path / "lake", tmp_path / "lake-moved")
    selection = [KEYS.changes_asset_key(table), KEYS.table_asset_key(table)]
    # definitions built from the lakehouse as it is when a run's process loads them (as before the component kept
    # state) have no such keys: Dagster's framework error, not a sentence
    settings = settings_of(named_source(SOURCE, project))
    with pytest.raises(dg.DagsterInvalidSubsetError, match="no AssetsDefinition objects supply these keys"):
        build_definitions(settings).resolve_job_def(KEYS.job(APPLY_JOB)).execute_in_process(asset_selection=selection)

    # the run's own process loads the definitions again (Dagster's run worker): the state the code server loaded,
    # so the keys it selects exist, and the run fails with the sentence
    job = _load(project, monkeypatch).resolve_job_def(KEYS.job(APPLY_JOB))
    run = job.execute_in_process(instance=instance, asset_selection=selection, raise_on_error=False)
    assert not run.success
    [failure] = [e.step_failure_data.error for e in run.all_events if e.is_step_failure]
    assert failure.cause is not None and failure.cause.cls_name == "CdcUserError", failure.to_string()
    assert failure.cause.message.strip() == (
        f"cdc_assets.core.errors.CdcUserError: The lakehouse {tmp_path / 'lake'} has lost its table registry "
        "(_state/tables.json), which listed this run's tables when the definitions loaded: it was moved or removed. "
        "Point the source's lakehouse (CDC_LAKEHOUSE, or the component's `lakehouse`) at where it is now, or reload "
        "the definitions to begin a new lakehouse there."
    )
    # a run that captures, with the tables (the automation's) or alone, fails the same, and begins no new lakehouse
    # where the old one was (it would start again from the oldest binlog, as if nothing had been captured)
    for with_capture in ([KEYS.raw_asset, *selection], [KEYS.raw_asset]):
        job = _load(project, monkeypatch).resolve_implicit_global_asset_job_def()
        run = job.execute_in_process(instance=instance, asset_selection=with_capture, raise_on_error=False)
        assert not run.success
        failures = [e.step_failure_data.error for e in run.all_events if e.is_step_failure]
        assert failures and all("has lost its table registry" in (f.cause or f).message for f in failures)
        assert not (tmp_path / "lake").exists()


def test_the_demo_source_keeps_one_table_list_per_lakehouse(
    source: LocalServer, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository's own defs folder, whose demo source is the environment of the process loading it: `make dev`
    and other processes beside it (the suite's workers) load the same folder with other lakehouses. Each keeps its
    table list apart, so a run's process reads what its own code server wrote; one shared file made a run launched
    from the UI select a table another process's refresh had left out (DagsterInvalidSubsetError)."""
    name = _database_name(request.node.name)[:50]
    environments: dict[str, dict[str, str]] = {}
    for side in ("a", "b"):
        schema = f"{name}_{side}"
        _execute(source, f"DROP DATABASE IF EXISTS `{schema}`", f"CREATE DATABASE `{schema}`",
                 f"CREATE TABLE `{schema}`.only_{side} (id INT PRIMARY KEY)")  # fmt: skip
        environments[side] = {
            "CDC_MYSQL_URL": source.reader_url(),
            "CDC_LAKEHOUSE": str(tmp_path / f"lake-{side}"),
            "CDC_TABLES": f"{schema}.*",
        }
    sources = Path(__file__).resolve().parent.parent / "cdc_assets" / "sources"
    keys = UNNAMED

    def tables(side: str, dev: bool) -> set[str]:
        """The demo source's tables as `side`'s process loads them: refreshing its state (`dev`), or as a run's."""
        with monkeypatch.context() as scope:
            for variable in [v for v in os.environ if v.startswith("CDC_")]:
                scope.delenv(variable)
            for variable, value in environments[side].items():
                scope.setenv(variable, value)
            if dev:
                scope.setenv("DAGSTER_IS_DEV_CLI", "1")
            else:
                scope.delenv("DAGSTER_IS_DEV_CLI", raising=False)
            defs = dg.load_from_defs_folder(path_within_project=sources)
        graph = defs.resolve_asset_graph().get_all_asset_keys()
        return {t for k in graph if keys.is_current(k) and (t := keys.table_of_key(k)) is not None}

    written = {p.name for p in (sources / ".local_defs_state").glob("MySQLSource*")}
    try:
        assert tables("a", dev=True) == {f"{name}_a.only_a"}  # a's code server loads
        assert tables("b", dev=True) == {f"{name}_b.only_b"}  # then b's, beside it
        assert tables("a", dev=False) == {f"{name}_a.only_a"}  # a's run still has a's table
    finally:
        for state in (sources / ".local_defs_state").glob("MySQLSource*"):
            if state.name not in written:
                shutil.rmtree(state, ignore_errors=True)
