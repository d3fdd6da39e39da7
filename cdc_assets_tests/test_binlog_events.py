"""Binlog events the reader decodes instead of refusing, on both flavours: compressed transactions (MySQL's zstd
TRANSACTION_PAYLOAD events, MariaDB's zlib-compressed query and row events) and the events of tables capture leaves
out (read no further than their names). A refusal here used to outlive its cause: the events stay in the binlog past
the checkpoint, so turning the setting off did not help."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cdc_assets.capture.binlog.compression import mariadb_decompressed, payload_events
from cdc_assets.capture.binlog.protocol import HEADER, HEADER_SIZE
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.positions import BinlogPosition, binlog_file_number
from cdc_assets.source.server import binlog_end, binlog_files, has_transaction_compression
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.stage_runs import capture_and_apply, source_and_current

pytestmark = pytest.mark.both_sources


def test_an_excluded_tables_map_is_not_read_beyond_its_name(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table map written without column names (binlog_row_metadata=MINIMAL for a while) stops capture for a captured
    table, with the fix; for an excluded table it is never parsed, so capture goes on."""
    monkeypatch.setenv("CDC_EXCLUDE_TABLES", f"{cdc.database}.skipped")
    cdc.execute(
        "CREATE TABLE kept (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE skipped (id INT PRIMARY KEY, v VARCHAR(10))",
        "INSERT INTO kept VALUES (1, 'a')",
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        try:
            cur.execute("INSERT INTO skipped VALUES (1, 'no names')")
        finally:
            cur.execute("SET GLOBAL binlog_row_metadata = 'FULL'")
    cdc.execute("INSERT INTO kept VALUES (2, 'b')", "UPDATE kept SET v = 'c' WHERE id = 1")

    report = capture_and_apply(cdc)

    assert report.tables == [f"{cdc.database}.kept"]
    source, current = source_and_current(cdc, "kept")
    assert current.equals(source) and source.num_rows == 2


@contextmanager
def _compressed_binlog(cdc: CdcEnv) -> Iterator[None]:
    """The server compresses what it binlogs meanwhile: MySQL every transaction (zstd payloads), MariaDB every query
    and row event (zlib; its threshold lowered so that small ones are compressed too)."""
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        transactions = has_transaction_compression(cdc.server.flavour, str(cur.fetchone()[0]))
        settings = (
            {"binlog_transaction_compression": ("ON", "OFF")}
            if transactions
            else {"log_bin_compress": ("ON", "OFF"), "log_bin_compress_min_len": ("10", "256")}
        )
        for name, (on, _) in settings.items():
            cur.execute(f"SET GLOBAL {name} = {on}")
        try:
            yield
        finally:
            for name, (_, off) in settings.items():
                cur.execute(f"SET GLOBAL {name} = {off}")


def _compressed_events(cdc: CdcEnv, since: BinlogPosition) -> int:
    """How many compressed events the server's binlogs hold from `since` on (they stay in them after compression is
    turned off). From `since`, not the whole binlog: the other tests' events before it may be larger than a client
    can be sent (test_huge_values'), which ends SHOW BINLOG EVENTS with an error. Read as bytes: the binlogs hold the
    other tests' statements too, which a latin1 client's leave in no UTF-8."""
    with cdc.admin() as conn, conn.cursor() as cur:
        files = [name for name, _ in binlog_files(conn) if binlog_file_number(name) >= binlog_file_number(since.log_file)]
        cur.execute("SET NAMES binary")
        count = 0
        for name in files:
            start = f" FROM {since.log_pos}" if name == since.log_file else ""
            cur.execute(f"SHOW BINLOG EVENTS IN '{name}'{start}")
            count += sum(1 for row in cur.fetchall() if b"compress" in row[2].lower() or row[2] == b"Transaction_payload")
    return count


def test_compressed_transactions_are_captured_as_if_written_plainly(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inserts, updates, deletes, a multi-table transaction and a DDL, written while the server compresses its binlog,
    are captured exactly once and exactly, also after compression is turned off (the events stay in the binlog past
    the checkpoint, which once kept `sync` refusing for good); batches still end only at transaction ends."""
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "2")
    monkeypatch.setenv("CDC_EXCLUDE_TABLES", f"{cdc.database}.skipped")
    cdc.execute(
        "CREATE TABLE skipped (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(200), balance BIGINT, note TEXT)",
    )
    with cdc.admin() as conn:
        before = binlog_end(conn)
    with _compressed_binlog(cdc), cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE audit (id INT PRIMARY KEY, what VARCHAR(100)) COMMENT 'made while compressed'")
        for first in range(0, 30, 3):  # transactions of three rows: a batch of 2 rows must take all three
            cur.execute("BEGIN")
            cur.executemany(
                "INSERT INTO acct VALUES (%s, %s, %s, %s)",
                [(i, f"owner {i} ✅" * 5, i * 100, "x" * (i * 40)) for i in range(first, first + 3)],
            )
            cur.execute("COMMIT")
        cur.execute("BEGIN")
        cur.execute("UPDATE acct SET balance = balance + 1, note = REPEAT('y', 300) WHERE id < 12")
        cur.execute("DELETE FROM acct WHERE id IN (13, 14, 15)")
        cur.execute("INSERT INTO audit VALUES (1, 'moved money')")
        cur.execute("INSERT INTO skipped VALUES (1, 'left out')")
        cur.execute("COMMIT")
    assert _compressed_events(cdc, before) > 10  # the server did compress them

    first = capture_and_apply(cdc)
    cdc.execute("INSERT INTO acct VALUES (100, 'after', 1, NULL)")  # written plainly, after the compressed ones
    with _compressed_binlog(cdc):
        cdc.execute("UPDATE acct SET owner = 'compressed again' WHERE id = 100")
    second = capture_and_apply(cdc)

    for name in ("acct", "audit"):
        source, current = source_and_current(cdc, name)
        assert current.equals(source), name
    assert first.rows == 30 + 12 + 3 + 1 and second.rows == 2  # every change once (the excluded table's none)
    sizes = [b.rows for b in first.batches]
    assert all(size % 3 == 0 for size in sizes[: 10]) and max(sizes[:10]) == 3, sizes  # whole transactions only
    assert first.batches[-1].rows == 16  # the multi-table transaction, whole


def _mariadb_compressed(plain: bytes, rows_at: int) -> bytes:
    """MariaDB's compression of an event's part from `rows_at`: header byte (zlib, 2 length bytes), length, zlib."""
    rows = plain[rows_at:]
    return plain[:rows_at] + bytes([0x80 | 2]) + len(rows).to_bytes(2, "big") + zlib.compress(rows)


@pytest.mark.parametrize(("compressed_type", "plain_type", "bitmaps"), [(169, 30, 1), (170, 31, 2), (171, 32, 1)])
def test_mariadb_compressed_v2_row_events_decompress_to_the_plain_event(
    compressed_type: int, plain_type: int, bitmaps: int
) -> None:
    """The V2 compressed row events (with extra row info), which MariaDB 10.11 does not write by default: the rows
    part starts after the extra info, the width and the column bitmaps."""
    extra = b"\x05\x00\x01\x02\x03"  # extra row info: its length counts its own two bytes
    head = (42).to_bytes(6, "little") + b"\x01\x00" + extra + b"\x02" + b"\x03" * bitmaps
    plain = head + b"\x00" + (7).to_bytes(4, "little") + b"\x00\x01\x61" * 50
    assert mariadb_decompressed(compressed_type, _mariadb_compressed(plain, len(head)), 10) == (plain_type, plain)


def test_a_payload_compressed_another_way_is_refused_with_a_sentence() -> None:
    body = bytes([2, 1, 7, 1, 1, 4, 0]) + b"abcd"  # compression type 7, payload size 4, end mark
    with pytest.raises(CdcUserError, match="compressed with algorithm 7, which the binlog reader does not know"):
        list(payload_events(body))
    plain = HEADER.pack(0, 16, 1, HEADER_SIZE, 0, 0)  # one event of nothing but its header, stored uncompressed
    [event] = payload_events(bytes([2, 3, 0xFC, 0xFF, 0, 1, 1, len(plain), 0]) + plain)  # type 255: none
    assert (event.type, event.size, event.body) == (16, HEADER_SIZE, b"")
