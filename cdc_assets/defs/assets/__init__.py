"""The pipeline as software-defined assets: the raw batches (capture), then each table's source, change log and
current state (`lakehouse_tables`), each source's built from its keys."""

from cdc_assets.defs.assets.raw import build_raw_asset

__all__ = ["build_raw_asset"]
