"""One asset per table: `current/<schema>/<table>` with its columns and row count, recorded by the few apply runs
of a sync, appearing at a definitions rebuild, saying so when dropped; and a downstream asset on one table."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
from dagster import AssetKey, DefaultSensorStatus, TableSchema, materialize
from deltalake import write_deltalake

from cdc_assets.commands.runs import instance, run_job
from cdc_assets.core.names import TableRef
from cdc_assets.defs.assets.tables import column_schema
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.examples import EXAMPLES_SENSOR, ORDERS_TABLE, build_orders_summary, example_assets
from cdc_assets.defs.keys import APPLY_JOB, CAPTURE_JOB, SYNC_JOB, changes_asset_key, table_asset_key
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.state import save_registry
from cdc_assets.lake.store import Lakehouse
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now

ORDERS_DDL = """CREATE TABLE orders (
    id          BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    customer_id INT UNSIGNED NOT NULL,
    placed_on   DATE NOT NULL,
    status      ENUM('new','paid','shipped','cancelled') NOT NULL,
    note        VARCHAR(255) NULL,
    total       DECIMAL(14,2) NOT NULL DEFAULT 0
)"""
# the Delta types of those columns (docs/lakehouse.md: Types (MySQL → Delta))
ORDERS_TYPES = ["decimal(20,0)", "long", "date", "string", "string", "decimal(14,2)"]
SMALL_TABLES = [f"t{i}" for i in range(5)]


def test_asset_keys_are_the_delta_paths_segments() -> None:
    assert table_asset_key("shop.orders") == AssetKey(["current", "shop", "orders"])
    odd = table_asset_key(str(TableRef("we/ird", "a b.c")))
    assert odd.path == ["current", "we~2Fird", "a~20b.c"]  # one segment per name, as its Delta directory
    assert example_assets(set()) == [] and len(example_assets({ORDERS_TABLE})) == 1


def test_the_code_location_lists_the_registrys_tables_and_the_example_of_a_captured_orders_table(
    tmp_path, monkeypatch
) -> None:
    house = Lakehouse(str(tmp_path / "lake"))
    save_registry(house.store, {"shop.orders": {"first_batch": "b1", "last_batch": "b1"}, "shop.`a b`": {}})
    monkeypatch.setenv("CDC_LAKEHOUSE", str(tmp_path / "lake"))
    defs = build_definitions()
    keys = set(defs.resolve_asset_graph().get_all_asset_keys())
    assert {AssetKey(["current", "shop", "orders"]), AssetKey(["current", "shop", "a~20b"])} <= keys
    assert AssetKey(["examples", "orders_by_status"]) in keys
    [sensor] = [s for s in defs.sensors if s.name == EXAMPLES_SENSOR]
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    # a registry that cannot be read leaves the per-table assets out; the pipeline's own assets still load
    house.store.put("_state/tables.json", b"[not json")
    keys = set(build_definitions().resolve_asset_graph().get_all_asset_keys())
    assert AssetKey("raw_binlog_batches") in keys and not any(
        k.path[0] in ("mysql", "changes", "current", "examples") and len(k.path) > 1 for k in keys
    )


def test_column_schema_comes_from_the_delta_schema(tmp_path) -> None:
    rows = pa.table({"id": pa.array([1], pa.int64()), "_cdc_seq": pa.array([7], pa.int64()), "note": ["x"]})
    write_deltalake(str(tmp_path / "t"), rows)
    from deltalake import DeltaTable

    schema = column_schema(DeltaTable(str(tmp_path / "t")).schema())
    assert isinstance(schema, TableSchema)
    assert [(c.name, c.type) for c in schema.columns] == [("id", "long"), ("_cdc_seq", "long"), ("note", "string")]
    assert schema.columns[1].description == "pipeline metadata"


def _source_columns(cdc: CdcEnv, table: str) -> list[str]:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
            "ORDER BY ordinal_position",
            (cdc.database, table),
        )
        return [r[0] for r in cur.fetchall()]


def _count(cdc: CdcEnv, table: str) -> int:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM `{table}`")
        return cur.fetchone()[0]


def _sync_runs(known: set[str]) -> list[str]:
    return [r.run_id for r in instance().get_runs() if r.job_name == SYNC_JOB and r.run_id not in known]


def _value(metadata: object) -> object:
    return getattr(metadata, "value", metadata)


def _latest(table: str):
    return instance().get_latest_materialization_event(table_asset_key(table))


def test_every_table_gets_its_asset_from_a_few_runs_and_a_downstream_asset_follows(cdc: CdcEnv) -> None:
    db = cdc.database
    cdc.execute(
        ORDERS_DDL,
        "INSERT INTO orders VALUES (1, 10, '2026-01-02', 'new', NULL, 12.50), (2, 11, '2026-01-03', 'paid', 'x', 7.25),"
        " (3, 10, '2026-01-04', 'paid', NULL, 1.00), (18446744073709551615, 12, '2026-01-05', 'shipped', 'max', 0)",
        *(f"CREATE TABLE {t} (id INT PRIMARY KEY, name VARCHAR(20))" for t in SMALL_TABLES),
        *(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')" for t in SMALL_TABLES),
    )
    tables = [f"{db}.{t}" for t in ["orders", *SMALL_TABLES]]
    before = set(_sync_runs(set()))
    assert cdc.sync() == 0

    # one sync: one run materializes every table's own asset (not one run per table)
    runs = _sync_runs(before)
    assert len(runs) == 1
    for table in tables:
        event = _latest(table)
        assert event is not None and event.run_id == runs[0], table
    graph = build_definitions().resolve_asset_graph()
    for table in tables:
        node = graph.get(table_asset_key(table))
        assert node.group_name == "current" and changes_asset_key(table) in node.parent_keys
        assert (
            _value(node.metadata["dagster/table_name"]) == f"current.{table}"
            and _value(node.metadata["dropped"]) is False
        )

    # the standard table metadata matches the source table
    metadata = _latest(f"{db}.orders").asset_materialization.metadata
    columns = metadata["dagster/column_schema"].value.columns
    source = _source_columns(cdc, "orders")
    assert [c.name for c in columns[: len(source)]] == source
    assert [c.type for c in columns[: len(source)]] == ORDERS_TYPES
    assert {"_cdc_seq", "_cdc_commit_ts"} <= {c.name for c in columns[len(source) :]}
    assert all(c.name.startswith("_cdc_") for c in columns[len(source) :])
    assert metadata["dagster/row_count"].value == _count(cdc, "orders") == 4
    assert metadata["dagster/table_name"].value == f"current.{db}.orders"
    location = cdc.lakehouse.table_uri("current", TableRef(db, "orders"))
    assert metadata["delta_location"].value == location
    for t in SMALL_TABLES:
        assert _latest(f"{db}.{t}").asset_materialization.metadata["dagster/row_count"].value == 2

    # the downstream example over this one table, materialized after its table changed, reads the new state
    summary_asset = build_orders_summary(f"{db}.orders")
    assert summary_asset.asset_deps[summary_asset.key] == {table_asset_key(f"{db}.orders")}
    resources = {"lakehouse": initialized_resources().lakehouse}
    assert materialize([summary_asset], instance=instance(), resources=resources).success
    cdc.execute(
        "UPDATE orders SET status = 'shipped', total = total + 1 WHERE id = 2",
        "INSERT INTO orders VALUES (5, 13, '2026-01-06', 'cancelled', NULL, 99.99)",
        "DELETE FROM orders WHERE id = 3",
        "CREATE TABLE late_table (k VARCHAR(8) PRIMARY KEY, v DOUBLE)",
        "INSERT INTO late_table VALUES ('a', 1.5)",
        "DROP TABLE t0",
    )
    old_keys = set(build_definitions().resolve_asset_graph().get_all_asset_keys())
    assert table_asset_key(f"{db}.late_table") not in old_keys
    before = set(_sync_runs(set()))
    assert cdc.sync() == 0
    touched = [f"{db}.orders", f"{db}.late_table", f"{db}.t0"]
    runs = _sync_runs(before)
    assert len(runs) == 1
    assert all(_latest(t).run_id in runs for t in touched)
    table_event = _latest(f"{db}.orders")
    result = materialize([summary_asset], instance=instance(), resources=resources)
    assert result.success
    summary = result.output_for_node(summary_asset.op.name)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT CAST(status AS CHAR), COUNT(*), SUM(total) FROM orders GROUP BY 1")
        expected = {status: (n, Decimal(total)) for status, n, total in cur.fetchall()}
    assert expected == {
        "new": (1, Decimal("12.50")),
        "shipped": (2, Decimal("8.25")),
        "cancelled": (1, Decimal("99.99")),
    }
    assert {r.status: (r.orders, Decimal(r.total)) for r in summary.itertuples()} == expected
    downstream = instance().get_latest_materialization_event(summary_asset.key)
    assert downstream.timestamp > table_event.timestamp

    # a definitions rebuild shows the new table, and the dropped one says so
    graph = build_definitions().resolve_asset_graph()
    new = graph.get(table_asset_key(f"{db}.late_table"))
    assert new.group_name == "current"
    dropped = graph.get(table_asset_key(f"{db}.t0"))
    assert _value(dropped.metadata["dropped"]) is True and dropped.description.startswith("DROPPED")
    gone = _latest(f"{db}.t0").asset_materialization
    assert gone.metadata["dropped"].value is True and gone.metadata["dagster/row_count"].value == 0
    late = _latest(f"{db}.late_table").asset_materialization.metadata
    assert [(c.name, c.type) for c in late["dagster/column_schema"].value.columns[:2]] == [
        ("k", "string"),
        ("v", "double"),
    ]
    assert late["dagster/row_count"].value == 1

    # a data engineer refreshes three tables from the UI: one run (the Materialize button's) applies exactly those
    cdc.execute(*(f"INSERT INTO {t} VALUES (3, 'c'), (4, 'd')" for t in SMALL_TABLES[1:]), "UPDATE orders SET note = 'ui'")
    assert run_job(settings_now(), CAPTURE_JOB).success  # captured, not applied
    chosen = [f"{db}.t1", f"{db}.t2", f"{db}.orders"]
    others = [f"{db}.t3", f"{db}.t4"]
    untouched = {t: (_latest(t).run_id, cdc.lakehouse.open("current", TableRef.parse(t)).version()) for t in others}
    defs = build_definitions()
    keys = [k for t in chosen for k in (table_asset_key(t),)]
    result = defs.resolve_job_def(APPLY_JOB).execute_in_process(instance=instance(), asset_selection=keys)
    assert result.success
    assert {e.asset_key for e in result.get_asset_materialization_events()} >= set(keys)
    assert {_latest(t).run_id for t in chosen} == {result.run_id}  # one run for the three
    diffs = {str(d.table): d for d in cdc.verify()}
    assert all(diffs[t].ok and diffs[t].in_flight_keys == 0 for t in chosen)  # equal to the source
    for t in others:  # the others untouched: no materialization, no new Delta version, their changes still pending
        assert (_latest(t).run_id, cdc.lakehouse.open("current", TableRef.parse(t)).version()) == untouched[t]
        assert diffs[t].in_flight_keys == 2 or not diffs[t].ok
