"""The MySQL client/server protocol below PyMySQL: packets read straight from a connection's socket, for the
binlog dump and for result sets read a buffer at a time."""

from __future__ import annotations

from collections.abc import Callable

import pymysql

MAX_PACKET_PAYLOAD = 0xFFFFFF  # a payload this long continues in the next packet


def read_payload(read: Callable[[int], bytes]) -> bytes | bytearray:
    """One protocol packet's payload (from a reader of the connection's socket), joined with its continuations
    when it is 16 MB or more: then as a bytearray, grown in place (joining the parts took twice the payload's
    memory, and a payload may be a row of gigabytes). A connection the server closed or reset (a killed thread) is
    PyMySQL's lost connection (2013), as on any other connection."""
    try:
        header = read(4)
        if len(header) < 4:
            raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
        length = int.from_bytes(header[:3], "little")
        payload = read(length)
        if len(payload) < length:
            raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
        if length < MAX_PACKET_PAYLOAD:
            return payload
        joined = bytearray(payload)
        del payload
        while length == MAX_PACKET_PAYLOAD:
            header = read(4)
            length = int.from_bytes(header[:3], "little")
            part = read(length)
            if len(header) < 4 or len(part) < length:
                raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
            joined += part
        return joined
    except OSError as exc:  # ConnectionResetError and the like: the server ended the connection mid-packet
        raise pymysql.err.OperationalError(2013, f"Lost connection to MySQL server during query ({exc})") from exc
