"""Compressed binlog events, turned back into the events they stand for, so capture reads them as if they had been
written plainly.

MySQL (8.0.20+, `binlog_transaction_compression=ON`) writes a transaction's events after its GTID event as one
TRANSACTION_PAYLOAD event: a few header fields, then the events zstd-compressed, each with its common header and
without a checksum, `log_pos` 0. The transaction ends where the payload event ends: that is its boundary, so the
inner events are given the payload's end position and size (`expand_payloads`).

MariaDB (`log_bin_compress=ON`) compresses the statement of a query event and the row data of a row event (when
longer than `log_bin_compress_min_len`) with zlib, each under an event type of its own (165 to 171). The compressed
part starts with a header byte (bit 7 set; bits 4-6 the algorithm, 0 for zlib; bits 0-2 the bytes of the
uncompressed length that follows, big-endian); everything before it is as in the plain event.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterable, Iterator

import zstandard

from cdc_assets.capture.binlog.events import (
    DELETE_ROWS_V1,
    DELETE_ROWS_V2,
    QUERY,
    ROWS_V2,
    TRANSACTION_PAYLOAD,
    UPDATE_ROWS_V1,
    UPDATE_ROWS_V2,
    WRITE_ROWS_V1,
    WRITE_ROWS_V2,
    query_start,
)
from cdc_assets.capture.binlog.protocol import HEADER, HEADER_SIZE, RawEvent
from cdc_assets.core.errors import CdcUserError

# TRANSACTION_PAYLOAD header fields (MySQL's Transaction_payload_event): type, length and value as length-encoded
# integers, up to the end mark; then the payload.
_PAYLOAD_END_MARK, _PAYLOAD_SIZE, _COMPRESSION_TYPE, _UNCOMPRESSED_SIZE = 0, 1, 2, 3
_ZSTD, _NONE = 0, 255

# MariaDB's compressed events and the plain ones they stand for.
MARIADB_QUERY_COMPRESSED = 165
MARIADB_UNCOMPRESSED_TYPE = {
    MARIADB_QUERY_COMPRESSED: QUERY,
    166: WRITE_ROWS_V1, 167: UPDATE_ROWS_V1, 168: DELETE_ROWS_V1,
    169: WRITE_ROWS_V2, 170: UPDATE_ROWS_V2, 171: DELETE_ROWS_V2,
}  # fmt: skip
MARIADB_COMPRESSED_ROWS = frozenset(t for t, plain in MARIADB_UNCOMPRESSED_TYPE.items() if plain != QUERY)
_MARIADB_COMPRESSED_FLAG, _MARIADB_ZLIB = 0x80, 0


def _packed_int(body: bytes, pos: int) -> tuple[int, int]:
    first = body[pos]
    if first < 251:
        return first, pos + 1
    size = {252: 2, 253: 3, 254: 8}.get(first)
    if size is None:
        raise ValueError(f"bad length-encoded integer 0x{first:02x}")
    return int.from_bytes(body[pos + 1 : pos + 1 + size], "little"), pos + 1 + size


def payload_fields(body: bytes) -> tuple[dict[int, int], int]:
    """A TRANSACTION_PAYLOAD event's header fields by type, and where its payload starts."""
    fields: dict[int, int] = {}
    pos = 0
    while pos < len(body):
        field_type, pos = _packed_int(body, pos)
        if field_type == _PAYLOAD_END_MARK:
            break
        length, pos = _packed_int(body, pos)
        fields[field_type] = _packed_int(body, pos)[0]
        pos += length
    return fields, pos


def payload_events(body: bytes) -> Iterator[RawEvent]:
    """The events a TRANSACTION_PAYLOAD event's body holds, in order, decompressed as they are read (a transaction of
    any size takes the memory of its compressed payload and one event). Their `log_pos` and `size` are 0 and their
    length: the caller places them (`expand_payloads`)."""
    fields, start = payload_fields(body)
    compression = fields.get(_COMPRESSION_TYPE, _NONE)
    if compression == _ZSTD:
        stream: io.RawIOBase | io.BufferedIOBase = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body[start:]))
    elif compression == _NONE:
        stream = io.BytesIO(body[start:])
    else:
        raise CdcUserError(
            f"The source's binlog holds a transaction compressed with algorithm {compression}, which the binlog "
            "reader does not know (it reads zstd): report it, with the server's version."
        )
    with stream:
        while header := _read_exactly(stream, HEADER_SIZE):
            timestamp, event_type, origin, size, _, flags = HEADER.unpack(header)
            yield RawEvent(event_type, timestamp, origin, 0, flags, size, _read_exactly(stream, size - HEADER_SIZE))


def _read_exactly(stream: io.RawIOBase | io.BufferedIOBase, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            if data:
                raise CdcUserError(
                    "A compressed transaction in the source's binlog ends in the middle of an event (a corrupt "
                    "binlog): check it with mysqlbinlog."
                )
            break
        data += chunk
    return data


def expand_payloads(events: Iterable[RawEvent]) -> Iterator[RawEvent]:
    """The binlog's events with each TRANSACTION_PAYLOAD replaced by the events it holds, each placed where the
    payload is (its end and size), so the transaction ends where the payload ends."""
    for event in events:
        if event.type != TRANSACTION_PAYLOAD:
            yield event
            continue
        for inner in payload_events(event.body):
            yield inner._replace(log_pos=event.log_pos, size=event.size)


def _mariadb_decompress(data: bytes) -> bytes:
    header = data[0]
    algorithm = (header >> 4) & 0x07
    if not header & _MARIADB_COMPRESSED_FLAG or algorithm != _MARIADB_ZLIB:
        raise CdcUserError(
            f"The source's binlog holds an event compressed in a way the binlog reader does not know (header "
            f"0x{header:02x}; it reads MariaDB's zlib): report it, with the server's version."
        )
    length_bytes = header & 0x07
    length = int.from_bytes(data[1 : 1 + length_bytes], "big")
    plain = zlib.decompress(data[1 + length_bytes :], bufsize=max(length, 1))
    if len(plain) != length:
        raise CdcUserError(
            "A compressed event in the source's binlog does not decompress to its stated length (a corrupt binlog): "
            "check it with mariadb-binlog."
        )
    return plain


def mariadb_decompressed(event_type: int, body: bytes, post_header_length: int) -> tuple[int, bytes]:
    """The plain event type and body a MariaDB compressed query or row event stands for. `post_header_length` is the
    plain event's (the format description gives the compressed types the same)."""
    plain_type = MARIADB_UNCOMPRESSED_TYPE[event_type]
    if plain_type == QUERY:
        start = query_start(body, post_header_length)
    else:
        start = post_header_length
        if plain_type in ROWS_V2:  # the extra row info's length counts its own two bytes
            start += int.from_bytes(body[start - 2 : start], "little") - 2
        width, start = _packed_int(body, start)
        bitmaps = 2 if plain_type in (UPDATE_ROWS_V1, UPDATE_ROWS_V2) else 1
        start += bitmaps * ((width + 7) // 8)
    return plain_type, body[:start] + _mariadb_decompress(body[start:])
