"""How far behind the source each current-state table is, in seconds."""

from dataclasses import dataclass

from cdc_assets import source
from cdc_assets.lakehouse import Lakehouse, ObjectStore
from cdc_assets.positions import BinlogPosition
from cdc_assets.raw_batch import BatchManifest, list_batches, read_manifest
from cdc_assets.resources import BinlogResource
from cdc_assets.stages import CURRENT_STAGE
from cdc_assets.state import Checkpoint, load_checkpoint, load_registry, tables_behind


@dataclass(frozen=True)
class CaptureLag:
    """How far capture is behind the source's binlog."""

    checkpoint: Checkpoint | None
    binlog_end: BinlogPosition
    lag_bytes: int
    seconds: float  # see Checkpoint.lag_seconds; unbounded while nothing was ever captured of a non-empty binlog


def capture_lag(binlog: BinlogResource, lakehouse: Lakehouse, now: float) -> CaptureLag:
    checkpoint = load_checkpoint(lakehouse.store)
    conn = source.connect(binlog.url())
    try:
        end = source.binlog_end(conn)
        position = checkpoint.position if checkpoint else source.oldest_position(conn)
        lag_bytes = source.lag_bytes(conn, position)
    finally:
        conn.close()
    if checkpoint is None:
        seconds = 0.0 if not lag_bytes else float("inf")
    else:
        seconds = checkpoint.lag_seconds(lag_bytes, now)
    return CaptureLag(checkpoint, end, lag_bytes, seconds)


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
