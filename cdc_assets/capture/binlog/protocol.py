"""The binlog dump: a replica's COM_BINLOG_DUMP over a MySQL connection, read as raw events.

The connection is PyMySQL's (authentication, TLS and error packets are its business); once the dump
command is sent, packets are read straight from its buffered socket, so an event costs two reads and
one header unpack.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import pymysql

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.source.wire import read_payload

COM_BINLOG_DUMP = 0x12
COM_BINLOG_DUMP_GTID = 0x1E
BINLOG_DUMP_NON_BLOCK = 0x01  # end the stream (EOF packet) at the binlog's end instead of waiting
BINLOG_THROUGH_GTID = 0x04  # COM_BINLOG_DUMP_GTID: the command carries the replica's executed GTID set
MARIADB_SLAVE_CAPABILITY_GTID = 4  # MariaDB sends its GTID events to a replica that declares this
HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
HEADER_SIZE = HEADER.size
CHECKSUM_SIZE = 4
_PACKET_HEADER = struct.Struct("<I")
_OK, _EOF, _ERROR = 0x00, 0xFE, 0xFF


class RawEvent(NamedTuple):
    """One binlog event: its common header and its body (without header and checksum). A named tuple: made
    for every event, it costs a third of a frozen dataclass."""

    type: int
    timestamp: int
    server_id: int
    log_pos: int  # where the event ends in its binlog file; 0 for events the server makes up (artificial)
    flags: int
    size: int  # on disk, header and checksum included
    body: bytes


def checksum_enabled(conn: pymysql.Connection) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT @@global.binlog_checksum")
        row = cur.fetchone()
    return bool(row) and str(row[0]).upper() not in ("NONE", "")


def dump_events(
    conn: pymysql.Connection, server_id: int, start: BinlogPosition | None, gtid_state: str | None = None
) -> Iterator[RawEvent]:
    """Every event from `start` to the binlog's end as of now, then the iterator ends.

    The stream begins with the server's own artificial events (a rotate naming the file, its format
    description); `log_pos` of every real event is the position after it. With `gtid_state` instead of a
    start (MariaDB only), the server starts right after that GTID state, wherever it lies in its own binlog
    (`@slave_connect_state`, strict: it refuses a state its binlog does not hold).
    """
    checksums = _declare_replica(conn)
    with conn.cursor() as cur:
        cur.execute(f"SET @mariadb_slave_capability = {MARIADB_SLAVE_CAPABILITY_GTID}")
        if start is None:
            cur.execute("SET @slave_connect_state = %s", (gtid_state or "",))
            cur.execute("SET @slave_gtid_strict_mode = 1")
    name = start.log_file.encode() if start is not None else b""
    offset = start.log_pos if start is not None else 4
    command = struct.pack("<BIHI", COM_BINLOG_DUMP, offset, BINLOG_DUMP_NON_BLOCK, server_id) + name
    return _events(conn, command, checksums)


def dump_events_after(conn: pymysql.Connection, server_id: int, executed: GtidState) -> Iterator[RawEvent]:
    """MySQL's GTID dump (COM_BINLOG_DUMP_GTID), as a replica with auto-position asks: every transaction of the
    server's binlog that is not in `executed`, to the binlog's end as of now, each GTID event with its real
    position; the transactions in the set are left out. A set with tags goes in the tagged encoding, which only
    MySQL 8.3+ reads (`encode_gtid_set`)."""
    checksums = _declare_replica(conn)
    data = encode_gtid_set(executed)
    flags = BINLOG_DUMP_NON_BLOCK | BINLOG_THROUGH_GTID
    command = struct.pack("<BHII", COM_BINLOG_DUMP_GTID, flags, server_id, 0) + struct.pack("<QI", 4, len(data)) + data
    return _events(conn, command, checksums)


def encode_gtid_set(executed: GtidState) -> bytes:
    """MySQL's binary GTID set (Gtid_set::encode): the number of sources, then per source its UUID, its tag (tagged
    format only: a varlen length, then the tag), its intervals as [start, end) pairs. The tagged format (8.3+)
    marks itself in the top and the low byte of the count, and is used only when a tag is in the set."""
    sources = sorted(executed.executed.items())
    tagged = executed.tagged
    count = len(sources)
    out = [struct.pack("<Q", (1 << 56) | (count << 8) | 1 if tagged else count)]
    for (uuid, tag), intervals in sources:
        out.append(bytes.fromhex(uuid.replace("-", "")))
        if tagged:  # a tag is at most 32 characters: its varlen length is one byte, the length shifted left
            out.append(bytes([len(tag) << 1]) + tag.encode("ascii"))
        out.append(struct.pack("<Q", len(intervals)))
        out.extend(struct.pack("<QQ", first, last + 1) for first, last in intervals)
    return b"".join(out)


def _declare_replica(conn: pymysql.Connection) -> bool:
    """Tell the server this replica reads checksums (or it refuses to send); whether events carry them."""
    checksums = checksum_enabled(conn)
    if checksums:
        with conn.cursor() as cur:
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
    return checksums


def _events(conn: pymysql.Connection, command: bytes, checksums: bool) -> Iterator[RawEvent]:
    """Send a dump command, then read its events straight from the socket until the end of the stream."""
    conn._write_bytes(_PACKET_HEADER.pack(len(command)) + command)  # sequence id 0 in the high byte
    read = conn._rfile.read
    trailer = CHECKSUM_SIZE if checksums else 0
    unpack_header = HEADER.unpack_from
    crc32 = zlib.crc32
    while True:
        payload = read_payload(read)
        first = payload[0]
        if first == _OK:
            pass
        elif first == _EOF and len(payload) < 9:
            return
        elif first == _ERROR:
            pymysql.err.raise_mysql_exception(payload)
        else:
            raise CdcUserError(
                f"The MySQL server sent a packet the binlog reader does not know (0x{first:02x}): check its version."
            )
        timestamp, event_type, origin, size, log_pos, flags = unpack_header(payload, 1)
        if trailer:
            stored = int.from_bytes(payload[size - 3 : size + 1], "little")
            if crc32(memoryview(payload)[1 : size - 3]) != stored:
                raise CdcUserError(
                    f"A binlog event ending at position {log_pos} fails its CRC32 checksum (a corrupt "
                    "binlog or network error): check the server's binlog with mariadb-binlog / mysqlbinlog."
                )
        if isinstance(payload, bytearray):  # an event of 16 MB or more: its body cut out in place, not copied
            del payload[size + 1 - trailer :]
            del payload[: 1 + HEADER_SIZE]
            body = payload
        else:
            body = payload[1 + HEADER_SIZE : size + 1 - trailer]
        del payload  # not held twice while the event is read: a row event may be gigabytes
        yield RawEvent(event_type, timestamp, origin, log_pos, flags, size, body)  # type: ignore[arg-type]
