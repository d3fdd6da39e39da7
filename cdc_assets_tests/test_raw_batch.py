"""Raw batch format: deterministic, self-checking, visible only with its manifest."""

from pathlib import Path

import pyarrow as pa
import pytest

from cdc_assets.capture.batch_builder import BatchBuilder
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.raw_batches import DATA_FILE, list_batches, read_manifest, read_rows, write_batch
from cdc_assets.lake.store import LocalStore


def _batch() -> object:
    builder = BatchBuilder(start=BinlogPosition("b.000003", 4))
    version = TableShape(TableRef("s", "t"), (ColumnSpec("id", "int"), ColumnSpec("v", "varchar")), ("id",))
    builder.begin("0-1-1")
    builder.row_changes(version, "insert", [None], [["1", "é 🚀"]])
    builder.commit(BinlogPosition("b.000003", 300), 1_700_000_000)
    return builder.cut()


def test_same_batch_same_bytes_and_name(tmp_path: Path) -> None:
    a, b = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    write_batch(a, _batch())
    write_batch(b, _batch())
    [name] = list_batches(a)
    assert name == "0000000003-000000000004" == list_batches(b)[0]
    for file in (DATA_FILE, "manifest.json"):
        assert a.get(f"raw/{name}/{file}") == b.get(f"raw/{name}/{file}")
    rows = read_rows(a, read_manifest(a, name))
    assert rows.column("after").to_pylist() == [["1", "é 🚀"]]
    assert rows.schema.field("seq").type == pa.int64()


def test_a_batch_without_manifest_is_invisible(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("raw/0000000001-000000000004/changes.parquet", b"half written")
    assert list_batches(store) == []


def test_corrupt_data_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    manifest = write_batch(store, _batch())
    path = tmp_path / "raw" / manifest.name / DATA_FILE
    path.write_bytes(path.read_bytes().replace(b"\x01", b"\x02", 1))
    with pytest.raises(CdcUserError, match="corrupt"):
        read_rows(store, manifest)
