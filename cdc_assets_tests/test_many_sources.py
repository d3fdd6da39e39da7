"""Many sources in one code location (issue 44): two named sources, two databases of the one MariaDB test server each
into a lakehouse of its own, merged into one Definitions. Their names never collide, each source's sync runs from the
merged definitions against one instance and records under its own keys, and a source whose server is down fails its
own run only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, Definitions

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings
from cdc_assets.defs.code_location import build_definitions, build_definitions_of
from cdc_assets.defs.keys import SYNC_JOB, SourceKeys
from cdc_assets.local_source import server as local_server
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.stage_runs import source_and_current


def _source(server: local_server.LocalServer, database: str, lakehouse: Path, name: str) -> CdcEnv:
    """A database of its own on `server`, with one small table whose rows say `name`."""
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        cur.execute(f"CREATE DATABASE `{database}`")
    env = CdcEnv(server, database, lakehouse)
    env.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20))",
        f"INSERT INTO t VALUES (1, '{name}-1'), (2, '{name}-2'), (3, '{name}-3')",
    )
    return env


def _settings(name: str, env: CdcEnv, url: str, server_id: int) -> Settings:
    return Settings.from_env(
        {
            **os.environ,
            "CDC_SOURCE_NAME": name,
            "CDC_MYSQL_URL": url,
            "CDC_TABLES": f"{env.database}.*",
            "CDC_LAKEHOUSE": str(env.lakehouse_dir),
            "CDC_SERVER_ID": str(server_id),
        }
    )


def _names(defs: Definitions) -> set[str]:
    """Every name the definitions give: asset and check keys, jobs, sensors, schedules, resource keys."""
    graph = defs.resolve_asset_graph()
    return (
        {f"asset {k.to_user_string()}" for k in graph.get_all_asset_keys()}
        | {f"check {k.to_user_string()}" for k in graph.asset_check_keys}
        | {f"job {j.name}" for j in defs.jobs or []}
        | {f"sensor {s.name}" for s in defs.sensors or []}
        | {f"schedule {s.name}" for s in defs.schedules or []}
        | {f"resource {r}" for r in defs.resources or {}}
    )


@pytest.fixture
def two_sources(source: local_server.LocalServer, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[CdcEnv, CdcEnv]:
    base = "t_many_" + hashlib.sha1(request.node.name.encode()).hexdigest()[:8]
    orders = _source(source, f"{base}_a", tmp_path / "orders_lake", "order")
    billing = _source(source, f"{base}_b", tmp_path / "billing_lake", "bill")
    return orders, billing


def test_two_sources_in_one_code_location_sync_each_into_its_own_lakehouse(two_sources, source) -> None:
    orders, billing = two_sources
    url = source.reader_url()
    settings = [_settings("orders_db", orders, url, 4101), _settings("billing", billing, url, 4102)]
    merged = build_definitions_of(settings)
    Definitions.validate_loadable(merged)
    instance = DagsterInstance.ephemeral()  # one instance for both, as a shared deployment has
    for s in settings:
        job = merged.resolve_job_def(SourceKeys(s.name).job(SYNC_JOB))
        assert job.execute_in_process(instance=instance, raise_on_error=False).success, s.name

    # loaded again, each source now has its table's assets and checks: still no name in common, and they merge
    each = [build_definitions(s) for s in settings]
    assert any(name.startswith("check orders_db/current/") for name in _names(each[0]))
    shared = _names(each[0]) & _names(each[1])
    assert shared == set(), shared
    Definitions.validate_loadable(build_definitions_of(settings))

    for env, name in ((orders, "orders_db"), (billing, "billing")):
        source_rows, current = source_and_current(env, "t")
        assert current.to_pylist() == source_rows.to_pylist() and current.num_rows == 3
        keys = SourceKeys(name)
        for key in (keys.raw_asset, keys.changes_asset_key(f"{env.database}.t"), keys.table_asset_key(f"{env.database}.t")):
            assert instance.get_latest_materialization_event(key) is not None, key
    # nothing under the plain names of the unnamed source, nor one source's table under the other's name
    assert instance.get_latest_materialization_event(AssetKey("raw_binlog_batches")) is None
    assert instance.get_latest_materialization_event(AssetKey(["current", orders.database, "t"])) is None
    assert instance.get_latest_materialization_event(SourceKeys("billing").table_asset_key(f"{orders.database}.t")) is None
    # the rows of one source never reach the other's lakehouse
    assert not (billing.lakehouse_dir / "current" / orders.database).exists()
    assert not (orders.lakehouse_dir / "current" / billing.database).exists()


def test_a_source_whose_server_is_down_fails_only_its_own_run(two_sources, source) -> None:
    orders, billing = two_sources
    closed = f"mysql://reader:x@127.0.0.1:{local_server.free_port()}"  # nothing listens there
    settings = [_settings("orders_db", orders, source.reader_url(), 4103), _settings("billing", billing, closed, 4104)]
    merged = build_definitions_of(settings)
    instance = DagsterInstance.ephemeral()
    down = merged.resolve_job_def(SourceKeys("billing").job(SYNC_JOB)).execute_in_process(instance=instance, raise_on_error=False)
    up = merged.resolve_job_def(SourceKeys("orders_db").job(SYNC_JOB)).execute_in_process(instance=instance, raise_on_error=False)
    assert not down.success and up.success
    [failure] = [e.step_failure_data.error for e in down.all_events if e.is_step_failure]
    assert "connect" in str(failure.to_string()).lower(), failure.to_string()  # billing's server, nothing else
    source_rows, current = source_and_current(orders, "t")
    assert current.to_pylist() == source_rows.to_pylist()
    assert instance.get_latest_materialization_event(SourceKeys("billing").raw_asset) is None


def test_two_sources_with_one_name_or_one_lakehouse_are_refused(two_sources, source) -> None:
    orders, billing = two_sources
    url = source.reader_url()
    with pytest.raises(CdcUserError, match="Two sources are named 'orders_db'"):
        build_definitions_of([_settings("orders_db", orders, url, 4105), _settings("orders_db", billing, url, 4106)])
    same_lake = CdcEnv(billing.server, billing.database, orders.lakehouse_dir)
    with pytest.raises(CdcUserError, match="both write the lakehouse"):
        build_definitions_of([_settings("orders_db", orders, url, 4105), _settings("billing", same_lake, url, 4106)])
