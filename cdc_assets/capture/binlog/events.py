"""Binlog event types, and the fields capture reads from the events that are not row data.

Layouts follow the server sources (MySQL `libbinlogevents`, MariaDB `log_event.h`); every function takes
an event's body, without the 19-byte common header and without the checksum.
"""

from __future__ import annotations

import struct

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.gtids import GtidState

QUERY = 2
ROTATE = 4
FORMAT_DESCRIPTION = 15
XID = 16
TABLE_MAP = 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32
MYSQL_GTID = 33
MYSQL_PREVIOUS_GTIDS = 35
XA_PREPARE = 38
PARTIAL_UPDATE_ROWS = 39
TRANSACTION_PAYLOAD = 40
MYSQL_GTID_TAGGED = 42
MARIADB_GTID = 162
MARIADB_START_ENCRYPTION = 164

ROW_EVENTS: dict[int, str] = {
    WRITE_ROWS_V1: "insert", UPDATE_ROWS_V1: "update", DELETE_ROWS_V1: "delete",
    WRITE_ROWS_V2: "insert", UPDATE_ROWS_V2: "update", DELETE_ROWS_V2: "delete",
    PARTIAL_UPDATE_ROWS: "update",  # binlog_row_value_options=PARTIAL_JSON: JSON after-images as diffs
}  # fmt: skip
ROWS_V2 = frozenset({WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2, PARTIAL_UPDATE_ROWS})

LOG_EVENT_ARTIFICIAL = 0x20  # made up by the server for the replica (the rotate that opens a dump)
MARIADB_GTID_STANDALONE = 0x01  # FL_STANDALONE: the group is one statement (DDL) with no COMMIT of its own

_QUERY_POST_HEADER = struct.Struct("<IIBHH")  # thread id, exec time, schema length, error code, status vars length
_MARIADB_GTID = struct.Struct("<QIB")  # sequence number, domain, flags
_XA_PREPARE = struct.Struct("<BIII")  # one phase, format id, gtrid length, bqual length


def refuse_unreadable(event_type: int) -> None:
    """Encrypted events cannot be decoded: one sentence with the fix. (Compressed ones are: `compression`.)"""
    if event_type == MARIADB_START_ENCRYPTION:
        raise CdcUserError(
            "The source encrypts its binlog (encrypt_binlog=ON), which a replica reading it remotely cannot "
            "decode here: turn binlog encryption off for the binlogs the pipeline reads."
        )


def rotate_target(body: bytes) -> tuple[str, int]:
    """(next binlog file, position in it) of a rotate event."""
    (position,) = struct.unpack_from("<Q", body)
    return body[8:].decode(), position


def format_post_header_lengths(body: bytes) -> bytes:
    """Post-header length of each event type (index type - 1), from a format description event.

    The body ends with the checksum algorithm byte on every server that can write checksums.
    """
    return body[2 + 50 + 4 + 1 : -1]


def query_text(body: bytes, post_header_length: int = _QUERY_POST_HEADER.size) -> tuple[str, str]:
    """(default schema, '' when none, and the statement) of a query event."""
    _, _, schema_length, _, status_length = _QUERY_POST_HEADER.unpack_from(body)
    start = post_header_length + status_length
    schema = body[start : start + schema_length].decode("utf-8", "replace")
    query = body[start + schema_length + 1 :].decode("utf-8", "backslashreplace")
    return schema, query


def query_start(body: bytes, post_header_length: int = _QUERY_POST_HEADER.size) -> int:
    """Where a query event's statement starts (after its status variables and default schema)."""
    _, _, schema_length, _, status_length = _QUERY_POST_HEADER.unpack_from(body)
    return post_header_length + status_length + schema_length + 1


def mariadb_gtid(body: bytes, server_id: int) -> tuple[str, int]:
    """(`domain-server-sequence`, flags) of a MariaDB GTID event."""
    sequence, domain, flags = _MARIADB_GTID.unpack_from(body)
    return f"{domain}-{server_id}-{sequence}", flags


def _uuid_text(raw: bytes) -> str:
    sid = raw.hex()
    return f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}"


