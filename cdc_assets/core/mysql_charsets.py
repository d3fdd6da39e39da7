"""MySQL's latin1 as a Python codec.

MySQL's `latin1` is Windows cp1252, except that the five bytes cp1252 leaves undefined (0x81, 0x8D,
0x8F, 0x90, 0x9D) stand for the code points U+0081 ... U+009D, as the server itself converts them.
Python's strict cp1252 raises on those bytes and would stall capture for good. `MYSQL_LATIN1` is a codec
with MySQL's mapping, which the binlog reader uses for `latin1` columns.
"""

import codecs

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
