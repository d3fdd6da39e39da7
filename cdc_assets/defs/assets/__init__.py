"""The three layers as software-defined assets: raw batches -> per-table changes -> current state."""

import warnings

from dagster import BetaWarning

# Single-run backfills over many tables are what we want from the UI; Dagster flags the parameter as beta.
warnings.filterwarnings("ignore", category=BetaWarning, message=".*backfill_policy.*")

from cdc_assets.defs.assets.changes import table_changes  # noqa: E402
from cdc_assets.defs.assets.current import current_tables  # noqa: E402
from cdc_assets.defs.assets.raw import raw_binlog_batches  # noqa: E402

__all__ = ["current_tables", "raw_binlog_batches", "table_changes"]
