"""Comparing in buckets finds exactly what comparing whole tables finds (no server: plain Arrow tables)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.verification.buckets import compare_in_buckets, key_buckets
from cdc_assets.verification.compare import compare_tables
from cdc_assets.verification.row_hashes import checksum_text, content_checksum

T = TableRef("s", "t")
ROWS = 1_000


def _chunks(rows: pa.Table, size: int = 64) -> Iterator[pa.Table]:
    for start in range(0, rows.num_rows, size):
        yield rows.slice(start, size)


def _source() -> pa.Table:
    ids = list(range(-5, ROWS - 5))  # negative keys too
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": [f"n{i}" if i % 11 else None for i in ids],
            "amount": pa.array([Decimal(i) / 4 for i in ids], pa.decimal128(12, 2)),
            "at": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in ids],
                           pa.timestamp("us", tz="UTC")),  # fmt: skip
        }
    )


def _tampered(source: pa.Table) -> pa.Table:
    """Row 5 missing, row 6 different, row 5000 extra, and the rows shuffled."""
    kept = source.filter(pc.not_equal(source.column("id"), 5))
    names = pc.if_else(pc.equal(kept.column("id"), 6), "tampered", kept.column("name"))
    kept = kept.set_column(1, "name", names)
    extra = source.slice(0, 1).set_column(0, "id", pa.array([5000], pa.int64()))
    rows = pa.concat_tables([kept, extra])
    return rows.take(pa.array(np.random.default_rng(7).permutation(rows.num_rows)))


def _whole_and_buckets(source: pa.Table, lake: pa.Table, key: list[str], buckets: int):  # noqa: ANN202
    whole = compare_tables(T, source, lake, key)
    found = compare_in_buckets(T, source.schema, _chunks(source), _chunks(lake, 97), key, buckets)
    return whole, found


@pytest.mark.parametrize("buckets", [1, 3, 16])
def test_buckets_find_the_differences_of_the_whole_tables(buckets: int) -> None:
    source = _source()
    whole, found = _whole_and_buckets(source, _tampered(source), ["id"], buckets)
    assert (found.diff.missing, found.diff.extra, found.diff.different) == ([(5,)], [(5000,)], [(6,)])
    assert (found.diff.missing, found.diff.extra, found.diff.different) == (whole.missing, whole.extra, whole.different)
    assert (found.source_rows, found.lakehouse_rows, found.compared_rows) == (ROWS, ROWS, ROWS)
    assert checksum_text(found.source_hash_sum) == content_checksum(source)
    assert checksum_text(found.lakehouse_hash_sum) == content_checksum(_tampered(source))


def test_equal_tables_in_any_order_are_equal_in_buckets() -> None:
    source = _source()
    lake = source.take(pa.array(np.random.default_rng(1).permutation(ROWS)))
    found = compare_in_buckets(T, source.schema, _chunks(source), _chunks(lake), ["id"], 7)
    assert found.diff.ok
    assert found.source_hash_sum == found.lakehouse_hash_sum


def _with_region(rows: pa.Table) -> pa.Table:
    """A text key column beside the id: the region follows the id's parity."""
    even = pc.equal(pc.bit_wise_and(rows.column("id"), 1), 0)
    return rows.append_column("region", pc.if_else(even, "eu", "us"))


def test_a_composite_text_key_and_rows_left_out() -> None:
    source, lake = _with_region(_source()), _with_region(_tampered(_source()))
    key = ["region", "id"]

    def keep(rows: pa.Table) -> pa.Table:  # a key changed in flight, left out on both sides
        return rows.filter(pc.not_equal(rows.column("id"), 6))

    whole = compare_tables(T, keep(source), keep(lake), key)
    found = compare_in_buckets(T, source.schema, _chunks(source), _chunks(lake), key, 5, keep)
    assert (found.diff.missing, found.diff.extra, found.diff.different) == (whole.missing, whole.extra, whole.different)
    assert (found.diff.missing, found.diff.extra, found.diff.different) == ([("us", 5)], [("eu", 5000)], [])
    assert (found.source_rows, found.compared_rows) == (ROWS, ROWS - 1)
    assert checksum_text(found.source_hash_sum) == content_checksum(keep(source))


def test_a_table_without_a_key_keeps_duplicates_apart_across_buckets() -> None:
    source = pa.table({"a": [1, 1, 2, 3, None, None], "b": ["x", "x", "y", "z", None, None]})
    assert compare_in_buckets(T, source.schema, _chunks(source, 2), _chunks(source.take([5, 3, 1, 0, 2, 4]), 4), [], 4).diff.ok
    one_short = source.slice(1)
    found = compare_in_buckets(T, source.schema, _chunks(source, 2), _chunks(one_short, 4), [], 4)
    assert found.diff.different == [(1, "x")]


def test_a_key_lands_in_the_same_bucket_whatever_the_chunk() -> None:
    nullable = pa.table({"n": pa.array([None if i % 250 == 0 else i % 40 for i in range(1_000)], pa.int32())})
    whole = key_buckets(nullable, ["n"], 9)  # some chunks of 100 have a NULL, others not
    assert (whole == np.concatenate([key_buckets(chunk, ["n"], 9) for chunk in _chunks(nullable, 100)])).all()
    source = nullable.filter(pc.is_valid(nullable.column("n")))  # a keyless table's rows, chunked differently
    found = compare_in_buckets(T, nullable.schema, _chunks(nullable, 100), _chunks(source, 33), [], 9)
    assert found.diff.different == [] and found.diff.missing == [(None,)]
    rows = _source()
    for key in (["id"], ["name"], ["id", "at"]):
        whole = key_buckets(rows, key, 9)
        parts = np.concatenate([key_buckets(chunk, key, 9) for chunk in _chunks(rows, 100)])
        assert (whole == parts).all()
        assert set(whole.tolist()) == set(range(9))  # every bucket gets rows: the keys spread
