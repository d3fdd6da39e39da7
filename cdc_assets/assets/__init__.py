"""The three layers as software-defined assets: raw batches -> per-table changes -> current state."""

from cdc_assets.assets.changes import table_changes
from cdc_assets.assets.current import current_tables
from cdc_assets.assets.raw import raw_binlog_batches

__all__ = ["current_tables", "raw_binlog_batches", "table_changes"]
