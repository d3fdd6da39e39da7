"""Change-log tables over time: small files compacted once there are enough of them, frequent checkpoints, and
the `_cdc_seq` watermark read from commit metadata through it all (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import (
    CHECKPOINT_INTERVAL,
    MAX_SEQ_KEY,
    SMALL_FILES_BEFORE_COMPACTION,
    compact_small_files,
    file_actions,
    max_of,
    max_seq,
    open_table,
    read_query,
    row_count,
    table_configuration,
)
from cdc_assets.lake.files import add_actions, commit_files, read_rows_after, remove_actions, write_files
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.log import append_changes
from cdc_assets.stages.current.apply import pending_at_most


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


def _changes(first: int, count: int) -> pa.Table:
    """Change-log rows of a one-column table, `_cdc_seq` first .. first + count - 1."""
    from cdc_assets.core.mysql_types import ColumnSpec
    from cdc_assets.core.shapes import TableShape
    from cdc_assets.stages.changes.rows import build_change_table

    version = TableShape(TableRef("s", "t"), (ColumnSpec("id", "int"),), ("id",))
    seqs = list(range(first, first + count))
    rows = pa.table(
        {
            "op": ["insert"] * count,
            "seq": pa.array(seqs, pa.int64()),
            "commit_ts": pa.array([1_700_000_000_000_000] * count, pa.int64()),
            "gtid": pa.array([None] * count, pa.string()),
            "batch": ["b"] * count,
            "before": pa.array([None] * count, pa.list_(pa.string())),
            "after": pa.array([[str(s)] for s in seqs], pa.list_(pa.string())),
            "key": [f'["{s}"]' for s in seqs],
            "before_key": pa.array([None] * count, pa.string()),
        }
    )
    return build_change_table(version, rows)


def test_a_writer_whose_lock_expired_cannot_append_what_the_takeover_appended(tmp_path: Path) -> None:
    """The lock of a slow run expires between its watermark read and its commit; the run that takes over
    appends the same changes. The slow run's commit is refused (its app transaction is fenced), with one
    sentence, and every `_cdc_seq` is in the log once."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    table = TableRef("s", "t")
    append_changes(lakehouse, table, _changes(1, 5))

    def takeover() -> None:
        assert append_changes(lakehouse, table, _changes(6, 5)).appended == 5

    with failpoints.arm("changes.before_commit", takeover), pytest.raises(CdcUserError, match="Another run committed"):
        append_changes(lakehouse, table, _changes(6, 5))
    log = open_table(lakehouse.table_uri(CHANGES, table), None)
    seqs = read_query(log, "SELECT _cdc_seq FROM t ORDER BY _cdc_seq").column(0).to_pylist()
    assert seqs == list(range(1, 11))
    assert append_changes(lakehouse, table, _changes(6, 5)).appended == 0  # run again: nothing twice


def test_the_watermark_survives_any_number_of_commits_that_are_not_the_pipelines(tmp_path: Path) -> None:
    """OPTIMIZE, property changes and checkpoints by a user, many more than one history page, leave the
    recorded seq in place (a Delta app transaction)."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    table = TableRef("s", "t")
    append_changes(lakehouse, table, _changes(1, 5))
    log = open_table(lakehouse.table_uri(CHANGES, table), None)
    for i in range(30):
        log.alter.set_table_properties({"delta.checkpointInterval": str(10 + i % 2)})
    log.optimize.compact()
    log.create_checkpoint()
    log.cleanup_metadata()
    assert max_seq(open_table(lakehouse.table_uri(CHANGES, table), None)) == 5


def test_a_copy_on_write_whose_files_an_optimize_replaced_is_refused_with_one_sentence(tmp_path: Path) -> None:
    """A Spark merge read the table at one version and rewrote two of its files; a user's OPTIMIZE compacted
    them meanwhile. Committing the rewrite's removes and adds (as stages/current/on_spark.py does) is refused by
    Delta's conflict check, with one sentence, and the table keeps the OPTIMIZE's files and the same rows."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    table = TableRef("s", "t")
    for first in (1, 6):
        append_changes(lakehouse, table, _changes(first, 5))
    uri = lakehouse.table_uri(CHANGES, table)
    read_by_merge = open_table(uri, None)
    rewritten = write_files(lakehouse.file_access(), lakehouse.table_key(CHANGES, table), str(table), [_changes(1, 10)])
    open_table(uri, None).optimize.compact()
    paths = pa.table(read_by_merge.get_add_actions(flatten=True)).column("path").to_pylist()
    schema = pa.schema(read_by_merge.schema().to_arrow())
    with pytest.raises(CdcUserError, match="changed files of s.t while this run was rewriting them"):
        commit_files(
            read_by_merge, uri, None, "s.t", schema, add_actions(rewritten), remove_actions(read_by_merge, paths),
            MAX_SEQ_KEY, 10, {},
        )  # fmt: skip
    after = open_table(uri, None)
    assert len(after.file_uris()) == 1  # the OPTIMIZE's file, nothing of the refused commit
    assert read_query(after, "SELECT _cdc_seq FROM t ORDER BY _cdc_seq").column(0).to_pylist() == list(range(1, 11))


