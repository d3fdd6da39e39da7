"""Binlog event types, and the fields capture reads from the events that are not row data.

Layouts follow the server sources (MySQL `libbinlogevents`, MariaDB `log_event.h`); every function takes
an event's body, without the 19-byte common header and without the checksum.
"""

from __future__ import annotations

import codecs
import re
import struct
from typing import NamedTuple

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.mysql_charsets import collation_charset, python_codec
from cdc_assets.core.ops import DELETE, INSERT, UPDATE

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
    WRITE_ROWS_V1: INSERT, UPDATE_ROWS_V1: UPDATE, DELETE_ROWS_V1: DELETE,
    WRITE_ROWS_V2: INSERT, UPDATE_ROWS_V2: UPDATE, DELETE_ROWS_V2: DELETE,
    PARTIAL_UPDATE_ROWS: UPDATE,  # binlog_row_value_options=PARTIAL_JSON: JSON after-images as diffs
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


# A query event's status variables: a code, then a value of the size the code gives (a length byte and that many
# bytes for a time zone or catalog, and a NUL after Q_CATALOG_CODE's). The server writes Q_FLAGS2, Q_SQL_MODE,
# Q_CATALOG_NZ and Q_AUTO_INCREMENT before Q_CHARSET_CODE, which holds character_set_client, collation_connection and
# collation_server as three 16-bit collation numbers (the order of the server's Query_log_event::write).
_Q_CATALOG, _Q_CHARSET, _Q_TIME_ZONE, _Q_CATALOG_NZ = 2, 4, 5, 6
_STATUS_SIZES = {0: 4, 1: 8, 3: 4, 7: 2, 8: 2, 9: 8, 10: 4, 13: 3}
_SERVER_WRITTEN_CTAS = b" START TRANSACTION"  # MySQL's own CREATE TABLE for a CREATE … SELECT ends so
_TRANSACTION_WORDS = frozenset({b"BEGIN", b"COMMIT"})
_CREATE_TABLE = re.compile(rb"\s*CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\b", re.IGNORECASE)


class QueryText(NamedTuple):
    """A query event's default schema ('' when none), its statement, and the charset the server read the statement's
    string literals in (collation_connection's; None when the event does not say)."""

    schema: str
    query: str
    literal_charset: str | None


def statement_collations(body: bytes, post_header_length: int = _QUERY_POST_HEADER.size) -> tuple[int, int] | None:
    """(character_set_client, collation_connection) numbers of a query event, from its Q_CHARSET_CODE status
    variable; None when it has none (every server since MySQL 5.0 writes it)."""
    _, _, _, _, status_length = _QUERY_POST_HEADER.unpack_from(body)
    pos, end = post_header_length, post_header_length + status_length
    while pos < end:
        code = body[pos]
        pos += 1
        if code == _Q_CHARSET:
            client, connection, _ = struct.unpack_from("<HHH", body, pos)
            return client, connection
        if code == _Q_CATALOG:
            pos += 1 + body[pos] + 1
        elif code in (_Q_TIME_ZONE, _Q_CATALOG_NZ):
            pos += 1 + body[pos]
        elif code in _STATUS_SIZES:
            pos += _STATUS_SIZES[code]
        else:  # a code whose size is not known here, which no server writes before Q_CHARSET_CODE: none found
            return None
    return None


def query_text(
    body: bytes, post_header_length: int = _QUERY_POST_HEADER.size, flavor: str = "mysql", server_written: bool = False
) -> QueryText:
    """A query event's default schema, statement and literal charset (`QueryText`).

    The statement is in its client's charset, character_set_client (Q_CHARSET_CODE; a latin1 client's 'é' is the one
    byte E9), and is decoded in it. It is decoded as UTF-8 only when the event has no Q_CHARSET_CODE or names a
    collation no one here knows, and for the CREATE TABLE a server writes itself for a CREATE … SELECT, which is in
    its own charset (UTF-8) whatever the client's: MySQL's ends in START TRANSACTION, MariaDB's comes inside the
    statement's transaction (`server_written`, capture knows it from the GTID event's flags). The default schema is
    always in the server's own charset (UTF-8)."""
    _, _, schema_length, _, status_length = _QUERY_POST_HEADER.unpack_from(body)
    start = post_header_length + status_length
    schema = body[start : start + schema_length].decode("utf-8", "replace")
    raw = body[start + schema_length + 1 :]
    if raw in _TRANSACTION_WORDS:  # letters, the same in every client charset: no status variable is read
        return QueryText(schema, raw.decode("ascii"), None)
    collations = statement_collations(body, post_header_length)
    if collations is not None and not _written_by_server(raw, server_written):
        codec, literal = _CHARSETS.get((collations, flavor)) or _statement_charsets(collations, flavor)
        try:
            if codec is not None:
                return QueryText(schema, raw.decode(codec, "backslashreplace"), literal)
        except LookupError:  # a charset only the source converts, and none is set (capture always sets its own)
            pass
    return QueryText(schema, raw.decode("utf-8", "backslashreplace"), None)


_CHARSETS: dict[tuple[tuple[int, int], str], tuple[str | None, str | None]] = {}


def _statement_charsets(collations: tuple[int, int], flavor: str) -> tuple[str | None, str | None]:
    """(the Python codec of character_set_client, collation_connection's charset) of a statement's collation
    numbers, None for one no one here knows; kept, as every statement of a session asks for the same."""
    client = collation_charset(collations[0], flavor)
    codec = python_codec(client) if client else None
    if codec is not None:
        try:
            codec = codecs.lookup(codec).name  # "utf-8", which bytes.decode takes without a registry lookup
        except LookupError:
            pass
    found = _CHARSETS[collations, flavor] = codec, collation_charset(collations[1], flavor)
    return found


def _written_by_server(raw: bytes, in_transaction: bool) -> bool:
    """Whether a statement is a CREATE TABLE the server wrote itself for a CREATE … SELECT (see query_text)."""
    if raw.rstrip().endswith(_SERVER_WRITTEN_CTAS):
        return True
    return in_transaction and _CREATE_TABLE.match(raw) is not None


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
