"""The order-independent row checksum (no server)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import pyarrow as pa

from cdc_assets.verification.row_hashes import CHECKSUM_MODULUS, row_hash_sum


def test_sums_of_parts_add_up_to_the_whole_whatever_the_slicing() -> None:
    rows = pa.table({"id": np.arange(50_000), "s": [f"x{i}" if i % 9 else None for i in range(50_000)]})
    parts = (row_hash_sum(rows.slice(0, 12_345)) + row_hash_sum(rows.slice(12_345))) % CHECKSUM_MODULUS
    assert parts == row_hash_sum(rows)
    assert row_hash_sum(rows.slice(7)) == row_hash_sum(pa.Table.from_pylist(rows.slice(7).to_pylist(), rows.schema))


def test_distinct_rows_hash_apart() -> None:
    """Short rows that differ by one byte, by the order of bytes, by length, by a NULL or by which cells share a
    row: no two share a hash."""
    count = 5_000
    rows = pa.table(
        {
            "v": [chr(65 + i % 26) * (i % 5) + str(i % 300) if i % 13 else None for i in range(count)],
            "n": pa.array([i % 7 if i % 11 else None for i in range(count)], pa.int32()),
            "d": pa.array([Decimal(i % 50) / 4 for i in range(count)], pa.decimal128(10, 2)),
        }
    )
    distinct = {tuple(r.values()) for r in rows.to_pylist()}
    assert len({row_hash_sum(rows.slice(i, 1)) for i in range(count)}) == len(distinct)
    assert row_hash_sum(pa.table({"v": ["ab"]})) != row_hash_sum(pa.table({"v": ["ba"]}))
    assert row_hash_sum(pa.table({"v": ["a", "b"]})) != row_hash_sum(pa.table({"v": ["ab", ""]}))
    assert row_hash_sum(pa.table({"v": [""]})) != row_hash_sum(pa.table({"v": pa.array([None], pa.string())}))
    swapped = pa.table({"a": [1, 2], "b": [2, 1]})  # the same cells, paired differently
    assert row_hash_sum(swapped) != row_hash_sum(pa.table({"a": [1, 2], "b": [1, 2]}))
    assert row_hash_sum(pa.table({"a": [1], "b": [2]})) != row_hash_sum(pa.table({"a": [2], "b": [1]}))


def test_every_type_of_the_mapping_hashes_the_same_from_any_slice() -> None:
    """Fixed-width columns are hashed from their words, the others from their bytes: a slice's offset or a
    copy of the same values gives the same hashes."""
    rows = pa.table(
        {
            "i8": pa.array([1, -1, None, 127], pa.int8()),
            "u64": pa.array([0, 2**64 - 1, 5, None], pa.uint64()),
            "d": pa.array([Decimal("1.50"), None, Decimal("-2.25"), Decimal("0")], pa.decimal128(38, 2)),
            "day": pa.array([dt.date(2026, 1, 1), None, dt.date(1970, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
            "ts": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None, None, None], pa.timestamp("us", tz="UTC")),
            "f": pa.array([0.5, None, -1.0, 3.25], pa.float64()),
            "b": pa.array([b"\x00", b"", None, b"xy"], pa.binary()),
            "flag": pa.array([True, False, None, True], pa.bool_()),
        }
    )
    copy = pa.Table.from_pylist(rows.to_pylist(), rows.schema)
    assert row_hash_sum(rows) == row_hash_sum(copy)
    for i in range(rows.num_rows):
        assert row_hash_sum(rows.slice(i, 1)) == row_hash_sum(copy.slice(i, 1))
    total = sum(row_hash_sum(rows.slice(i, 1)) for i in range(rows.num_rows)) % CHECKSUM_MODULUS
    assert total == row_hash_sum(rows)


def _reference_hash_sum(rows: pa.Table) -> int:
    """`row_hash_sum` of one binary column written out plainly, all bytes at once (as it was computed before the
    bytes were taken a block at a time)."""
    import hashlib as _hashlib

    from cdc_assets.verification.row_hashes import _mix

    seed = np.uint64(int.from_bytes(_hashlib.blake2b(f"0:{rows.schema.field(0).type}".encode(), digest_size=8).digest(), "big"))
    total = 0
    with np.errstate(over="ignore"):
        for value in rows.column(0).to_pylist():
            data = np.frombuffer(value, np.uint8).astype(np.uint64)
            positions = np.arange(data.size, dtype=np.uint64)
            summed = np.sum(_mix((positions << np.uint64(8)) ^ data ^ seed), dtype=np.uint64)
            cell = _mix(summed ^ _mix(np.uint64(len(value)) ^ seed))
            total += int(_mix(np.zeros(1, np.uint64) + cell)[0])
    return total % CHECKSUM_MODULUS


def test_a_huge_value_hashes_as_before_in_memory_that_does_not_grow_with_it() -> None:
    """A value of tens of megabytes is hashed a block of bytes at a time: the same hash as all bytes at once, and
    numpy's temporaries (8 bytes per byte hashed) no longer grow with the value: a 62 MB text took gigabytes."""
    import tracemalloc

    rng = np.random.default_rng(5)
    huge = rng.integers(0, 256, 48 << 20, dtype=np.uint8).tobytes()
    rows = pa.table({"v": pa.array([huge, b"", b"short", huge[: (1 << 20) + 3]], pa.binary())})
    assert row_hash_sum(rows) == _reference_hash_sum(rows)
    tracemalloc.start()  # numpy's allocations are traced (Arrow's are not: the value itself is not counted)
    try:
        row_hash_sum(rows.slice(0, 1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(huge), f"hashing a {len(huge) >> 20} MB value took {peak >> 20} MB of temporaries"
