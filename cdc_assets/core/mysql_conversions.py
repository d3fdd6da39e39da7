"""How MySQL and MariaDB convert a column's values when ALTER TABLE … MODIFY / CHANGE gives it another type.

The server copies every row through the new column's store function, fed by the old column's value as the
number, decimal, double, text or time the server's copy routine for that pair of types asks for (field_conv.cc:
an ENUM gives its index to a number and its member's text to a text; a BIT gives its bytes to a BLOB and its
number to a VARCHAR; a text is parsed as a number, a date or a time). MySQL and MariaDB choose some routines
differently (MySQL sends a number to an ENUM, a SET or a temporal column as its text, MariaDB as a number), and
MySQL rounds fractional seconds where MariaDB truncates them; each flavour is followed.

These are the non-strict rules: strict mode refuses an ALTER where one value would be cut, clamped or made zero,
so any value of an ALTER the server ran converts the same in both modes. Values are the lakehouse's on both sides
(a column's Delta type as Python values: a zero date is None, a TIME its text, a BIT a signed 64-bit number).
`InexactConversion` is raised where the lakehouse cannot know what the server wrote: a zero date is None in the
lakehouse, like NULL, and the two become different values in a text, number or TIME column.

The session time zone of the ALTER is taken as UTC (TIMESTAMP to and from other types), and a TIME becomes a
date on `today` (the day of the ALTER, UTC), as CURRENT_DATE does.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any

from cdc_assets.core.mysql_charsets import python_codec, stored_text
from cdc_assets.core.mysql_types import INTEGER_TYPES, ColumnSpec, bit_to_long, format_time

MARIADB, MYSQL = "mariadb", "mysql"

TEXTS = ("char", "varchar", "text")
BINARIES = ("binary", "varbinary", "blob")
DATES = ("date", "datetime", "timestamp")
NUMBERS = (*INTEGER_TYPES, "decimal", "float", "double", "bit", "year")
# the types whose conversions this module knows; others (GEOMETRY, VECTOR, UUID, …) are cast as before
CONVERTED = frozenset((*NUMBERS, *TEXTS, *BINARIES, *DATES, "time", "enum", "set", "json"))

INT64_MIN, INT64_MAX, UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
FLT_MAX = 3.4028234663852886e38
DBL_MAX = 1.7976931348623157e308
TIME_MAX_MICROS = ((838 * 60 + 59) * 60 + 59) * 1_000_000
_TIMESTAMP_MIN = dt.datetime(1970, 1, 1, 0, 0, 1)
_TIMESTAMP_MAX = dt.datetime(2038, 1, 19, 3, 14, 7, 999999)
_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
_EXACT = Context(prec=200, Emax=999999, Emin=-999999)


class InexactConversion(ValueError):
    """A value whose converted form the lakehouse cannot know (the message says why)."""


@dataclass(frozen=True)
class Conversion:
    """One column's MODIFY: its old and new types, the server that ran it and the day it ran."""

    old: ColumnSpec
    new: ColumnSpec
    flavor: str = MARIADB
    today: dt.date = dt.date(1970, 1, 1)

    @property
    def mysql(self) -> bool:
        return self.flavor == MYSQL

    def converts(self) -> bool:
        """Whether this module knows the conversion (else the caller keeps its plain cast)."""
        return self.old.type in CONVERTED and self.new.type in CONVERTED

    def values(self, values: list[Any]) -> list[Any]:
        """`values` (the old column's, in the lakehouse's form) as the new column holds them after the ALTER."""
        if self.old.type in DATES and self.new.type not in DATES and any(v is None for v in values):
            raise InexactConversion(
                f"a zero date ('0000-00-00') and NULL are both NULL in the lakehouse, and the server turns only the "
                f"zero date into a {self.new.type.upper()} value"
            )
        store = _STORES[self.new.type]
        return [None if v is None else store(self, v) for v in values]


# -- what the old column gives: its text, number, decimal, double or time ---------------------------------------


def _texts(old: ColumnSpec) -> bool:
    """Whether the old column is read as text by the store functions that parse (a JSON document is MariaDB's text,
    and MySQL's printed text)."""
    return old.type in (*TEXTS, "json") or old.type in BINARIES


