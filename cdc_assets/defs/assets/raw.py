"""Capture: the raw binlog batch asset, the pipeline driver's capture step (cdc_assets/pipeline/driver.py) recorded."""

import time
from collections.abc import Collection
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetMaterialization,
    AssetObservation,
    AssetsDefinition,
    MaterializeResult,
    asset,
)

from cdc_assets.capture.run import CaptureReport
from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.assets.lakehouse_tables import registry_of_run
from cdc_assets.defs.assets.metadata import capture_metadata
from cdc_assets.defs.assets.tables import confirmations
from cdc_assets.defs.automation import BINLOG_POSITION
from cdc_assets.defs.keys import SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.store import Lakehouse
from cdc_assets.pipeline.driver import CAPTURE, Captured, drive
from cdc_assets.runtime.event_log import log_batch


def build_raw_asset(keys: SourceKeys, captured: Collection[str] = ()) -> AssetsDefinition:
    """The source's raw binlog batches, `[<source>/]raw_binlog_batches`. `captured`: the tables the lakehouse's
    registry held when the definitions were built; a run that finds the registry gone (the lakehouse moved or
    removed since) fails with one sentence instead of beginning a new lakehouse from the oldest binlog."""
    held = set(captured)

    @asset(
        key=keys.raw_asset,
        deps=[keys.asset_key(BINLOG_POSITION)],  # recorded by the binlog position sensor: the automation's trigger
        group_name=keys.group_of("capture"),
        kinds={"mysql", "parquet"},
        required_resource_keys=keys.resource_keys("binlog", "lakehouse", "cadence"),
        description=(
            "Immutable raw binlog batches under `raw/`: everything committed from the checkpoint to the binlog end "
            "as of the run's start, cut at transaction boundaries. Advances the checkpoint in `_state/`, and records an "
            "observation of each source table it read changes of. Then confirms the quiet tables up to date: a "
            "materialization of each `current/<schema>/<table>` with no change pending through the new checkpoint and "
            "none for a quarter of the freshness warn window, so its freshness holds."
        ),
    )
    def raw_binlog_batches(context: AssetExecutionContext) -> MaterializeResult:
        used = SourceResources(context, keys)
        binlog, house = used.binlog, used.lakehouse.get()
        registry_of_run(house, held)  # a lakehouse the definitions knew, and not found: one sentence, nothing written
        owner = run_owner(context.run.run_id)  # raw_batches_contiguous is its own check: no blocking rule here
        steps = drive(binlog.settings(), house, owner=owner, steps=(CAPTURE,), log=context.log, blocking=False)
        [report] = [step.capture for step in steps if isinstance(step, Captured)]
        metadata, confirmed = capture_events(
            context.instance, house, report, binlog.max_batch_rows, context.log, used.cadence.confirm_every_seconds,
            keys=keys,
        )  # fmt: skip
        log_batch(context, confirmed)  # one batch of events, however many tables
        return MaterializeResult(metadata=metadata)

    return raw_binlog_batches


def capture_events(
    instance: Any,
    house: Lakehouse,
    report: CaptureReport,
    max_batch_rows: int | None,
    log: Any,
    confirm_every: float,
    keys: SourceKeys,
    busy: Collection[str] = (),
) -> tuple[dict[str, object], list[Any]]:
    """A capture's metadata (the asset's, and a `sync` run's), and the confirmations of the quiet tables (those not
    materialized for `confirm_every` seconds: the cadence resource's), under the keys of the source `keys` names. `busy`:
    tables a sync's forked child is bringing up to date meanwhile (they are the run's, not quiet ones)."""
    log.info(
        f"captured {len(report.batches)} batches, {report.rows} row changes of {len(report.tables)} tables "
        f"up to {report.end} in {report.seconds:.1f}s"
    )
    try:
        confirmed = confirmations(instance, house, str(report.end), confirm_every, time.time(), set(busy), keys=keys)
    except CdcUserError as exc:  # a corrupt progress file: the apply runs say so; the capture itself succeeded
        log.warning(f"no table confirmed up to date: {exc}")
        confirmed = []
    count = sum(isinstance(e, AssetMaterialization) for e in confirmed)
    return {**capture_metadata(report, max_batch_rows), "tables_confirmed_up_to_date": count}, [
        *source_observations(report, keys),
        *confirmed,
    ]


def source_observations(report: CaptureReport, keys: SourceKeys) -> list[AssetObservation]:
    """An observation of each source table the capture read changes of, `mysql/<schema>/<table>`: the binlog
    position read up to and the last batch holding its changes (its data version: a new one only when it changed)."""
    last: dict[str, str] = {}
    for batch in report.batches:
        for table in batch.tables():
            last[table] = batch.name
    end = str(report.end)
    return [
        AssetObservation(
            keys.source_asset_key(table),
            metadata={"binlog_position": end, "last_batch": name},
            tags={"dagster/data_version": name},
        )
        for table, name in sorted(last.items())
    ]
