"""MySQL's latin1 as a Python codec.

MySQL's `latin1` is Windows cp1252, except that the five bytes cp1252 leaves undefined (0x81, 0x8D,
0x8F, 0x90, 0x9D) stand for the code points U+0081 ... U+009D, as the server itself converts them.
Python's strict cp1252 raises on those bytes and would stall capture for good. `MYSQL_LATIN1` is a codec
with MySQL's mapping, which the binlog reader uses for `latin1` columns.
"""

import codecs
from collections.abc import Callable

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


# -- every other charset, decoded to the text the server returns ---------------------------------------------------
# The common ones stay Python's own codecs on capture's hot path (utf8mb4, utf8mb3, ascii, latin1 above); the fixed
# width Unicode ones are big-endian in MySQL (Python's "utf-16" would read them little-endian); every other
# single-byte charset is MySQL's own table of 256 characters, asked of the server once per process; a multi-byte one
# Python has no codec for (eucjpms) is converted by the server per distinct value, cached.
UNICODE_CODECS = {"utf16": "utf-16-be", "ucs2": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be"}
SINGLE_BYTE = frozenset(
    {
        "armscii8", "cp1250", "cp1251", "cp1256", "cp1257", "cp850", "cp852", "cp866", "dec8", "geostd8", "greek",
        "hebrew", "hp8", "keybcs2", "koi8r", "koi8u", "latin2", "latin5", "latin7", "macce", "macroman", "swe7",
        "tis620",
    }
)  # fmt: skip
SERVER_CONVERTED = frozenset({"eucjpms"})
_PREFIX = "cdc_mysql_"
# MariaDB 10.10+'s UCA-14.0.0 collations (utf8mb4_uca1400_ai_ci and the rest; 11.5 makes it utf8mb4's default) are
# numbered from 2048, a block of 256 per charset in this order (MDEV-27009), which python-mysql-replication does not
# know: it names every one of them utf8, so a ucs2 one was decoded as UTF-8.
MARIADB_UCA1400_FIRST_ID, MARIADB_UCA1400_BLOCK = 2048, 256
MARIADB_UCA1400_CHARSETS = ("utf8mb3", "utf8mb4", "ucs2", "utf16", "utf32")

# What the server says: a charset's 256 characters (single-byte), or one value's text. Set by capture (the edge that
# has a connection), so that this module stays free of I/O.
TableFetcher = Callable[[str], str]
ValueFetcher = Callable[[str, bytes], str]
_fetchers: dict[str, Callable[..., str]] = {}
_tables: dict[str, str] = {}
_encoding_tables: dict[str, object] = {}  # codecs.charmap_build of each server table, to encode text to it
_values: dict[tuple[str, bytes], str] = {}


def mariadb_uca1400_charset(collation_id: int) -> str | None:
    """The charset of a MariaDB UCA-14.0.0 collation number (as the binlog's table map gives a column's), or None for
    a number outside their blocks."""
    block = (collation_id - MARIADB_UCA1400_FIRST_ID) // MARIADB_UCA1400_BLOCK
    return MARIADB_UCA1400_CHARSETS[block] if 0 <= block < len(MARIADB_UCA1400_CHARSETS) else None


def collation_charset(collation_id: int, flavor: str) -> str | None:
    """The charset (MySQL's name: latin1, utf8mb3, utf8mb4, …) of a collation number as a `flavor` server numbers it
    (a query event's character_set_client, a table map's column), or None for a number no one here knows."""
    from pymysqlreplication.constants.CHARSET import charset_by_id

    known = charset_by_id(str(collation_id), flavor)
    if known is not None:
        return known.name
    return mariadb_uca1400_charset(collation_id) if flavor == "mariadb" else None


# The charsets that hold every character, and those that hold the Basic Multilingual Plane only (a character beyond
# it is 4 bytes of UTF-8, a surrogate pair of UTF-16). `utf8` is the name python-mysql-replication gives utf8mb4 too
# (a table map's columns): it holds every character here; DDL's `utf8` (utf8mb3) is resolved by its reader.
_EVERY_CHARACTER = frozenset({"utf8mb4", "utf8", "utf16", "utf16le", "utf32"})
_BMP_ONLY = frozenset({"utf8mb3", "ucs2"})


def stored_text(text: str, charset: str) -> str:
    """`text` as the server stores it in `charset` (MySQL's name): each character the charset cannot hold becomes
    '?', as the server converts a string literal to a column's charset (an ENUM's members, a MODIFY's values).
    Raises LookupError for a charset whose characters this process does not know (binary among them)."""
    if charset in _EVERY_CHARACTER or text.isascii() and charset != "swe7":
        return text  # every charset but swe7 (its own letters at [ ] { } and others) holds ASCII as it is
    if charset in _BMP_ONLY:
        return "".join(c if ord(c) <= 0xFFFF else "?" for c in text)
    codec = python_codec(charset) if charset != "binary" else None
    if codec is None:
        raise LookupError(f"no text of the {charset} charset here")
    try:
        return text.encode(codec, "replace").decode(codec)
    except (UnicodeError, LookupError) as exc:
        raise LookupError(f"no text of the {charset} charset here ({exc})") from exc


def use_server(table: TableFetcher, value: ValueFetcher) -> None:
    """Where the charsets Python has no exact codec for are converted (capture sets its source's)."""
    _fetchers["table"], _fetchers["value"] = table, value


def codec_for(charset: str) -> str | None:
    """The Python codec that decodes `charset` as the server does, or None (a charset not named here)."""
    if charset in UNICODE_CODECS:
        return UNICODE_CODECS[charset]
    if charset in SINGLE_BYTE or charset in SERVER_CONVERTED:
        return _PREFIX + charset
    return None


def _server_table(charset: str) -> str:
    if charset not in _tables:
        fetch = _fetchers.get("table")
        if fetch is None:
            raise LookupError(f"the {charset} charset needs the source server to be decoded, and none is set")
        table = fetch(charset)
        if len(table) != 256:
            raise ValueError(f"the server's {charset} table has {len(table)} characters, not 256")
        _tables[charset] = table
    return _tables[charset]


def _server_value(charset: str, data: bytes) -> str:
    key = (charset, bytes(data))
    if key not in _values:
        fetch = _fetchers.get("value")
        if fetch is None:
            raise LookupError(f"the {charset} charset needs the source server to be decoded, and none is set")
        if len(_values) > 100_000:  # a bound, not a working set: rare charsets hold few distinct values
            _values.clear()
        _values[key] = fetch(charset, key[1])
    return _values[key]


def _search_server(name: str) -> codecs.CodecInfo | None:
    if not name.startswith(_PREFIX):
        return None
    charset = name[len(_PREFIX) :]

    def decode(data: bytes, errors: str = "strict") -> tuple[str, int]:
        if charset in SINGLE_BYTE:
            return codecs.charmap_decode(data, errors, _server_table(charset))
        return _server_value(charset, data), len(data)

    def encode(text: str, errors: str = "strict") -> tuple[bytes, int]:
        if charset not in SINGLE_BYTE:
            raise UnicodeError(f"text is never encoded to {charset} here")
        if charset not in _encoding_tables:
            _encoding_tables[charset] = codecs.charmap_build(_server_table(charset))
        return codecs.charmap_encode(text, errors, _encoding_tables[charset])

    return codecs.CodecInfo(name=name, encode=encode, decode=decode)


codecs.register(_search_server)


def python_codec(encoding: str | None) -> str | None:
    """The Python codec for a column's charset as python-mysql-replication names it (`utf8`, `cp1252`, ...) or as
    DDL and information_schema name it (`utf8mb4`, `latin1`), with MySQL's own latin1; None when Python has no such
    codec (values stay bytes)."""
    from pymysql.charset import charset_by_name

    if encoding is None:
        return "utf-8"
    if encoding in ("latin1", "cp1252"):
        return MYSQL_LATIN1
    if codec_for(encoding) is not None:
        return codec_for(encoding)
    known = charset_by_name(encoding)
    name = known.encoding if known else encoding
    try:
        codecs.lookup(name)
    except LookupError:
        return None
    return name
