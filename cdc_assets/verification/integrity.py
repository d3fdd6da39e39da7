"""The lakehouse against itself: raw batches follow each other without gap or overlap, and no change log
holds a `_cdc_seq` twice."""

from __future__ import annotations

import pyarrow.compute as pc

from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.lake.files import read_rows_after
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.raw_batches import chain_breaks, list_batches, read_manifest
from cdc_assets.lake.state import known_tables, load_checkpoint
from cdc_assets.lake.store import Lakehouse


def chain_checked_from(lakehouse: Lakehouse, since: str | None) -> tuple[str | None, list[str]]:
    """raw_batches_contiguous's starting batch and its breaks: from `since` (a run's first batch), or, for a run
    that added none, from the last batch against the checkpoint, not the whole chain again (that read every
    manifest the lakehouse ever made, at every capture and every no-op sync). None: the lakehouse has no batch."""
    if since is None:
        names = list_batches(lakehouse.store)
        since = names[-1] if names else None
    return since, batch_chain_breaks(lakehouse, since)


def batch_chain_breaks(lakehouse: Lakehouse, since: str | None = None) -> list[str]:
    """Places where a raw batch does not start exactly where the one before it ended.

    With `since`, only from the batch before it on (what a capture run added); the checkpoint must
    sit at the end of the last batch.
    """
    store = lakehouse.store
    names = list_batches(store)
    if since in names:
        names = names[max(names.index(since) - 1, 0) :]
    manifests = [read_manifest(store, name) for name in names]
    breaks = chain_breaks(manifests)
    last = manifests[-1] if manifests else None
    checkpoint = load_checkpoint(store)
    if last is not None and checkpoint is not None and checkpoint.last_batch == last.name:
        if checkpoint.position != last.end:
            breaks.append(f"the checkpoint {checkpoint.position} is not the end {last.end} of {last.name}")
    return breaks


def duplicate_seqs(lakehouse: Lakehouse, tables: list[str] | None = None) -> dict[str, int]:
    """Change logs in which some `_cdc_seq` appears more than once, with how many extra rows."""

    def extra_rows(name: str) -> int:
        table = TableRef.parse(name)
        log = lakehouse.open(CHANGES, table)
        if log is None:
            return 0
        seqs = read_rows_after(lakehouse.file_access(), lakehouse.table_key(CHANGES, table), log, None, ["_cdc_seq"])
        return seqs.num_rows - pc.count_distinct(seqs.column("_cdc_seq")).as_py()  # a NULL seq is an extra row too

    names = tables if tables is not None else known_tables(lakehouse.store)
    return {name: n for name, n in zip(names, for_each_table(names, extra_rows), strict=True) if n}