def _bit_bytes(conversion: Conversion, value: int) -> bytes:
    width = conversion.old.length
    if width is None:
        raise InexactConversion("the BIT column's width is not known")
    return (value & UINT64_MAX).to_bytes(8, "big")[-((width + 7) // 8) :]


def text_of(conversion: Conversion, value: Any) -> str | bytes:
    """The old value as the server prints it (val_str): bytes for binary types and BIT."""
    old = conversion.old
    t = old.type
    if t in INTEGER_TYPES:
        return str(int(value))
    if t == "year":
        return f"{int(value):04d}"
    if t == "decimal":
        return value if isinstance(value, str) else format(value, "f")
    if t in ("float", "double"):
        return my_gcvt(value, single=t == "float")
    if t == "bit":
        return _bit_bytes(conversion, value)
    if t == "date":
        return value.isoformat()
    if t in ("datetime", "timestamp"):
        return _datetime_text(_naive(value), old.fsp)
    if isinstance(value, bytes | str):  # texts, ENUM, SET, JSON, TIME, binary types
        return value
    raise InexactConversion(f"no text of a {t} value")


def _naive(value: dt.datetime) -> dt.datetime:
    """A DATETIME as it is, a TIMESTAMP in UTC (the session time zone this module takes)."""
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value


def _datetime_text(moment: dt.datetime, fsp: int) -> str:
    m = moment
    text = f"{m.year:04d}-{m.month:02d}-{m.day:02d} {m.hour:02d}:{m.minute:02d}:{m.second:02d}"
    return text + (f".{m.microsecond:06d}"[: fsp + 1] if fsp else "")


def _as_str(value: str | bytes) -> str:
    """A text, or bytes read as the server's number and date parsers read them (ASCII digits, one byte each)."""
    return value.decode("latin-1") if isinstance(value, bytes) else value


def members(spec: ColumnSpec) -> tuple[str, ...]:
    """An ENUM's or SET's members in order. A binlog table map lists an ENUM's with the empty error value (index 0)
    first, as python-mysql-replication did; a DDL or information_schema does not."""
    return spec.members[1:] if spec.type == "enum" and spec.members[:1] == ("",) else spec.members


def _index(old: ColumnSpec, value: str) -> int:
    """An ENUM value's index (0: the empty error value)."""
    declared = members(old)
    if value == "" and "" in declared:
        raise InexactConversion("the ENUM has an empty member, which the lakehouse cannot tell from its error value")
    return declared.index(value) + 1 if value in declared else 0


def _bitmask(old: ColumnSpec, value: str) -> int:
    chosen = set(value.split(",")) if value else set()
    return sum(1 << i for i, member in enumerate(members(old)) if member in chosen)


def int_of(conversion: Conversion, value: Any, signed_text: bool = True) -> int:
    """The old value as a 64-bit number (val_int): fractions rounded as the server rounds them, texts parsed."""
    old, t = conversion.old, conversion.old.type
    if t in INTEGER_TYPES or t == "year":
        return int(value)
    if t == "bit":
        return value & UINT64_MAX
    if t == "enum":
        return _index(old, value)
    if t == "set":
        return _bitmask(old, value)
    if t == "decimal":
        return _clamp(int(Decimal(value).to_integral_value(ROUND_HALF_UP)), INT64_MIN, INT64_MAX)
    if t in ("float", "double"):
        return _clamp(_rint(value), INT64_MIN, INT64_MAX)
    if t in DATES or t == "time":  # MySQL rounds to whole seconds, MariaDB cuts the fraction
        return int(_temporal_number(conversion, value, rounded=conversion.mysql))
    if t == "json" and conversion.mysql:
        return _json_int(value)
    return leading_integer(_as_str(value)) if signed_text else rounded_integer(_as_str(value), unsigned=False)


def _rint(value: float) -> int:
    if math.isnan(value):
        return 0
    if math.isinf(value):
        return INT64_MAX if value > 0 else INT64_MIN
    return int(round(value))  # Python rounds half to even, as rint does


def real_of(conversion: Conversion, value: Any) -> float:
    """The old value as a double (val_real)."""
    t = conversion.old.type
    if t in ("float", "double"):
        return float(value)
    if t == "bit":
        return float(value & UINT64_MAX) if conversion.mysql else float(value)
    if t == "decimal":
        return float(Decimal(value))
    if t in DATES or t == "time":
        return float(_temporal_number(conversion, value, rounded=False))
    if _texts(conversion.old):
        return leading_double(_as_str(value))
    return float(int_of(conversion, value))


def decimal_of(conversion: Conversion, value: Any) -> Decimal:
    """The old value as an exact decimal (val_decimal)."""
    t = conversion.old.type
    if t == "decimal":
        return Decimal(value)
    if t in ("float", "double"):
        return Decimal(repr(float(value))) if math.isfinite(value) else Decimal(0)  # double2decimal: shortest digits
    if t in DATES or t == "time":
        return _temporal_number(conversion, value, rounded=False)
    if t == "json" and conversion.mysql:
        return _json_decimal(value)
    if _texts(conversion.old):
        return leading_decimal(_as_str(value))
    return Decimal(int_of(conversion, value))


def _temporal_number(conversion: Conversion, value: Any, rounded: bool) -> Decimal:
    """A date as YYYYMMDD, a DATETIME as YYYYMMDDhhmmss.ffffff, a TIME as ±hhmmss.ffffff; `rounded`: to whole
    seconds as MySQL's val_int rounds them."""
    t = conversion.old.type
    if t == "date":
        return Decimal(value.year * 10000 + value.month * 100 + value.day)
    if t == "time":
        micros = time_micros(value)
        if rounded:
            micros = _round_micros(micros, 0)
        sign, micros = (-1 if micros < 0 else 1), abs(micros)
        seconds, fraction = divmod(micros, 1_000_000)
        hours, rest = divmod(seconds, 3600)
        number = Decimal(hours * 10000 + rest // 60 * 100 + rest % 60) + Decimal(fraction).scaleb(-6)
        return number * sign
    moment = _naive(value)
    if rounded and moment.microsecond >= 500_000:
        later = _add_micros(moment, 1_000_000 - moment.microsecond)
        moment = later if later is not None else moment.replace(hour=0, minute=0, second=0)  # MySQL's overflow
    whole = (((moment.year * 100 + moment.month) * 100 + moment.day) * 100 + moment.hour) * 10000
    whole += moment.minute * 100 + moment.second
    return Decimal(whole) if rounded else Decimal(whole) + Decimal(moment.microsecond).scaleb(-6)


def _add_micros(moment: dt.datetime, micros: int) -> dt.datetime | None:
    try:
        return moment + dt.timedelta(microseconds=micros)
    except OverflowError:
        return None


# -- parsing texts as the server parses them ---------------------------------------------------------------------

_LEADING_INT = re.compile(r"[ \t\n\r\f\v]*([+-]?)(\d+)")
_NUMBER = re.compile(r"[ \t\n\r\f\v]*([+-]?)(\d*)(?:\.(\d*))?")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
_LEADING_DOUBLE = re.compile(r"[ \t\n\r\f\v]*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def leading_integer(text: str) -> int:
    """A text's leading integer, as MariaDB's val_int of a string reads it (digits only: '1e3' is 1, '-3.5' is
    -3), clamped to 64 bits."""
    match = _LEADING_INT.match(text)
    if not match:
        return 0
    return _clamp(int(match.group(1) + match.group(2)), INT64_MIN, INT64_MAX)


def _leading_number(text: str) -> Decimal | None:
    """A text's leading number with its fraction and exponent, exactly (None: it starts with none)."""
    match = _NUMBER.match(text)
    if not match or not (match.group(2) or match.group(3)):
        return None
    number = Decimal(f"{match.group(1)}{match.group(2) or '0'}.{match.group(3) or '0'}")
    exponent = _EXPONENT.match(text, match.end())
    if exponent:
        number = number.scaleb(max(-9999, min(9999, int(exponent.group(1)))), _EXACT)
    return number


def rounded_integer(text: str, unsigned: bool) -> int:
    """A text's leading number rounded half away from zero and clamped to 64 bits (strntoull10rnd): '1e3' is 1000,
    '-3.5' is -4."""
    number = _leading_number(text)
    if number is None:
        return 0
    whole = int(number.to_integral_value(ROUND_HALF_UP)) if number.is_finite() else 0
    return _clamp(whole, 0, UINT64_MAX) if unsigned else _clamp(whole, INT64_MIN, INT64_MAX)


def leading_decimal(text: str) -> Decimal:
    number = _leading_number(text)
    return Decimal(0) if number is None else number


def leading_double(text: str) -> float:
    match = _LEADING_DOUBLE.match(text)
    if not match:
        return 0.0
    value = float(match.group().strip())
    return max(-DBL_MAX, min(DBL_MAX, value))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


# -- numbers: integers, YEAR, BIT, DECIMAL, FLOAT, DOUBLE ----------------------------------------------------------


def _int_range(spec: ColumnSpec) -> tuple[int, int]:
    bits = _BITS[spec.type]
    return (0, (1 << bits) - 1) if spec.unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def _to_integer(conversion: Conversion, value: Any) -> int | Decimal:
    new = conversion.new
    low, high = _int_range(new)
    if _texts(conversion.old) and conversion.mysql:  # MySQL stores the text; MariaDB takes its leading integer
        number = rounded_integer(_as_str(text_of(conversion, value)), unsigned=new.unsigned)
    else:
        number = int_of(conversion, value)
    result = _clamp(number, low, high)
    return Decimal(result) if new.type == "bigint" and new.unsigned else result


def year_of_number(number: int) -> int:
    """A number as a YEAR stores it: 0 stays 0, 1-69 and 70-99 are 2001-2069 and 1970-1999, 1901-2155 stay, the
    rest are out of range (0)."""
    if number < 0 or 100 <= number <= 1900 or number > 2155:
        return 0
    if 0 < number < 70:
        return number + 2000
    if 70 <= number < 100:
        return number + 1900
    return number


def _year_of_text(text: str) -> int:
    number = _leading_number(text)
    if number is None:
        return 0
    whole = int(number.to_integral_value(ROUND_HALF_UP)) if number.is_finite() else -1
    if whole < 0 or 100 <= whole <= 1900 or whole > 2155:
        return 0
    if whole == 0 and len(text.encode()) == 4:  # '0000' is the year 0; '0' and '00' are 2000
        return 0
    return whole + 2000 if whole < 70 else whole + 1900 if whole < 100 else whole


def _to_year(conversion: Conversion, value: Any) -> int:
    t = conversion.old.type
    if _texts(conversion.old):
        return _year_of_text(_as_str(text_of(conversion, value)))
    if t in DATES and not conversion.mysql:  # MariaDB takes the date's year
        year = _naive(value).year if t != "date" else value.year
        return year if 1901 <= year <= 2155 else 0
    return year_of_number(int_of(conversion, value))


def _to_bit(conversion: Conversion, value: Any) -> int:
    old = conversion.old
    if old.type == "decimal" and not conversion.mysql:  # MariaDB stores a decimal as an unsigned number
        number = _clamp(int(Decimal(value).to_integral_value(ROUND_HALF_UP)), 0, UINT64_MAX)
    else:
        number = int_of(conversion, value)
    unsigned = number & UINT64_MAX
    width = conversion.new.length or 64
    if width < 64 and unsigned >= 1 << width:
        unsigned = (1 << width) - 1
    return bit_to_long(unsigned)


def _to_decimal(conversion: Conversion, value: Any) -> Decimal | str:
    new = conversion.new
    scale, precision = new.scale or 0, new.precision or 10
    number = decimal_of(conversion, value)
    if not number.is_finite():
        number = Decimal(0)
    if new.unsigned and number < 0:
        number = Decimal(0)
    largest = _EXACT.subtract(_EXACT.power(10, precision - scale), Decimal(1).scaleb(-scale))
    number = max(-largest, min(largest, number.quantize(Decimal(1).scaleb(-scale), ROUND_HALF_UP, _EXACT)
                               if abs(number) <= largest + 1 else number))  # fmt: skip
    number = number if number else abs(number)  # no negative zero
    return format(number, "f") if precision > 38 else number


def _to_real(conversion: Conversion, value: Any) -> float:
    number = real_of(conversion, value)
    if conversion.new.unsigned and number < 0:
        number = 0.0
    if conversion.new.type == "float":
        number = _float32(max(-FLT_MAX, min(FLT_MAX, number)))
    elif conversion.mysql and _texts(conversion.old):
        return number  # MySQL's DOUBLE keeps the negative zero of a text's '-0.0'
    return number if number else 0.0  # no negative zero


def _float32(value: float) -> float:
    import numpy as np

    return float(np.float32(value))


# -- texts and bytes -----------------------------------------------------------------------------------------------


def _codec(charset: str | None) -> str:
    codec = python_codec(None if charset in (None, "binary") else charset)
    if codec is None:
        raise InexactConversion(f"no codec here for the {charset} charset")
    return codec


def _decoded(conversion: Conversion, data: bytes, charset: str | None) -> str:
    """Bytes as a text of the new column's charset: MariaDB writes '?' for each byte that is no character of it,
    MySQL cuts the text at the first such byte."""
    codec = _codec(charset)
    try:
        return data.decode(codec)
    except UnicodeDecodeError:
        pass
    except UnicodeError as exc:
        raise InexactConversion(f"no text in the {charset} charset here ({exc})") from exc
    out, at = [], 0
    while at < len(data):
        try:
            out.append(data[at:].decode(codec))
            break
        except UnicodeDecodeError as exc:
            out.append(data[at : at + exc.start].decode(codec))
            if conversion.mysql:
                break
            out.append("?")
            at += exc.start + 1
    return "".join(out)


def _recoded_text(text: str, charset: str | None) -> str:
    """A text in another charset: characters it lacks become '?' (mysql_charsets.stored_text)."""
    try:
        return stored_text(text, "utf8mb4" if charset in (None, "binary") else charset)
    except LookupError as exc:
        raise InexactConversion(str(exc)) from exc


def _encoded(text: str, charset: str | None) -> bytes:
    """A text's bytes in its column's charset, as the server holds it."""
    try:
        return text.encode(_codec(charset))
    except UnicodeError as exc:
        raise InexactConversion(f"no bytes of a {charset} text here ({exc})") from exc


def _new_text(conversion: Conversion, value: Any) -> str:
    """The old value as a text of the new column (before CHAR's and the length's cuts)."""
    old, new = conversion.old, conversion.new
    if old.type == "bit" and new.type not in ("text", "json"):  # a BIT gives a VARCHAR its number
        return str(value & UINT64_MAX)
    if old.type == "json" and new.type == "json" and conversion.mysql:
        return value
    printed = text_of(conversion, value)
    if isinstance(printed, bytes):
        return _decoded(conversion, printed, new.charset)
    source_charset = "utf8mb4" if old.type == "json" else old.charset
    if old.type in (*TEXTS, "enum", "set", "json") and source_charset != new.charset and new.type != "json":
        return _recoded_text(printed, new.charset)
    return printed


def _to_text(conversion: Conversion, value: Any) -> str:
    new = conversion.new
    text = _new_text(conversion, value)
    if new.type == "char":
        text = text.rstrip(" ")  # a CHAR reads back without its trailing spaces
    if new.length is not None and new.type in ("char", "varchar"):
        text = text[: new.length]
    return text.rstrip(" ") if new.type == "char" else text


def _to_binary(conversion: Conversion, value: Any) -> bytes:
    old, new = conversion.old, conversion.new
    if old.type == "bit" and new.type != "blob":
        data = str(value & UINT64_MAX).encode()
    else:
        printed = text_of(conversion, value)
        data = printed if isinstance(printed, bytes) else _encoded(printed, old.charset if old.type in (*TEXTS, "enum", "set") else None)
    if new.length is not None and new.type in ("binary", "varbinary"):
        data = data[: new.length]
    return data.ljust(new.length or 0, b"\0") if new.type == "binary" else data


def _collation_key(text: str) -> str:
    """A text as a case- and accent-insensitive collation compares it (trailing spaces and NULs aside)."""
    decomposed = unicodedata.normalize("NFD", text.rstrip(" ").replace("\0", ""))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def member_position(declared: tuple[str, ...], text: str) -> int:
    """The 1-based position of the ENUM/SET member `text` names as the server's store finds it (0: none): trailing
    spaces aside, the member spelled so, else the one equal to it but for letter case, else the one equal but for case
    and accents (as a case- and accent-insensitive collation finds it). Two members equal to it one of those ways
    (a collation that tells them apart) leave the one the server took unknown: InexactConversion."""
    text = text.rstrip(" ")
    if text in declared:
        return declared.index(text) + 1
    for key in (str.casefold, _collation_key):
        wanted = key(text)
        found = [i for i, member in enumerate(declared) if key(member) == wanted]
        if len(found) > 1:
            raise InexactConversion(f"{text!r} is alike members {', '.join(repr(declared[i]) for i in found)}")
        if found:
            return found[0] + 1
    return 0


_UNSIGNED_TEXT = re.compile(r"[ \t\n\r\f\v]*([+-]?)(\d+)")


def _whole_number(text: str) -> int | None:
    """A text that is one integer and nothing else (my_strntoull: a '-' wraps), else None."""
    match = _UNSIGNED_TEXT.fullmatch(text)
    if not match:
        return None
    number = int(match.group(2))
    if number > UINT64_MAX:
        return None
    return (-number) & UINT64_MAX if match.group(1) == "-" else number


def _number_path(conversion: Conversion) -> bool:
    """Whether an ENUM or SET is given the old value as a number (else as its text)."""
    t = conversion.old.type
    if t == "bit":
        return True
    return not conversion.mysql and t in (*NUMBERS, "year")


def _member_text(conversion: Conversion, value: Any) -> str:
    printed = text_of(conversion, value)
    return _decoded(conversion, printed, conversion.new.charset) if isinstance(printed, bytes) else printed


def _to_enum(conversion: Conversion, value: Any) -> str:
    declared = members(conversion.new)
    if _number_path(conversion):
        index = int_of(conversion, value)
        return declared[index - 1] if 0 < index <= len(declared) else ""
    text = _member_text(conversion, value)
    found = member_position(declared, text)
    if not found and len(text.encode()) < 6:
        number = _whole_number(text)
        found = number if number is not None and number <= len(declared) else 0
    return declared[found - 1] if found else ""


def _to_set(conversion: Conversion, value: Any) -> str:
    declared = members(conversion.new)
    everything = (1 << len(declared)) - 1
    if _number_path(conversion):
        mask = int_of(conversion, value) & everything
    else:
        text = _member_text(conversion, value)
        mask = 0
        for part in text.split(",") if text else []:
            found = member_position(declared, part)
            mask |= 1 << (found - 1) if found else 0
        if not mask and text and len(text.encode()) < 22:
            number = _whole_number(text)
            if number is not None:
                mask = number if conversion.mysql and number <= everything else number & everything
                mask = 0 if conversion.mysql and number > everything else mask
    return ",".join(m for i, m in enumerate(declared) if mask >> i & 1)


# -- JSON ----------------------------------------------------------------------------------------------------------


def _to_json(conversion: Conversion, value: Any) -> str:
    old = conversion.old
    if not conversion.mysql:  # MariaDB's JSON is a LONGTEXT that holds valid documents
        printed = text_of(conversion, value)
        return _decoded(conversion, printed, "utf8mb4") if isinstance(printed, bytes) else printed
    if old.type == "json":
        return value
    if old.type in BINARIES or old.type == "bit" or old.type in DATES or old.type == "time":
        raise InexactConversion(f"MySQL makes no JSON document of a {old.type.upper()} value")
    return mysql_json_text(_as_str(text_of(conversion, value)))


def _json_document(text: str) -> Any:
    def number(literal: str) -> Any:
        value = int(literal)
        return value if INT64_MIN <= value <= UINT64_MAX else float(value)

    return json.loads(text, parse_int=number, object_pairs_hook=dict)


def mysql_json_text(text: str) -> str:
    """A JSON text as MySQL stores and prints it: keys in its order (shorter first, then by bytes), one space after
    ':' and ',', integers in full, other numbers as doubles."""
    return _json_printed(_json_document(text))


def _json_printed(node: Any) -> str:
    if isinstance(node, dict):
        keys = sorted(node, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{json_quoted(k)}: {_json_printed(node[k])}" for k in keys) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_json_printed(v) for v in node) + "]"
    if node is True or node is False or node is None:
        return json.dumps(node)
    if isinstance(node, int):
        return str(node)
    if isinstance(node, float):
        return json_double_text(node)
    return json_quoted(node)


# How MySQL's `double_quote` escapes a JSON string: the binlog's JSON decoder and the conversions both print with it.
JSON_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
JSON_ESCAPES = {c: f"\\u{c:04x}" for c in range(0x20)} | {
    0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", ord('"'): '\\"', ord("\\"): "\\\\",
}  # fmt: skip


def json_quoted(text: str) -> str:
    """A string as MySQL's `double_quote` prints it in a JSON document."""
    return f'"{text.translate(JSON_ESCAPES)}"' if JSON_NEEDS_ESCAPE.search(text) else f'"{text}"'


def _json_scalar(text: str) -> Any:
    try:
        return _json_document(text)
    except ValueError:
        return None


def _json_int(text: str) -> int:
    """A MySQL JSON document's val_int: a number rounded, a string's leading number, true 1, the rest 0."""
    node = _json_scalar(text)
    if node is True or node is False:
        return int(node)
    if isinstance(node, int):
        return _clamp(node, INT64_MIN, INT64_MAX)
    if isinstance(node, float):
        return _clamp(_rint(node), INT64_MIN, INT64_MAX)
    if isinstance(node, str):
        return rounded_integer(node, unsigned=False)
    return 0


def _json_decimal(text: str) -> Decimal:
    node = _json_scalar(text)
    if node is True or node is False:
        return Decimal(int(node))
    if isinstance(node, int):
        return Decimal(node)
    if isinstance(node, float):
        return Decimal(repr(node))
    if isinstance(node, str):
        return leading_decimal(node)
    return Decimal(0)


# -- dates and times -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Moment:
    """A DATETIME's fields as the server parsed them (not yet checked against the calendar)."""

    year: int
    month: int
    day: int
    hour: int = 0
    minute: int = 0
    second: int = 0
    micro: int = 0

    def datetime(self) -> dt.datetime | None:
        """As a calendar date and time, None for a zero or invalid date (which the lakehouse holds as NULL)."""
        try:
            return dt.datetime(self.year, self.month, self.day, self.hour, self.minute, self.second, self.micro)
        except ValueError:
            return None


def time_micros(text: str) -> int:
    """A TIME's canonical text ('-838:59:59.000000') as signed microseconds."""
    negative = text.startswith("-")
    clock, _, fraction = text.lstrip("-").partition(".")
    hours, minutes, seconds = (int(p) for p in clock.split(":"))
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + int((fraction or "0").ljust(6, "0")[:6])
    return -micros if negative else micros


def _round_micros(micros: int, fsp: int) -> int:
    """Microseconds rounded half away from zero to `fsp` fractional digits (MySQL)."""
    unit = 10 ** (6 - fsp)
    magnitude = (abs(micros) + unit // 2) // unit * unit
    return -magnitude if micros < 0 else magnitude


def _cut_micros(micros: int, fsp: int) -> int:
    """Microseconds cut to `fsp` fractional digits (MariaDB)."""
    unit = 10 ** (6 - fsp)
    magnitude = abs(micros) // unit * unit
    return -magnitude if micros < 0 else magnitude


def _time_text(conversion: Conversion, micros: int | None) -> str:
    """A TIME's text at the new column's digits: cut (MariaDB) or rounded (MySQL), within the server's range (MySQL
    stops at 838:59:59, MariaDB at 838:59:59.999999 cut to the digits)."""
    fsp = conversion.new.fsp
    largest = TIME_MAX_MICROS if conversion.mysql else TIME_MAX_MICROS + 999_999
    micros = max(-largest, min(largest, micros or 0))
    micros = _round_micros(micros, fsp) if conversion.mysql else _cut_micros(micros, fsp)
    micros = max(-largest, min(largest, micros))
    return format_time(dt.timedelta(microseconds=micros), fsp)


_SPACE = " \t\n\r\f\v"


def _digit(char: str) -> bool:
    return "0" <= char <= "9"


def _parse_datetime(text: str, datetime_only: bool = False, t_is_space: bool = False) -> tuple[str, _Moment | None]:
    """str_to_datetime: ("none", None) where the text holds no date at all (or, `datetime_only`, no DATETIME: parts
    delimited with no space between date and time, which MariaDB also takes a 'T' for), ("error", None) where its
    parts make no valid date, else ("date" or "datetime", its fields)."""
    text = text.lstrip(_SPACE)
    if not text or not _digit(text[0]):
        return "none", None
    pos = 0
    while pos < len(text) and (_digit(text[pos]) or text[pos] == "T"):
        pos += 1
    internal = pos == len(text) or text[pos] == "."  # digits alone: every field has its fixed width
    field = (4 if pos in (4, 8) or pos >= 14 else 2) if internal else 0
    date, lengths = [0] * 7, [0] * 7
    at = i = 0
    delimited = spaced = False
    while i < 7 and at < len(text) and _digit(text[at]):
        start = at
        at += 1
        scan = not internal and i != 6
        while at < len(text) and _digit(text[at]):
            if not scan:
                field -= 1
                if field == 0:
                    break
            at += 1
        value = int(text[start:at])
        if value > 999999:
            return "none", None
        date[i], lengths[i] = value, at - start
        field = 2
        if at == len(text):
            i += 1
            break
        if i == 2 and text[at] == "T":
            at += 1
            i += 1
            spaced = spaced or t_is_space
            continue
        if i == 5:
            if text[at] == ".":
                at += 1
                field = 6
            i += 1
            continue
        while at < len(text) and (text[at] in _SPACE or text[at] in _PUNCTUATION):
            spaced = spaced or text[at] in _SPACE
            delimited = True
            at += 1
        i += 1
    if delimited and not spaced and datetime_only:
        return "none", None
    if 0 < lengths[6] < 6:  # the fraction's digits count from the point
        date[6] *= 10 ** (6 - lengths[6])
    year_length = (4 if pos in (4, 8) or pos >= 14 else 2) if internal else lengths[0]
    if not year_length:
        return "error", None
    year, month, day, hour, minute, second, micro = date
    if year_length == 2 and any(date):
        year += 2000 if year < 70 else 1900
    if i < 3 or year > 9999 or month > 12 or day > 31 or hour > 23 or minute > 59 or second > 59:
        return "error", None
    return ("date" if i <= 3 else "datetime"), _Moment(year, month, day, hour, minute, second, micro)


_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def str_to_datetime(text: str) -> _Moment | None:
    """A text as the server's str_to_datetime reads it: 'YYYY-MM-DD hh:mm:ss.ffffff' with any punctuation between
    the parts, or digits alone (YYMMDD, YYYYMMDD, YYMMDDhhmmss, YYYYMMDDhhmmss); None where it finds no date."""
    return _parse_datetime(text)[1]


def number_to_datetime(number: int) -> _Moment | None:
    """A number as a DATETIME (number_to_datetime): YYMMDD, YYYYMMDD, YYMMDDhhmmss or YYYYMMDDhhmmss."""
    if number <= 0 or number < 101:
        return None
    if number <= 691231:
        number = (number + 20000000) * 1000000
    elif number < 700101:
        return None
    elif number <= 991231:
        number = (number + 19000000) * 1000000
    elif number < 10000101:
        return None
    elif number <= 99991231:
        number *= 1000000
    elif number < 101000000:
        return None
    elif number <= 691231235959:
        number += 20000000000000
    elif number < 700101000000:
        return None
    elif number <= 991231235959:
        number += 19000000000000
    if number > 99991231235959:
        return None
    date, clock = divmod(number, 1000000)
    moment = _Moment(date // 10000, date // 100 % 100, date % 100, clock // 10000, clock // 100 % 100, clock % 100)
    if moment.month > 12 or moment.day > 31 or moment.hour > 23 or moment.minute > 59 or moment.second > 59:
        return None
    return moment


def str_to_time(text: str, mariadb: bool = False) -> int | None:
    """A text as the server's str_to_time reads it, in microseconds (not yet cut or rounded to a precision):
    '[-][D ]hh:mm:ss.ffffff', 'hh:mm', a number as [H…]HHMMSS, or a DATETIME's time; None where it reads an
    error (the server then writes 00:00:00)."""
    text = text.lstrip(_SPACE)
    negative = text.startswith("-")
    text = text[1:] if negative else text
    if not text:
        return None
    if len(text) >= 12:  # perhaps a whole DATETIME
        kind, moment = _parse_datetime(text, datetime_only=True, t_is_space=mariadb)
        if kind == "error":
            return None
        if moment is not None:
            micros = ((moment.hour * 60 + moment.minute) * 60 + moment.second) * 1_000_000 + moment.micro
            return -micros if negative else micros
    at = len(text) - len(text.lstrip("0123456789"))
    value = int(text[:at] or "0")
    if value > 0xFFFFFFFF:
        return None
    end_of_days = at
    while at < len(text) and text[at] in _SPACE:
        at += 1
    fields = [0, 0, 0, 0]  # days, hours, minutes, seconds
    if len(text) - at > 1 and at != end_of_days and _digit(text[at]):
        fields[0], state = value, 1
    elif len(text) - at > 1 and text[at] == ":" and _digit(text[at + 1]):
        fields[1], state = value, 2
        at += 1
    else:  # one number: [H…]HHMMSS
        fields[1:] = [value // 10000, value // 100 % 100, value % 100]
        state = 4
    while state < 4:
        start = at
        while at < len(text) and _digit(text[at]):
            at += 1
        fields[state] = int(text[start:at] or "0")
        state += 1
        if state == 4 or len(text) - at < 2 or text[at] != ":" or not _digit(text[at + 1]):
            break
        at += 1
    micro = 0
    if len(text) - at >= 2 and text[at] == "." and _digit(text[at + 1]):
        start = at = at + 1
        while at < len(text) and _digit(text[at]):
            at += 1
        micro = int(text[start:at][:6].ljust(6, "0"))
    elif len(text) - at == 1 and text[at] == ".":
        at += 1
    rest = text[at:]
    if len(rest) > 1 and rest[0] in "eE" and (_digit(rest[1]) or (rest[1] in "+-" and len(rest) > 2 and _digit(rest[2]))):
        return None
    days, hours, minutes, seconds = fields
    if minutes > 59 or seconds > 59:
        return None
    micros = (((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1_000_000 + micro
    return -micros if negative else micros


def _hhmmss_micros(number: int, micro: int = 0) -> int | None:
    """A non-negative number read as [H…]HHMMSS, None when its minutes or seconds are 60 or more."""
    if number % 100 >= 60 or number // 100 % 100 >= 60:
        return None
    return ((number // 10000 * 60 + number // 100 % 100) * 60 + number % 100) * 1_000_000 + micro


def _number_time(conversion: Conversion, number: int, micro: int = 0) -> int | None:
    """A number as a TIME: MariaDB reads one above 9999999 as a DATETIME (its time part) and clamps one beyond
    DATETIME's numbers; MySQL's number_to_time clamps from 838:59:59 on unless it reads a DATETIME."""
    negative, magnitude = number < 0, abs(number)
    if conversion.mysql:
        if magnitude > 8385959:
            if magnitude >= 10000000000 and not negative:
                moment = number_to_datetime(magnitude)
                if moment is not None:
                    return ((moment.hour * 60 + moment.minute) * 60 + moment.second) * 1_000_000
            return -TIME_MAX_MICROS if negative else TIME_MAX_MICROS
        micros = _hhmmss_micros(magnitude, micro)
    elif magnitude > 9999999 and not negative:
        if magnitude > 99999999999999:
            return TIME_MAX_MICROS + 999_999  # beyond any DATETIME: the largest TIME
        moment = number_to_datetime(magnitude)
        if moment is None or moment.datetime() is None:
            return None
        return ((moment.hour * 60 + moment.minute) * 60 + moment.second) * 1_000_000 + micro
    else:
        micros = _hhmmss_micros(magnitude, micro)  # beyond 838:59:59: the largest TIME (_time_text)
    if micros is None:
        return None
    return -micros if negative else micros


def _old_time_micros(conversion: Conversion, value: Any) -> int | None:
    """The old value as a TIME (microseconds, not yet fitted to the new precision); None: 00:00:00."""
    t = conversion.old.type
    if t == "time":
        return time_micros(value)
    if t in ("datetime", "timestamp"):
        moment = _naive(value)
        return ((moment.hour * 60 + moment.minute) * 60 + moment.second) * 1_000_000 + moment.microsecond
    if t == "date":
        return 0
    if t == "bit" or (t in INTEGER_TYPES and not conversion.mysql):
        return _number_time(conversion, int_of(conversion, value))
    if t == "decimal" and not conversion.mysql:
        number = Decimal(value)
        whole = int(abs(number))
        micro = int((abs(number) - whole) * 1_000_000)
        return _number_time(conversion, -whole if number < 0 else whole, micro) if whole or micro else 0
    return str_to_time(_as_str(text_of(conversion, value)), mariadb=not conversion.mysql)


def _to_time(conversion: Conversion, value: Any) -> str:
    """A DATETIME's time rounded up to 24:00:00 stays so (MySQL); a value the server reads no time in is
    00:00:00."""
    return _time_text(conversion, _old_time_micros(conversion, value))


def _old_moment(conversion: Conversion, value: Any) -> dt.datetime | None:
    """The old value as a DATETIME (not yet fitted to the new precision); None: a zero or invalid date."""
    t = conversion.old.type
    if t == "date":
        return dt.datetime(value.year, value.month, value.day)
    if t in ("datetime", "timestamp"):
        return _naive(value)
    if t == "time":
        return _add_micros(dt.datetime.combine(conversion.today, dt.time()), time_micros(value))
    if t == "bit" or (t in INTEGER_TYPES and not conversion.mysql):
        moment = number_to_datetime(int_of(conversion, value))
        return None if moment is None else moment.datetime()
    if t == "decimal" and not conversion.mysql:
        number = Decimal(value)
        if number < 0:
            return None
        moment = number_to_datetime(int(number))
        if moment is None or moment.datetime() is None:
            return None
        return moment.datetime().replace(microsecond=int((number - int(number)) * 1_000_000))  # type: ignore[union-attr]
    moment = str_to_datetime(_as_str(text_of(conversion, value)))
    return None if moment is None else moment.datetime()


def _fitted(conversion: Conversion, moment: dt.datetime, fsp: int) -> dt.datetime | None:
    """A DATETIME at `fsp` fractional digits: rounded (MySQL; past 9999-12-31 it is a zero date) or cut."""
    unit = 10 ** (6 - fsp)
    if conversion.mysql:
        extra = moment.microsecond % unit
        return moment - dt.timedelta(microseconds=extra) if extra < unit // 2 else _add_micros(moment, unit - extra)
    return moment.replace(microsecond=moment.microsecond // unit * unit)


def _to_date(conversion: Conversion, value: Any) -> dt.date | dt.datetime | None:
    new = conversion.new
    moment = _old_moment(conversion, value)
    if moment is None:
        return None
    moment = _fitted(conversion, moment, 0 if new.type == "date" else new.fsp)
    if moment is None:
        return None
    if new.type == "date":
        return moment.date()
    if new.type == "timestamp":
        if not _TIMESTAMP_MIN <= moment <= _TIMESTAMP_MAX:
            return None
        return moment.replace(tzinfo=dt.UTC)
    return moment


# -- the store function of each new type --------------------------------------------------------------------------

_STORES: dict[str, Callable[[Conversion, Any], Any]] = {
    **{t: _to_integer for t in INTEGER_TYPES},
    "year": _to_year,
    "bit": _to_bit,
    "decimal": _to_decimal,
    "float": _to_real,
    "double": _to_real,
    **{t: _to_text for t in TEXTS},
    **{t: _to_binary for t in BINARIES},
    "enum": _to_enum,
    "set": _to_set,
    "json": _to_json,
    "date": _to_date,
    "datetime": _to_date,
    "timestamp": _to_date,
    "time": _to_time,
}


# -- doubles as MySQL prints them ----------------------------------------------------------------------------------

_GCVT_WIDTH = 15 + 4 + 15  # MY_GCVT_MAX_FIELD_WIDTH
_MAX_DECPT_FOR_F_FORMAT = 15  # DBL_DIG
_FLT_DIG = 6


def my_gcvt(value: float, single: bool) -> str:
    """A FLOAT (`single`) or DOUBLE as MySQL and MariaDB print it (my_gcvt): a double's shortest digits that read
    back as itself, a float's 6 significant digits; the 'f' form from 1e-15 to 1e15 (and beyond while the digits
    reach the point), else 'e' with no '+' and no padding in the exponent."""
    if math.isnan(value) or math.isinf(value):
        raise InexactConversion(f"no server text of {value}")
    negative = math.copysign(1.0, value) < 0
    if value == 0:
        return "-0" if negative else "0"
    if single:
        mantissa, _, exponent = f"{abs(value):.{_FLT_DIG - 1}e}".partition("e")
        digits = mantissa.replace(".", "").rstrip("0")
        decpt = int(exponent) + 1
    else:
        mantissa, _, exponent = repr(abs(value)).partition("e")
        whole, _, fraction = mantissa.partition(".")
        stripped = (whole + fraction).lstrip("0")
        decpt = len(whole) - (len(whole) + len(fraction) - len(stripped)) + (int(exponent) if exponent else 0)
        digits = stripped.rstrip("0")
    width = _GCVT_WIDTH - negative
    length = len(digits)
    exp_len = 1 + (decpt >= 101 or decpt <= -99) + (decpt >= 11 or decpt <= -9)
    have_space = (length - decpt + 2 if decpt <= 0 else length + 1 if decpt < length else decpt) <= width
    force_e = decpt <= 0 and width <= 2 - decpt and width >= 3 + exp_len
    f_format = (
        have_space
        or (decpt <= width and (decpt >= -1 or (decpt == -2 and (length > 1 or not force_e))) and not force_e)
    ) and (
        not have_space
        or (decpt >= -_MAX_DECPT_FOR_F_FORMAT + 1 and (decpt <= _MAX_DECPT_FOR_F_FORMAT or length > decpt))
    )
    sign = "-" if negative else ""
    if f_format:
        if decpt <= 0:
            return f"{sign}0.{'0' * -decpt}{digits}"
        if decpt < length:
            return f"{sign}{digits[:decpt]}.{digits[decpt:]}"
        return f"{sign}{digits}{'0' * (decpt - length)}"
    mantissa = f"{digits[0]}.{digits[1:]}" if length > 1 else digits
    return f"{sign}{mantissa}e{decpt - 1}"


def json_double_text(value: float) -> str:
    """A double in a JSON document as MySQL prints it (binlog JSON, a MODIFY to JSON): `my_gcvt`'s text, then `.0`
    when that shows neither a decimal point nor an exponent."""
    text = my_gcvt(value, single=False)
    return text if "." in text or "e" in text else text + ".0"
