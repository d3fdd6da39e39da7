"""A lakehouse that keeps its Delta tables open (Lakehouse.keeping_tables_open: a run's steps, its checks and the
continuous mode's cycles) reads every table at its newest version, as a fresh open would: after a commit through the
object it holds, after another writer's commit, and after the table was removed or made again. On a local lakehouse
a table with no newer log entry is taken as it is (no listing of its log); that shortcut must never hide a commit."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import S3Retries
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.store import Lakehouse, S3Access, s3_client

BUCKET = "kept-tables-test"
TABLE = TableRef("shop", "orders")


@pytest.fixture(params=["local", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lakehouse:
    if request.param == "local":
        return Lakehouse(str(tmp_path / "lake"))
    endpoint = request.getfixturevalue("s3_endpoint")
    settings = {"endpoint_url": endpoint, "region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}
    client = s3_client(S3Retries(), **settings)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    return Lakehouse(f"s3://{BUCKET}/{uuid.uuid4().hex}", S3Access.of(client, **settings))


def _rows(ids: list[int], value: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([value] * len(ids), pa.string())})


def _write(lake: Lakehouse, rows: pa.Table, mode: str = "append") -> None:
    """Another writer's commit: through the table's URI, not the object the kept lakehouse holds."""
    write_deltalake(lake.table_uri(CURRENT, TABLE), rows, mode=mode, storage_options=lake.storage_options())


def _content(table: DeltaTable | None) -> list[tuple[int, str]]:
    assert table is not None
    return sorted((r["id"], r["v"]) for r in table.to_pyarrow_table().to_pylist())


def test_a_kept_table_is_always_at_its_newest_version(lake: Lakehouse) -> None:
    kept = lake.with_tables_kept_open()
    assert kept.open(CURRENT, TABLE) is None  # no table yet
    _write(lake, _rows([1, 2], "a"))
    first = kept.open(CURRENT, TABLE)
    assert first is not None and first.version() == 0

    again = kept.open(CURRENT, TABLE)  # nothing committed since: the very object, as it was
    assert again is first and again.version() == 0 and _content(again) == [(1, "a"), (2, "a")]

    _write(lake, _rows([3], "b"))  # another writer's commit
    followed = kept.open(CURRENT, TABLE)
    assert followed is first and followed.version() == 1 and _content(followed) == [(1, "a"), (2, "a"), (3, "b")]

    followed.delete("id = 1")  # a commit through the object kept: it moves the object itself
    assert kept.open(CURRENT, TABLE).version() == 2
    _write(lake, _rows([4], "c"))
    _write(lake, _rows([5], "d"))  # two commits since the last open: both are read
    newest = kept.open(CURRENT, TABLE)
    assert newest.version() == 4 and _content(newest) == [(2, "a"), (3, "b"), (4, "c"), (5, "d")]
    assert _content(DeltaTable(lake.table_uri(CURRENT, TABLE), storage_options=lake.storage_options())) == _content(newest)


def test_a_table_removed_or_made_again_behind_a_kept_one_is_opened_afresh(lake: Lakehouse) -> None:
    kept = lake.with_tables_kept_open()
    _write(lake, _rows([1, 2, 3], "old"))
    _write(lake, _rows([4], "old"))
    held = kept.open(CURRENT, TABLE)
    assert held is not None and held.version() == 1

    lake.delete_table(CURRENT, TABLE)  # by another process's lakehouse: the kept one is not told
    _write(lake, _rows([7], "new"), mode="overwrite")  # made again: its version 0, a table of its own
    _write(lake, _rows([8], "new"))  # at version 1, as the table held was: versions alone cannot tell them apart
    remade = kept.open(CURRENT, TABLE)
    assert remade is not None and remade is not held
    assert remade.version() == 1 and _content(remade) == [(7, "new"), (8, "new")]

    lake.delete_table(CURRENT, TABLE)
    assert kept.open(CURRENT, TABLE) is None


def test_a_table_whose_first_log_entry_was_cleaned_up_is_never_kept(tmp_path: Path) -> None:
    """Delta's log clean-up removes entries older than a checkpoint, the first one too: the identity a kept table is
    told by is gone, so such a table is opened afresh each time, and a removal is never hidden."""
    lake = Lakehouse(str(tmp_path / "lake"))
    for n in range(3):
        _write(lake, _rows([n], "v"))
    uri = lake.table_uri(CURRENT, TABLE)
    DeltaTable(uri).create_checkpoint()
    (Path(uri) / "_delta_log" / f"{0:020d}.json").unlink()  # as the clean-up does, past its retention
    kept = lake.with_tables_kept_open()
    first = kept.open(CURRENT, TABLE)
    assert first is not None and first.version() == 2 and _content(first) == [(0, "v"), (1, "v"), (2, "v")]
    again = kept.open(CURRENT, TABLE)
    assert again is not first and again.version() == 2
    lake.delete_table(CURRENT, TABLE)
    assert kept.open(CURRENT, TABLE) is None
