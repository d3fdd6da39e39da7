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
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.source.wire import read_payload

COM_BINLOG_DUMP = 0x12
BINLOG_DUMP_NON_BLOCK = 0x01  # end the stream (EOF packet) at the binlog's end instead of waiting
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
    checksums = checksum_enabled(conn)
    with conn.cursor() as cur:
        if checksums:  # a replica must say it understands checksums, or the server refuses to send
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
        cur.execute(f"SET @mariadb_slave_capability = {MARIADB_SLAVE_CAPABILITY_GTID}")
        if start is None:
            cur.execute("SET @slave_connect_state = %s", (gtid_state or "",))
            cur.execute("SET @slave_gtid_strict_mode = 1")
    name = start.log_file.encode() if start is not None else b""
    offset = start.log_pos if start is not None else 4
    command = struct.pack("<BIHI", COM_BINLOG_DUMP, offset, BINLOG_DUMP_NON_BLOCK, server_id) + name
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
        yield RawEvent(
            event_type, timestamp, origin, log_pos, flags, size, payload[1 + HEADER_SIZE : size + 1 - trailer]
        )
