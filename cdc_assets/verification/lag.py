"""How far behind the source each current-state table is, in seconds (capture's own lag: capture/run.py)."""

import time

from cdc_assets.capture.run import capture_lag
from cdc_assets.core.settings import SourceSettings
from cdc_assets.lake.layout import CURRENT_STAGE
from cdc_assets.lake.raw_batches import BatchManifest, list_batches, read_manifest
from cdc_assets.lake.state import load_registry, tables_behind
from cdc_assets.lake.store import Lakehouse, ObjectStore


def lags_now(settings: SourceSettings, lakehouse: Lakehouse) -> dict[str, float]:
    """Every table's lag now: what the table_lag check judges (in a run, or in a sync's forked child)."""
    now = time.time()
    return table_lags(lakehouse, capture_lag(settings, lakehouse, now).seconds, now)


def table_lags(lakehouse: Lakehouse, capture_lag_seconds: float, now: float) -> dict[str, float]:
    """Per table: the age of its oldest change captured but not yet in its current state, at least the
    capture lag (changes not captured yet may be any table's)."""
    store = lakehouse.store
    registry = load_registry(store)
    behind = tables_behind(store, CURRENT_STAGE, registry)
    manifests: dict[str, BatchManifest] = {}
    lags = {}
    for table in sorted(registry):
        pending = 0.0
        if table in behind:
            first = _first_pending(store, table, behind[table].batch, manifests)
            if first is not None:
                committed = first.raw.get("first_commit_ts") or first.last_commit_ts
                pending = max(now - committed, 0.0) if committed else 0.0
        lags[table] = max(capture_lag_seconds, pending)
    return lags


def _first_pending(
    store: ObjectStore, table: str, after: str | None, cache: dict[str, BatchManifest]
) -> BatchManifest | None:
    """The first raw batch after `after` with a change of `table`."""
    for name in list_batches(store, after):
        manifest = cache.get(name) or read_manifest(store, name)
        cache[name] = manifest
        if table in manifest.tables():
            return manifest
    return None
