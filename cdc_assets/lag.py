"""How far behind the source each current-state table is, in seconds."""

import time

from cdc_assets import source
from cdc_assets.lakehouse import Lakehouse, ObjectStore
from cdc_assets.raw_batch import BatchManifest, list_batches, read_manifest
from cdc_assets.resources import BinlogResource
from cdc_assets.stages import CURRENT_STAGE
from cdc_assets.state import load_checkpoint, load_progress, load_registry, needs_work


def capture_lag_seconds(binlog: BinlogResource, lakehouse: Lakehouse, now: float) -> float:
    """While the binlog holds changes past the checkpoint, how old the newest captured commit is; else 0."""
    checkpoint = load_checkpoint(lakehouse.store)
    conn = source.connect(binlog.url())
    try:
        position = checkpoint.position if checkpoint else source.oldest_position(conn)
        lag_bytes = source.lag_bytes(conn, position)
    finally:
        conn.close()
    if checkpoint is None:
        return 0.0 if not lag_bytes else float("inf")
    return checkpoint.lag_seconds(lag_bytes, now)


def table_lags(binlog: BinlogResource, lakehouse: Lakehouse, now: float | None = None) -> dict[str, float]:
    """Per table: the age of its oldest change captured but not yet in its current state, at least the
    capture lag (changes not captured yet may be any table's)."""
    now = time.time() if now is None else now
    store = lakehouse.store
    capture_lag = capture_lag_seconds(binlog, lakehouse, now)
    manifests: dict[str, BatchManifest] = {}
    lags = {}
    for table, entry in sorted(load_registry(store).items()):
        progress = load_progress(store, CURRENT_STAGE, table)
        pending = 0.0
        if needs_work(entry, progress):
            first = _first_pending(store, table, progress.batch, manifests)
            if first is not None:
                committed = first.raw.get("first_commit_ts") or first.last_commit_ts
                pending = max(now - committed, 0.0) if committed else 0.0
        lags[table] = max(capture_lag, pending)
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
