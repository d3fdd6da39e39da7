"""How a step logs its many asset events and check evaluations at once, on any Dagster instance.

On our embedded SQLite instance (`instance.py`'s dagster.yaml) they go to the event log as one batch
(`event_log.log_batch`, Dagster's internals); on any other instance (a user's own, PostgreSQL storage, or ours with
CDC_EVENT_BATCHES=0) each is `context.log_event`, Dagster's public API, and `event_log` is never imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def log_batch(context: Any, events: Sequence[Any]) -> None:
    """Log `events` (AssetMaterialization, AssetObservation, AssetCheckEvaluation) from a step's `context`."""
    if getattr(context.instance.event_log_storage, "writes_event_batches", False):
        from cdc_assets.runtime import event_log  # loaded already: the instance's event log is its storage

        event_log.log_batch(context, events)
        return
    for event in events:
        context.log_event(event)
