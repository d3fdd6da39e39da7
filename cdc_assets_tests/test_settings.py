"""Configuration parsing: URLs, table filters and their error sentences."""

import pytest

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import MySQLUrl, TableFilter, TableSelection


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
def test_a_lock_ttl_below_three_seconds_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from cdc_assets.defs.resources import lock_ttl_seconds

    monkeypatch.setenv("CDC_LOCK_TTL_SECONDS", value)
    with pytest.raises(CdcUserError, match="CDC_LOCK_TTL_SECONDS"):
        lock_ttl_seconds()
    monkeypatch.setenv("CDC_LOCK_TTL_SECONDS", "7.5")
    assert lock_ttl_seconds() == 7.5


@pytest.mark.parametrize("value", ["0", "-4", "big"])
def test_a_current_file_size_below_one_kb_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """CDC_CURRENT_FILE_KB (its effect on the files: test_pipeline, copy on write by file)."""
    from cdc_assets.stages.current.rows import current_piece_bytes

    monkeypatch.delenv("CDC_CURRENT_FILE_KB", raising=False)
    assert current_piece_bytes() == 32 * 1024
    monkeypatch.setenv("CDC_CURRENT_FILE_KB", value)
    with pytest.raises(CdcUserError, match="CDC_CURRENT_FILE_KB"):
        current_piece_bytes()
    monkeypatch.setenv("CDC_CURRENT_FILE_KB", "4096")
    assert current_piece_bytes() == 4096 * 1024


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


def test_the_forked_capture_reads_the_same_settings_as_the_resources(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """`sync` forks its capture before Dagster is imported, so the child reads the environment without the
    resources: through the same variables (SOURCE_ENV, LAKEHOUSE_ENV) and the same parsing, field for field."""
    from cdc_assets.core.settings import LAKEHOUSE_ENV, SOURCE_ENV
    from cdc_assets.defs.resources import BinlogResource, LakehouseResource, initialized_resources
    from cdc_assets.lake.store import local_lakehouse_from_env
    from cdc_assets.source.server import source_settings_from_env

    # Every resource field is one of the shared variables, or no variable at all (a run's own, or S3's).
    assert set(BinlogResource.model_fields) == set(SOURCE_ENV) | {"max_batches", "snapshot_chunk_rows", "global_read_lock"}
    shared = set(LAKEHOUSE_ENV) | {"lock_wait_seconds", "lock_ttl_seconds"}
    assert set(LakehouseResource.model_fields) == shared | {"s3", "s3_max_attempts", "s3_timeout_seconds"}

    for name, value in {
        "CDC_MYSQL_URL": "mysql://reader:s3cret@db.example:3307",
        "CDC_SERVER_ID": "77",
        "CDC_TABLES": "shop.*",
        "CDC_EXCLUDE_TABLES": "shop.tmp_*",
        "CDC_MAX_BATCH_ROWS": "1234",
        "CDC_SNAPSHOT_CHUNK_ROWS": "5000",
        "CDC_GLOBAL_READ_LOCK": "on",
        "CDC_LAKEHOUSE": str(tmp_path / "lake"),
        "CDC_LOCK_WAIT_SECONDS": "9",
        "CDC_LOCK_TTL_SECONDS": "11",
        "CDC_HISTORY_TABLES": "shop.orders",
        "CDC_SOFT_DELETES": "shop.customers",
    }.items():
        monkeypatch.setenv(name, value)
    resources = initialized_resources()
    forked = source_settings_from_env()
    assert forked == resources.binlog.settings()
    assert (forked.server_id, forked.max_batch_rows, forked.snapshot_chunk_rows) == (77, 1234, 5000)
    assert forked.global_read_lock
    assert forked.table_filter.matches("shop", "orders") and not forked.table_filter.matches("shop", "tmp_1")
    house, theirs = local_lakehouse_from_env(), resources.lakehouse.get()
    described = lambda h: (h.location, h.lock_wait_seconds, h.lock_ttl_seconds, h.history, h.soft_deletes)  # noqa: E731
    assert described(house) == described(theirs) == (
        str(tmp_path / "lake"), 9.0, 11.0, TableSelection(("shop.orders",)), TableSelection(("shop.customers",))
    )

    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "many")  # both refuse a bad number with the same sentence
    with pytest.raises(CdcUserError, match="CDC_MAX_BATCH_ROWS='many' is not a whole number") as forked_error:
        source_settings_from_env()
    with pytest.raises(CdcUserError) as resource_error:
        initialized_resources()
    assert str(forked_error.value) == str(resource_error.value)


@pytest.mark.parametrize(
    ("master", "min_rows"),
    [("local[2]", None), ("local[2]", "5000"), ("spark://127.0.0.1:7077", None), ("sc://127.0.0.1:15002", "10")],
)
def test_the_forked_stages_choose_the_engine_the_run_would(
    monkeypatch: pytest.MonkeyPatch, master: str, min_rows: str | None
) -> None:
    """A sync's forked child takes the stages only where the run would take them on Arrow: its threshold is the
    run's, read without Dagster; at or above it the child leaves the stage to the run."""
    from cdc_assets.defs.resources import initialized_resources
    from cdc_assets.runtime.forked_stages import LeftToRun, arrow_only, run_min_rows

    monkeypatch.setenv("CDC_SPARK_MASTER", master)
    if min_rows is None:
        monkeypatch.delenv("CDC_SPARK_MIN_ROWS", raising=False)
    else:
        monkeypatch.setenv("CDC_SPARK_MIN_ROWS", min_rows)
    threshold = initialized_resources().transforms.min_rows
    assert run_min_rows() == threshold
    for changes in (0, threshold - 1, threshold, threshold + 1):
        if changes < 0:
            continue
        run_engine = initialized_resources().transforms.for_changes(changes).engine
        if run_engine == "arrow":
            assert arrow_only(run_min_rows())(changes).engine == "arrow"
        else:
            with pytest.raises(LeftToRun):
                arrow_only(run_min_rows())(changes)


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
