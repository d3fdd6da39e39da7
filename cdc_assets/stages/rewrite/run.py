"""The one skeleton of a run that rewrites a table's earlier layers (`run_rewrite`: a forget, a policy rewrite):
the snapshot, capture, change-log and current-state locks, the table brought up to date first, then every layer
rewritten (`layers.rewrite_table_layers`) under a record in `_state/` that stays `pending` until every layer is done,
so the same command run again after a crash finds it and finishes. The catch-up is the pipeline's driver
(pipeline/driver.bring_up_to_date), which the caller gives: the stages never run the driver, it runs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Protocol, TypeVar

from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.layout import (
    CAPTURE_LOCK,
    CHANGES_LOCK,
    CHANGES_STAGE,
    CURRENT_LOCK,
    SNAPSHOT_LOCK,
)
from cdc_assets.lake.locks import lakehouse_lock
from cdc_assets.lake.state import load_checkpoint, load_progress, load_registry, load_schemas
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.rewrite.layers import LAYERS, LayerCount, TableRewrite, rewrite_table_layers
from cdc_assets.stages.snapshot.records import load_record

PENDING, DONE = "pending", "done"


def table_shape(lakehouse: Lakehouse, table: TableRef) -> TableShape:
    """The table's newest shape the lakehouse knows (capture's at the checkpoint, else the change log's), or one
    sentence when the lakehouse does not know the table or it has no primary key."""
    store = lakehouse.store
    if str(table) not in load_registry(store):
        raise CdcUserError(
            f"The lakehouse has no table {table}: give a captured table as schema.table (`cdc-lakehouse status` lists them)."
        )
    shape = load_schemas(store, load_checkpoint(store)).get(table) or load_progress(store, CHANGES_STAGE, str(table)).shape
    if shape is None:
        raise CdcUserError(f"{table} was dropped at the source: the lakehouse keeps no rows of it to forget.")
    if not shape.primary_key:
        raise CdcUserError(
            f"{table} has no primary key, so no row of it can be named by a key: forget works on tables with one."
        )
    return shape


class RewriteRecord(Protocol):
    """What a rewrite run keeps in `_state/` (a forget's, a policy rewrite's): pending until every layer is done."""

    layers: dict[str, LayerCount]
    status: str
    finished_at: float | None


R = TypeVar("R", bound=RewriteRecord)


def run_rewrite(
    catch_up: Callable[[], None],
    lakehouse: Lakehouse,
    table: TableRef,
    owner: str,
    begin: Callable[[TableShape], tuple[R, TableRewrite]],
    save: Callable[[R], None],
    finish: Callable[[R], None] = lambda _: None,
) -> R:
    """The one skeleton of a run that rewrites a table's earlier layers (forget, `--rewrite-policies`): under the
    snapshot, capture, change-log and current-state locks, the table brought up to date first (`catch_up`: capture,
    then the table's change log and current state, on Arrow), then `begin(shape)`
    finds the run's pending record or saves a new one (before any layer is touched) and gives the rewrite; each
    layer's count is saved as it is done, `finish` runs once every layer is, and only then the record says `done`.
    Run again after a crash anywhere, the same command finds the pending record and finishes it."""
    wait = lakehouse.lock_wait_seconds
    with ExitStack() as held:
        held.enter_context(lakehouse.faults_are_user_errors())
        for name, purpose in (
            (SNAPSHOT_LOCK, "snapshot"),
            (CAPTURE_LOCK, "capture"),
            (CHANGES_LOCK, "change-log update"),
            (CURRENT_LOCK, "current-state update"),
        ):
            held.enter_context(lakehouse_lock(lakehouse, name, purpose, owner, wait))
        if load_record(lakehouse.store, table) is not None:
            raise CdcUserError(
                f"A snapshot of {table} was stopped part-way: finish it with `cdc-lakehouse snapshot {table}`, then "
                "run this command again."
            )
        # the source's changes taken in first: for a forget, its DELETE of the keys (current state then lacks them as
        # the source does, whatever step a crash stops the rewrite at, and no later capture reads the DELETE's
        # before-image again); for a policy rewrite, every row captured before it under the policy's rules
        catch_up()
        shape = table_shape(lakehouse, table)
        record, rewrite = begin(shape)

        def layer_done(layer: str, count: LayerCount) -> None:
            record.layers[layer] = record.layers.get(layer, LayerCount()).add(count)
            save(record)

        rewrite_table_layers(lakehouse, table, rewrite, shape, layer_done)
        failpoints.hit("forget.layers_rewritten")
        finish(record)
        record.status, record.finished_at = DONE, time.time()
        record.layers = {layer: record.layers.get(layer, LayerCount()) for layer in LAYERS}
        save(record)
        return record
