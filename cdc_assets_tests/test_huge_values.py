"""Huge values (issue 27, item 12): a LONGTEXT and a LONGBLOB of tens of megabytes, each more than one protocol packet
(16 MB) in the binlog and in a SELECT, arrive intact, byte for byte, through capture, the change log, current state,
the checks and verify, on both flavours; and the Delta logs keep no copy of them in their statistics.

How much memory a huge value takes is a figure of `benchmarks/huge_value.py` (peak RSS of whole `sync` and `verify`
processes), not a bound asserted here: a peak on a loaded 2-core machine is no stable test."""

from __future__ import annotations

import hashlib
import random

import pyarrow as pa
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import CHANGES, CURRENT, DELTA_LOG
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources

MB = 1 << 20
SIZE = 17 * MB  # over one packet (16 MB): the multi-packet paths of the binlog reader and of the source reader
MAX_ALLOWED_PACKET = 256 * MB  # the servers' default (16 MB on MariaDB, 64 MB on MySQL) refuses such rows


def _text(seed: int) -> str:
    """SIZE bytes of UTF-8: ASCII lines and two-, three- and four-byte characters, different on every line."""
    rng = random.Random(seed)
    pieces, size = [], 0
    while size < SIZE:
        line = f"{rng.random()} é ✓ 🦀 {'x' * rng.randrange(60)}\n"
        pieces.append(line)
        size += len(line.encode())
    return "".join(pieces)


def _blob(seed: int) -> bytes:
    """SIZE random bytes: every byte value, no run a shortcut could take."""
    return random.Random(seed).randbytes(SIZE)


def _digest(value: str | bytes | None) -> str | None:
    if value is None:
        return None
    return hashlib.sha256(value.encode() if isinstance(value, str) else value).hexdigest()


@pytest.fixture
def huge(cdc: CdcEnv) -> CdcEnv:
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"SET GLOBAL max_allowed_packet = {MAX_ALLOWED_PACKET}")  # for the connections opened after it
    cdc.execute("CREATE TABLE h (id INT PRIMARY KEY, t LONGTEXT CHARACTER SET utf8mb4, b LONGBLOB, note VARCHAR(10))")
    return cdc


def _current(cdc: CdcEnv) -> dict[int, tuple[str | None, str | None, str | None]]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, "h"), ["id", "t", "b", "note"])
    assert rows is not None
    return {r["id"]: (_digest(r["t"]), _digest(r["b"]), r["note"]) for r in rows.to_pylist()}


def _largest_log_entry(cdc: CdcEnv, layer: str) -> int:
    log = cdc.lakehouse_dir / layer / cdc.database / "h" / DELTA_LOG
    return max(p.stat().st_size for p in log.iterdir() if p.is_file())


def test_a_huge_text_and_blob_arrive_byte_for_byte(huge: CdcEnv) -> None:
    cdc = huge
    first_text, first_blob = _text(1), _blob(1)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO h VALUES (1, %s, %s, 'one'), (2, 'small', x'00ff', 'two')", (first_text, first_blob))
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
    assert _current(cdc) == {1: (_digest(first_text), _digest(first_blob), "one"), 2: (_digest("small"), _digest(b"\x00\xff"), "two")}

    second_text, second_blob = _text(2), _blob(2)
    with cdc.admin() as conn, conn.cursor() as cur:  # an update's row event holds both images: four huge values
        cur.execute("UPDATE h SET t = %s, b = %s, note = 'new' WHERE id = 1", (second_text, second_blob))
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
    assert _current(cdc)[1] == (_digest(second_text), _digest(second_blob), "new")
    log = read_query(open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "h")), None), "SELECT * FROM c", "c")
    update = [r for r in log.to_pylist() if r["_cdc_op"] == "update"]
    assert len(update) == 1
    assert (_digest(update[0]["t"]), _digest(update[0]["b"])) == (_digest(second_text), _digest(second_blob))
    before = update[0]["_cdc_before"]
    assert (_digest(before["t"]), _digest(before["b"])) == (_digest(first_text), _digest(first_blob))

    # No statistics of a huge value in any Delta log entry (delta-rs's own or those of the files the pipeline writes
    # itself): one once held the value twice, and every reader of the table parsed it.
    assert _largest_log_entry(cdc, CHANGES) < MB and _largest_log_entry(cdc, CURRENT) < MB

    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM h WHERE id = 1")
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
    assert set(_current(cdc)) == {2}


def test_a_huge_value_in_a_keyless_table(huge: CdcEnv) -> None:
    """A table without a key is keyed by its whole row: the huge value is part of every key."""
    cdc = huge
    cdc.execute("CREATE TABLE k (t LONGTEXT CHARACTER SET utf8mb4, b LONGBLOB)")
    text, blob = _text(3), _blob(3)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO k VALUES (%s, %s), (%s, %s)", (text, blob, text, blob))  # two copies
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, "k"), ["t", "b"])
    assert rows is not None
    assert sorted((_digest(r["t"]), _digest(r["b"])) for r in rows.to_pylist()) == [(_digest(text), _digest(blob))] * 2
    assert pa.types.is_binary(rows.schema.field("b").type)
