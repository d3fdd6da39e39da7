"""The pipeline as software-defined assets: the raw batches (capture), then each table's source, change log and
current state (`lakehouse_tables`)."""

from cdc_assets.defs.assets.raw import raw_binlog_batches

__all__ = ["raw_binlog_batches"]
