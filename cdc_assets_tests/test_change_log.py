"""Change-log tables over time: small files compacted once there are enough of them, frequent checkpoints, and
the `_cdc_seq` watermark read from commit metadata through it all (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from cdc_assets.change_log import (
    CHECKPOINT_INTERVAL,
    MAX_SEQ_KEY,
    SMALL_FILES_BEFORE_COMPACTION,
    compact_small_files,
    max_seq,
    read_query,
    table_configuration,
)


def test_small_files_are_compacted_once_there_are_enough_and_nothing_else_changes(tmp_path: Path) -> None:
    uri = str(tmp_path / "log")
    compacted_at = []
    for i in range(SMALL_FILES_BEFORE_COMPACTION + 5):
        rows = pa.table({"_cdc_seq": pa.array(range(i * 10, i * 10 + 10), pa.int64()), "v": [f"r{i}"] * 10})
        write_deltalake(
            uri,
            rows,
            mode="append",
            configuration=table_configuration(rows.schema) if i == 0 else None,
            commit_properties=CommitProperties(custom_metadata={MAX_SEQ_KEY: str(i * 10 + 9)}),
        )
        if compact_small_files(DeltaTable(uri), target_bytes=1 << 20):
            compacted_at.append(i)
    table = DeltaTable(uri)
    assert compacted_at == [SMALL_FILES_BEFORE_COMPACTION - 1]  # one compaction, when the 32nd small file came
    assert len(table.file_uris()) == 1 + 5  # the compacted file and the five appended since
    assert max_seq(table) == (SMALL_FILES_BEFORE_COMPACTION + 4) * 10 + 9  # read through the compaction commit
    seqs = read_query(table, "SELECT _cdc_seq FROM t ORDER BY _cdc_seq").column(0).to_pylist()
    assert seqs == list(range((SMALL_FILES_BEFORE_COMPACTION + 5) * 10))  # every row once
    assert table.metadata().configuration["delta.checkpointInterval"] == str(CHECKPOINT_INTERVAL)
    assert list((tmp_path / "log" / "_delta_log").glob("*.checkpoint.parquet"))
