"""Issue 30, items 4 and 1: the figures a run records per table read as tables and plain values in the UI, never as JSON
blobs (`[Show JSON]`): the tables' materializations, the run's own assets and every check evaluation of a sync; and
a selection of tables materialized as one run of exactly those tables."""

from __future__ import annotations

from dagster import AssetRecordsFilter, DagsterEventType, JsonMetadataValue, TableMetadataValue

from cdc_assets.capture.run import capture
from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.assets.metadata import figures_table
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import APPLY_JOB, RAW_ASSET, changes_asset_key, table_asset_key
from cdc_assets.defs.resources import BinlogResource
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv


def test_figures_of_many_tables_are_one_table_value() -> None:
    value = figures_table({"shop.b": {"lag_seconds": 2.5}, "shop.a": {"lag_seconds": 1.0, "rows": 3}})
    assert isinstance(value, TableMetadataValue)
    assert [c.name for c in value.schema.columns] == ["table", "lag_seconds", "rows"]
    assert [r.data["table"] for r in value.records] == ["shop.a", "shop.b"]


def test_a_syncs_figures_are_never_json(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE u (id INT PRIMARY KEY)",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
        "INSERT INTO u VALUES (1)",
    )
    assert cdc.sync() == 0
    dagster = instance()
    keys = [RAW_ASSET, table_asset_key(f"{cdc.database}.t"), table_asset_key(f"{cdc.database}.u")]
    seen = 0
    for key in keys:
        [record] = dagster.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=1).records
        metadata = record.asset_materialization.metadata
        assert metadata, key
        blobs = [name for name, value in metadata.items() if isinstance(value, JsonMetadataValue)]
        assert not blobs, (key, blobs)
        seen += len(metadata)
    run = dagster.get_runs(limit=1)[0]
    checks = [
        e.dagster_event.event_specific_data
        for e in dagster.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    ]
    assert checks
    blobs = [(c.check_name, n) for c in checks for n, v in c.metadata.items() if isinstance(v, JsonMetadataValue)]
    assert not blobs, blobs
    assert seen > 3


def test_three_tables_selected_are_applied_in_one_run_and_no_other(cdc: CdcEnv) -> None:
    """Issue 30, item 1: selecting three tables' assets (as the UI's Materialize on a selection does) is one run of
    the apply job that takes in exactly those three; the other tables' changes wait for their own run."""
    names = ["a", "b", "c", "d", "e"]
    cdc.execute(*(f"CREATE TABLE {n} (id INT PRIMARY KEY)" for n in names), *(f"INSERT INTO {n} VALUES (1)" for n in names))
    assert cdc.sync() == 0
    cdc.execute(*(f"INSERT INTO {n} VALUES (2)" for n in names))
    capture(BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{cdc.database}.*").settings(), cdc.lakehouse)
    chosen = [f"{cdc.database}.{n}" for n in ("a", "c", "e")]
    job = build_definitions().resolve_job_def(APPLY_JOB)
    selection = [k for t in chosen for k in (changes_asset_key(t), table_asset_key(t))]
    before = len(instance().get_runs())
    result = job.execute_in_process(instance=instance(), asset_selection=selection, raise_on_error=False)
    assert result.success
    assert len(instance().get_runs()) == before + 1
    rows = {n: sorted(read_current(cdc.lakehouse, TableRef(cdc.database, n), ["id"]).column("id").to_pylist()) for n in names}
    assert rows == {"a": [1, 2], "b": [1], "c": [1, 2], "d": [1], "e": [1, 2]}, rows
