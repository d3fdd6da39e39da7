"""MySQL's latin1 for python-mysql-replication.

MySQL's `latin1` is Windows cp1252, except that the five bytes cp1252 leaves undefined (0x81, 0x8D,
0x8F, 0x90, 0x9D) stand for the code points U+0081 ... U+009D, as the server itself converts them.
python-mysql-replication decodes `latin1` columns with Python's strict cp1252, which raises on those
bytes and would stall capture for good. `MYSQL_LATIN1` is a codec with MySQL's mapping, and
`install` makes the row decoder use it for `latin1` columns.
"""

import codecs

from pymysqlreplication.row_event import RowsEvent

MYSQL_LATIN1 = "cdc_mysql_latin1"


def _decoding_table() -> str:
    chars = []
    for byte in range(256):
        try:
            chars.append(bytes([byte]).decode("cp1252"))
        except UnicodeDecodeError:
            chars.append(chr(byte))
    return "".join(chars)


_DECODING_TABLE = _decoding_table()
_ENCODING_TABLE = codecs.charmap_build(_DECODING_TABLE)


def _search(name: str) -> codecs.CodecInfo | None:
    if name != MYSQL_LATIN1:
        return None
    return codecs.CodecInfo(
        name=MYSQL_LATIN1,
        encode=lambda text, errors="strict": codecs.charmap_encode(text, errors, _ENCODING_TABLE),
        decode=lambda data, errors="strict": codecs.charmap_decode(data, errors, _DECODING_TABLE),
    )


codecs.register(_search)

_original_charset_to_encoding = RowsEvent.charset_to_encoding


def _charset_to_encoding(name: str) -> str:
    # Columns arrive named by their Python encoding already: MySQL's latin1 as "cp1252".
    return MYSQL_LATIN1 if name in ("latin1", "cp1252") else _original_charset_to_encoding(name)


def install() -> None:
    """Decode `latin1` row values as MySQL does (idempotent)."""
    RowsEvent.charset_to_encoding = staticmethod(_charset_to_encoding)  # type: ignore[method-assign]
