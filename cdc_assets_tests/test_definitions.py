"""The code location as the UI shows it: groups, descriptions, freshness policies, schedules and the sensor."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, DefaultScheduleStatus, DefaultSensorStatus

from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.resources import initialized_resources, resources_from_env
from cdc_assets.lake.state import save_registry
from cdc_assets.lake.store import Lakehouse
from cdc_assets_tests.env_settings import settings_now

ASSETS = {
    AssetKey("binlog_position"): "capture",
    AssetKey("raw_binlog_batches"): "capture",
    AssetKey(["mysql", "shop", "orders"]): "sources",
    AssetKey(["changes", "shop", "orders"]): "changes",
    AssetKey(["current", "shop", "orders"]): "current",
}


@pytest.fixture
def orders_registry(tmp_path, monkeypatch) -> None:
    """A lakehouse whose registry knows shop.orders (and a table whose name needs escaping in a key)."""
    house = Lakehouse(str(tmp_path / "lake"))
    save_registry(house.store, {"shop.orders": {"first_batch": "b1", "last_batch": "b1"}, "shop.`a b`": {}})
    monkeypatch.setenv("CDC_LAKEHOUSE", str(tmp_path / "lake"))
    for name in ("CDC_CAPTURE_CRON", "CDC_CAPTURE_INTERVAL_SECONDS", "CDC_CONTINUOUS", "CDC_FRESHNESS_TABLES"):
        monkeypatch.delenv(name, raising=False)


def test_assets_are_grouped_and_everything_is_described(orders_registry) -> None:
    defs = build_definitions()
    defs.get_repository_def()  # what `dagster definitions validate` and the UI build: names unique, jobs resolved
    graph = defs.resolve_asset_graph()
    for key, group in ASSETS.items():
        node = graph.get(key)
        assert node.group_name == group
        assert node.description and len(node.description) > 40
        assert "/tmp" not in node.description and str(Path.home()) not in node.description  # locations: metadata
    # kinds: the source's server, Delta for the lakehouse's tables with the engines that may write them
    assert graph.get(AssetKey(["mysql", "shop", "orders"])).kinds == {"mysql"}
    assert graph.get(AssetKey(["current", "shop", "orders"])).kinds == {"delta", "arrow", "spark"}
    assert {"mysql", "parquet"} <= graph.get(AssetKey("raw_binlog_batches")).kinds
    # lineage: source -> change log -> current state, the raw batches upstream of every change log
    assert graph.get(AssetKey(["changes", "shop", "orders"])).parent_keys == {
        AssetKey(["mysql", "shop", "orders"]),
        AssetKey("raw_binlog_batches"),
    }
    assert graph.get(AssetKey(["current", "shop", "orders"])).parent_keys == {AssetKey(["changes", "shop", "orders"])}
    # the capture waits for the binlog position, external: observed by its sensor, never materialized
    assert graph.get(AssetKey("raw_binlog_batches")).parent_keys == {AssetKey("binlog_position")}
    assert graph.get(AssetKey("binlog_position")).is_external and not graph.get(AssetKey("binlog_position")).is_materializable
    for check in graph.asset_check_keys:
        assert graph.get(check).description, check
    # Markdown shows what is written: a `<schema>/<table>` path only inside backticks (bare, Markdown ate it)
    described = [graph.get(k).description for k in [*graph.get_all_asset_keys(), *graph.asset_check_keys]]
    described += [d.description for d in [*(defs.jobs or []), *(defs.sensors or []), *(defs.schedules or [])]]
    assert not [d for d in described if "<" in re.sub(r"`[^`]*`", "", d or "")]
    for sensor in defs.sensors or []:
        assert sensor.description, sensor.name
    for schedule in defs.schedules or []:
        assert schedule.description, schedule.name
    for job in defs.jobs or []:
        assert job.description, job.name
    for name, resource in resources_from_env().by_key().items():
        assert resource.get_resource_definition().description, name
    assert {s.name for s in defs.sensors} == {
        "automation_sensor",
        "binlog_position_sensor",
        "raw_batch_sensor",
        "new_tables_sensor",
        "binlog_sensor",
        "continuous_sensor",
        "examples_automation_sensor",
    }
    assert {s.name for s in defs.schedules} == {"capture_schedule", "lag_check_schedule", "full_equality_schedule"}
    # freshness governs by default: the automation sensor runs, the cron schedule and the raw-batch sensor are options
    running = {s.name for s in defs.sensors if s.default_status == DefaultSensorStatus.RUNNING}
    assert {"automation_sensor", "binlog_position_sensor", "new_tables_sensor"} <= running and "raw_batch_sensor" not in running
    assert next(s for s in defs.schedules if s.name == "capture_schedule").default_status == DefaultScheduleStatus.STOPPED
    # an idle source runs nothing: the binlog position sensor records the lag, without the lag check job's runs
    assert next(s for s in defs.schedules if s.name == "lag_check_schedule").default_status == DefaultScheduleStatus.STOPPED


def test_the_schedule_mode_turns_the_automation_off(orders_registry, monkeypatch) -> None:
    monkeypatch.setenv("CDC_CAPTURE_CRON", "*/2 * * * *")
    defs = build_definitions()
    running = {s.name for s in defs.sensors if s.default_status == DefaultSensorStatus.RUNNING}
    assert "raw_batch_sensor" in running and not {"automation_sensor", "binlog_position_sensor"} & running
    assert next(s for s in defs.schedules if s.name == "capture_schedule").default_status == DefaultScheduleStatus.RUNNING
    assert next(s for s in defs.schedules if s.name == "lag_check_schedule").default_status == DefaultScheduleStatus.RUNNING


def test_freshness_policies_default_to_warn_after_2_and_fail_after_5_minutes(orders_registry, monkeypatch) -> None:
    for name in ("CDC_FRESHNESS_WARN_MINUTES", "CDC_FRESHNESS_FAIL_MINUTES", "CDC_LAG_WARN_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    node = build_definitions().resolve_asset_graph().get(AssetKey(["current", "shop", "orders"]))
    policy = node.freshness_policy
    assert policy.fail_window.to_timedelta() == timedelta(minutes=5)
    assert policy.warn_window.to_timedelta() == timedelta(minutes=2)
    assert settings_now().cadence.lag_thresholds == (120.0, 300.0)
    assert node.automation_condition.get_label() == "within 2 min: on_cron(* * * * *)"


def test_freshness_windows_are_configurable_per_table_and_checked(orders_registry, monkeypatch) -> None:
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "10")
    monkeypatch.setenv("CDC_FRESHNESS_FAIL_MINUTES", "30")
    monkeypatch.setenv("CDC_FRESHNESS_TABLES", "shop.ord*=4/8")
    graph = build_definitions().resolve_asset_graph()
    orders, other = graph.get(AssetKey(["current", "shop", "orders"])), graph.get(AssetKey(["current", "shop", "a~20b"]))
    assert orders.freshness_policy.fail_window.to_timedelta() == timedelta(minutes=8)
    assert other.freshness_policy.fail_window.to_timedelta() == timedelta(minutes=30)
    assert orders.automation_condition.get_label() == "within 4 min: on_cron(*/2 * * * *)"
    assert other.automation_condition.get_label() == "within 10 min: on_cron(*/5 * * * *)"
    # capture keeps ahead of the tightest window
    raw = graph.get(AssetKey("raw_binlog_batches"))
    assert "on_cron(*/2 * * * *)" in raw.automation_condition.get_label()
    assert settings_now().cadence.lag_thresholds == (600.0, 1800.0)
    monkeypatch.setenv("CDC_FRESHNESS_TABLES", "shop.orders=8/4")
    with pytest.raises(CdcUserError, match="CDC_FRESHNESS_TABLES entry 'shop.orders=8/4' needs a warn window"):
        build_definitions()
    monkeypatch.delenv("CDC_FRESHNESS_TABLES")
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "0.5")
    with pytest.raises(CdcUserError, match="at least 1"):
        build_definitions()
    monkeypatch.setenv("CDC_FRESHNESS_WARN_MINUTES", "40")
    with pytest.raises(CdcUserError, match="must be below CDC_FRESHNESS_FAIL_MINUTES"):
        build_definitions()


def test_resources_are_declared_once_and_read_the_environment(monkeypatch) -> None:
    """One S3Resource, registered and injected into the lakehouse; one dagster-pyspark session resource, used
    by the transforms; CDC_SPARK_MIN_ROWS and CDC_SPARK_MASTER read."""
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "7")
    monkeypatch.setenv("CDC_SPARK_MASTER", "sc://127.0.0.1:15999")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    resources = resources_from_env()
    assert resources.lakehouse.s3 is resources.s3 and resources.transforms.pyspark is resources.pyspark
    assert resources.transforms.min_rows == 7
    monkeypatch.delenv("CDC_SPARK_MIN_ROWS")
    assert resources_from_env().transforms.min_rows == 0  # a Connect server or a cluster takes every run
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[2]")
    assert resources_from_env().transforms.min_rows == 1_000_000  # locally, small runs stay on Arrow
    monkeypatch.setenv("CDC_SPARK_MASTER", "sc://127.0.0.1:15999")
    assert resources.pyspark.spark_config["spark.remote"] == "sc://127.0.0.1:15999"
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[1]")
    monkeypatch.setenv("CDC_SPARK_CONF", '{"spark.executor.memory": "2g", "spark.sql.shuffle.partitions": 8}')
    config = resources_from_env().pyspark.spark_config
    assert config["spark.master"] == "local[1]" and config["spark.executor.memory"] == "2g"
    assert config["spark.sql.shuffle.partitions"] == "8"  # the user's setting wins over ours
    assert config["spark.driver.host"] == "127.0.0.1"  # executors on this machine reach the driver there
    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://spark-master.internal:7077")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    remote = resources_from_env().pyspark.spark_config
    assert "spark.driver.host" not in remote  # others reach the driver at its own address
    assert "spark.pyspark.python" not in remote  # a cluster elsewhere runs its workers' own Python
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/cdc/bin/python")
    assert resources_from_env().pyspark.spark_config["spark.pyspark.python"] == "/opt/cdc/bin/python"
    monkeypatch.setenv("CDC_SPARK_MASTER", "local[1]")
    monkeypatch.setenv("CDC_SPARK_CONF", "spark.executor.memory=2g")
    with pytest.raises(CdcUserError, match="CDC_SPARK_CONF is not a JSON object"):
        resources_from_env()
    monkeypatch.delenv("CDC_SPARK_CONF")
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "many")
    with pytest.raises(CdcUserError, match="CDC_SPARK_MIN_ROWS"):
        resources_from_env()
    monkeypatch.delenv("CDC_SPARK_MIN_ROWS")
    monkeypatch.setenv("CDC_MYSQL_URL", "mysql://reader:secret@127.0.0.1:9")
    monkeypatch.setenv("CDC_SNAPSHOT_CHUNK_ROWS", "2500")
    assert initialized_resources().binlog.settings().snapshot_chunk_rows == 2500
    monkeypatch.setenv("CDC_SNAPSHOT_CHUNK_ROWS", "0")
    with pytest.raises(CdcUserError, match="CDC_SNAPSHOT_CHUNK_ROWS='0' is not a positive whole number"):
        resources_from_env()


def test_an_s3_lakehouse_takes_boto3_and_delta_rs_settings_from_one_s3_resource(monkeypatch) -> None:
    for name, value in {
        "CDC_LAKEHOUSE": "s3://bucket/prefix",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "eu-west-3",
        "AWS_ACCESS_KEY_ID": "key-id",
        "AWS_SECRET_ACCESS_KEY": "secret-key",
    }.items():
        monkeypatch.setenv(name, value)
    from cdc_assets.defs.resources import initialized_resources

    lakehouse = initialized_resources().lakehouse.get()
    options = lakehouse.storage_options()
    assert options is not None
    assert (options["AWS_ENDPOINT_URL"], options["AWS_REGION"], options["AWS_ACCESS_KEY_ID"]) == (
        "http://127.0.0.1:9",
        "eu-west-3",
        "key-id",
    )
    assert options["AWS_ALLOW_HTTP"] == "true"
    client = lakehouse.store.client  # type: ignore[attr-defined]
    assert client.meta.endpoint_url == "http://127.0.0.1:9" and client.meta.region_name == "eu-west-3"
    assert "secret-key" not in repr(lakehouse.s3)


def test_owners_are_configurable(orders_registry, monkeypatch) -> None:
    monkeypatch.setenv("CDC_ASSET_OWNERS", "data@example.com, team:analytics")
    graph = build_definitions().resolve_asset_graph()
    for key in ASSETS:
        assert graph.get(key).owners == ["data@example.com", "team:analytics"], key
    monkeypatch.setenv("CDC_ASSET_OWNERS", "data team")
    with pytest.raises(CdcUserError, match="CDC_ASSET_OWNERS entry 'data team' is neither an e-mail address nor team:<name>"):
        build_definitions()


def test_each_configured_sink_is_an_asset_downstream_of_the_change_logs_with_its_job_check_and_sensor(
    orders_registry, monkeypatch
) -> None:
    for name in ("CDC_RABBITMQ_URL", "CDC_KINESIS_STREAM", "CDC_SINK_HEARTBEAT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    plain = build_definitions()
    assert not [k for k in plain.resolve_asset_graph().get_all_asset_keys() if k.path[0] == "sinks"]
    tables = [k for k in plain.resolve_asset_graph().get_all_asset_keys() if k.path[0] == "changes"]
    monkeypatch.setenv("CDC_RABBITMQ_URL", "amqp://cdc:secret@127.0.0.1:9/%2F")
    monkeypatch.setenv("CDC_KINESIS_STREAM", "changes")
    monkeypatch.setenv("CDC_SINK_HEARTBEAT_SECONDS", "5")
    defs = build_definitions()
    graph = defs.resolve_asset_graph()
    for sink in ("rabbitmq", "kinesis"):
        node = graph.get(AssetKey(["sinks", sink]))
        assert node.group_name == "sinks" and set(tables) <= node.parent_keys
        assert node.freshness_policy is not None and node.freshness_policy.fail_window.to_timedelta() == timedelta(minutes=5)
        assert node.description and f"publish_{sink}" in {j.name for j in defs.jobs}
        assert any(check.name == "sink_lag" and check.asset_key == node.key for check in graph.asset_check_keys)
    lag_job = defs.resolve_job_def("check_lag")
    assert {k.asset_key.to_user_string() for k in lag_job.asset_layer.asset_graph.asset_check_keys} >= {"sinks/rabbitmq", "sinks/kinesis"}
    sensor = next(s for s in defs.sensors if s.name == "sink_sensor")
    assert sensor.minimum_interval_seconds == 5  # as often as the heartbeat when that is shorter than 15 s
    assert {job.name for job in sensor.jobs} == {"publish_rabbitmq", "publish_kinesis"}
    assert "secret" not in str(resources_from_env().sinks)  # the AMQP URL is an EnvVar, never a value in config


def test_resources_used_outside_runs_read_the_environment_and_refuse_a_bad_number(monkeypatch) -> None:
    """What the CLI uses before and beside its runs: the values themselves (no EnvVar left), no Dagster instance."""
    monkeypatch.setenv("CDC_MYSQL_URL", "mysql://reader:secret@db.example:3307")  # not the demo server's
    monkeypatch.setenv("CDC_SERVER_ID", "4321")
    monkeypatch.setenv("CDC_TABLES", "shop.*")
    resources = initialized_resources()
    assert resources.binlog.server_id == 4321 and resources.binlog.settings().server_id == 4321
    assert resources.binlog.tables == "shop.*"
    monkeypatch.setenv("CDC_SERVER_ID", "forty")
    with pytest.raises(CdcUserError, match="CDC_SERVER_ID='forty' is not a whole number"):
        initialized_resources()


def test_an_idle_source_with_sinks_records_their_lag_without_a_run(orders_registry, monkeypatch) -> None:
    """The automation mode runs nothing while the source is idle, sinks or not: the binlog position sensor records
    each sink's lag check, as it does the tables', and the lag check job's schedule stays stopped."""
    from dagster import AssetCheckEvaluation, DagsterInstance, build_sensor_context

    monkeypatch.setenv("CDC_MYSQL_URL", "mysql://reader@127.0.0.1:9")  # nothing listens: the tables are not compared
    monkeypatch.setenv("CDC_RABBITMQ_URL", "amqp://cdc@127.0.0.1:9/%2F")
    monkeypatch.setenv("CDC_KINESIS_STREAM", "changes")
    defs = build_definitions()
    assert next(s for s in defs.schedules if s.name == "lag_check_schedule").default_status == DefaultScheduleStatus.STOPPED
    sensor = next(s for s in defs.sensors if s.name == "binlog_position_sensor")
    with build_sensor_context(
        instance=DagsterInstance.ephemeral(), repository_def=defs.get_repository_def(), resources=resources_from_env().by_key()
    ) as context:
        result = sensor(context)
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)
    }
    for sink in ("rabbitmq", "kinesis"):
        lag = checks[(f"sinks/{sink}", "sink_lag")]
        assert lag.passed and lag.description.startswith("up to date with the change logs")  # no change log yet
    assert not checks[("current/shop/orders", "table_lag")].passed  # the source did not answer: not compared