def mysql_gtid(body: bytes) -> str:
    """`uuid:number` of a MySQL GTID event."""
    (number,) = struct.unpack_from("<Q", body, 17)
    return f"{_uuid_text(body[1:17])}:{number}"


def varlen_int(body: bytes, pos: int) -> tuple[int, int]:
    """An unsigned integer in MySQL's serialization format (libs/mysql/serialization): the first byte's trailing one
    bits count the bytes that follow; the value's bits come after them, little-endian. Returns it and the next pos."""
    first = body[pos]
    size = 1
    while size <= 8 and first >> (size - 1) & 1:
        size += 1
    if size == 1:
        return first >> 1, pos + 1
    rest = int.from_bytes(body[pos + 1 : pos + size], "little")
    return (first >> size) | rest << (8 - size + ((size + 7) >> 4)), pos + size


_TAGGED_GTID_FLAGS, _TAGGED_GTID_UUID, _TAGGED_GTID_GNO, _TAGGED_GTID_TAG = 0, 1, 2, 3


def mysql_tagged_gtid(body: bytes) -> str:
    """`uuid:tag:number` of a MySQL 8.3+ GTID_TAGGED_LOG_EVENT: a message of MySQL's serialization format (version,
    size, last non-ignorable field id, then fields by id: flags, the UUID as 16 varlen bytes, the number as a signed
    varlen, the tag as a varlen length and its bytes, then timestamps and the like, not needed here)."""
    _, pos = varlen_int(body, 0)  # serialization format version
    _, pos = varlen_int(body, pos)  # message size
    _, pos = varlen_int(body, pos)  # last non-ignorable field id
    uuid, number, tag = b"", 0, ""
    while pos < len(body):
        field_id, pos = varlen_int(body, pos)
        if field_id == _TAGGED_GTID_UUID:
            raw = bytearray()
            for _ in range(16):
                byte, pos = varlen_int(body, pos)
                raw.append(byte)
            uuid = bytes(raw)
        elif field_id == _TAGGED_GTID_GNO:
            zigzag, pos = varlen_int(body, pos)
            number = (zigzag >> 1) ^ -(zigzag & 1)
        elif field_id == _TAGGED_GTID_TAG:
            length, pos = varlen_int(body, pos)
            tag = body[pos : pos + length].decode("ascii")
            break
        else:  # flags (and nothing else comes before the tag)
            _, pos = varlen_int(body, pos)
    return f"{_uuid_text(uuid)}:{tag}:{number}" if tag else f"{_uuid_text(uuid)}:{number}"


_GTID_SET_TAGGED_FORMAT = 1


def mysql_previous_gtids(body: bytes) -> GtidState:
    """The executed GTID set before a binlog file (its PREVIOUS_GTIDS event): MySQL's encoded GTID set. The first
    8 bytes hold the number of sources, with the format (1: tagged, MySQL 8.3+) in the top byte and, when tagged,
    repeated in the low byte; then per source its UUID, its tag when tagged, its intervals (end excluded)."""
    (head,) = struct.unpack_from("<Q", body)
    tagged = head >> 56 == _GTID_SET_TAGGED_FORMAT
    count = (head >> 8) & ((1 << 48) - 1) if tagged else head & ((1 << 56) - 1)
    state, pos = GtidState(), 8
    for _ in range(count):
        uuid = _uuid_text(body[pos : pos + 16])
        pos += 16
        tag = ""
        if tagged:
            length, pos = varlen_int(body, pos)
            tag = body[pos : pos + length].decode("ascii")
            pos += length
        (intervals,) = struct.unpack_from("<Q", body, pos)
        pos += 8
        for _ in range(intervals):
            first, end = struct.unpack_from("<QQ", body, pos)
            pos += 16
            state.add_interval((uuid, tag), first, end - 1)
    return state


def xa_prepare_is_one_phase(body: bytes) -> bool:
    """Whether an XA_PREPARE event is `XA COMMIT ... ONE PHASE` (logged as a plain transaction)."""
    return _XA_PREPARE.unpack_from(body)[0] != 0