def test_file_statistics_read_as_structs_say_what_the_flattened_ones_say(tmp_path: Path) -> None:
    """`file_actions` keeps each statistic one struct column (cheaper than a column per table column): the paths,
    the files' highest `_cdc_seq`, the row count and the changes past a seq are those the flattened actions give."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    table = TableRef("s", "t")
    for first in (1, 6, 11):  # three appends: three files, seqs 1-5, 6-10, 11-15
        append_changes(lakehouse, table, _changes(first, 5))
    log = open_table(lakehouse.table_uri(CHANGES, table), None)
    flat, actions = pa.table(log.get_add_actions(flatten=True)), file_actions(log)
    assert actions.column("path").to_pylist() == flat.column("path").to_pylist() and actions.num_rows == 3
    assert max_of(actions, "_cdc_seq").to_pylist() == flat.column("max._cdc_seq").to_pylist()
    assert sorted(max_of(actions, "_cdc_seq").to_pylist()) == [5, 10, 15]
    assert max_of(actions, "no_such_column") is None
    assert row_count(log) == 15
    assert (pending_at_most(log, None), pending_at_most(log, 7), pending_at_most(log, 10), pending_at_most(log, 15)) == (15, 10, 5, 0)


def test_rows_after_a_seq_read_by_pyarrow_are_those_the_query_engine_gives(tmp_path: Path) -> None:
    """`read_rows_after` reads only the files whose highest `_cdc_seq` is past the seq, through pyarrow: the same
    rows and types as `SELECT … WHERE _cdc_seq > seq` through delta-rs, a column added since NULL in older files."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    table = TableRef("s", "t")
    for first in (1, 6, 11):  # three files: seqs 1-5, 6-10, 11-15
        append_changes(lakehouse, table, _changes(first, 5))
    uri = lakehouse.table_uri(CHANGES, table)
    newer = read_query(open_table(uri, None), "SELECT * FROM t WHERE _cdc_seq > 13")
    newer = newer.append_column("note", pa.array(["added"] * newer.num_rows))  # a column the older files lack
    newer = newer.set_column(newer.column_names.index("_cdc_seq"), "_cdc_seq", pa.array([16, 17], pa.int64()))
    write_deltalake(uri, newer, mode="append", schema_mode="merge")
    log = open_table(uri, None)
    access, key = lakehouse.file_access(), lakehouse.table_key(CHANGES, table)
    for seq in (None, 0, 3, 10, 15, 17):
        for columns in (None, ["_cdc_seq", "_cdc_op", "note"], ["note", "id"]):
            picked = "*" if columns is None else ", ".join(f'"{c}"' for c in columns)
            where = "" if seq is None else f" WHERE _cdc_seq > {seq}"
            expected = read_query(log, f"SELECT {picked} FROM t{where}")
            found = read_rows_after(access, key, log, seq, columns)
            assert found.schema == expected.schema, (seq, columns)
            order = [(c, "ascending") for c in found.column_names if c in ("_cdc_seq", "id", "note")]
            assert found.sort_by(order).equals(expected.sort_by(order)), (seq, columns)
    assert read_rows_after(access, key, log, 15, ["note"]).column("note").to_pylist() == ["added", "added"]
    assert read_rows_after(access, key, log, 17).num_rows == 0