def test_a_demo_source_whose_server_is_not_started_waits_for_it_without_a_run(orders_registry, monkeypatch, tmp_path) -> None:
    """A source without a URL reads a local demo server (the project's `demo_mysql` beside `demo` under `make dev`):
    while that server is not started, the binlog position sensor records no position, so the automation launches
    no run that would fail, says how to start it, and reports the tables' lag as not compared."""
    from dagster import AssetCheckEvaluation, AssetMaterialization, DagsterInstance, build_sensor_context

    import cdc_assets.source.server as source_server

    monkeypatch.delenv("CDC_MYSQL_URL", raising=False)
    monkeypatch.setenv("CDC_DEMO_SOURCE", "mysql")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(source_server, "PROJECT_ROOT", tmp_path)  # not the checkout's own demo server, if it runs
    defs = build_definitions()
    sensor = next(s for s in defs.sensors if s.name == "binlog_position_sensor")
    with build_sensor_context(
        instance=DagsterInstance.ephemeral(), repository_def=defs.get_repository_def(), resources=resources_from_env().by_key()
    ) as context:
        result = sensor(context)
    assert not [e for e in result.asset_events if isinstance(e, AssetMaterialization)]  # no position: no run
    assert "the local demo mysql server is not running" in str(result.skip_reason)
    assert "make local-source-start SOURCE=mysql" in str(result.skip_reason)
    lags = [e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)]
    assert len(lags) == 2 and all(not lag.passed and "not compared" in (lag.description or "") for lag in lags)
