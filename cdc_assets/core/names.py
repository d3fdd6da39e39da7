"""Source table names: `TableRef`, its one text form, and the storage path each name owns.

MySQL lets a quoted identifier hold any character but NUL, so a name may contain dots, backticks, slashes,
spaces or be `..`. Two rules keep such names from mixing or escaping:

- Text form: `schema.table`, with a part in backticks (a backtick doubled) when it holds a dot or a
  backtick, is empty or starts or ends with whitespace. Plain names read as before (`shop.orders`), and the
  text always parses back to the same two parts: registry keys, partitions and manifests use it.
- Storage path: each part becomes one path segment of its own (`path_segment`): ASCII letters, digits,
  `_`, `-` and a `.` that does not start the segment stay; any other ASCII byte becomes `~` and two hex
  digits; other printable characters stay as they are. No segment can be `.` or `..` or hold a `/`, and
  different names give different segments, so no name reaches outside its table's directory or shares it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdc_assets.core.errors import CdcUserError

_PLAIN_ASCII = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = "~"
_ESCAPED = re.compile(r"~([0-9A-F]{2})")


def _needs_quotes(part: str) -> bool:
    return not part or "." in part or "`" in part or part != part.strip()


def quote_part(part: str) -> str:
    """One part of a table's text form: as it is, or in backticks when it would be ambiguous."""
    return "`" + part.replace("`", "``") + "`" if _needs_quotes(part) else part


def _read_part(text: str, start: int, whole: str) -> tuple[str, int]:
    """A part at `start`: a backticked identifier or plain text up to the next dot; returns it and where it ends."""
    if text.startswith("`", start):
        i = start + 1
        chars = []
        while i < len(text):
            if text[i] == "`":
                if text.startswith("``", i):
                    chars.append("`")
                    i += 2
                    continue
                return "".join(chars), i + 1
            chars.append(text[i])
            i += 1
        raise CdcUserError(f"'{whole}' has an unclosed backtick: write a table as schema.table, e.g. shop.orders.")
    end = text.find(".", start)
    end = len(text) if end < 0 else end
    return text[start:end], end


def split_name(text: str) -> tuple[str, str]:
    """`schema.table` (either part possibly in backticks) as its two parts."""
    schema, i = _read_part(text, 0, text)
    if i >= len(text) or text[i] != "." or not schema:
        raise CdcUserError(f"'{text}' is not a table name: write it as schema.table, e.g. shop.orders.")
    if text.startswith("`", i + 1):
        table, end = _read_part(text, i + 1, text)
        if end != len(text):
            raise CdcUserError(f"'{text}' is not a table name: write it as schema.table, e.g. shop.orders.")
    else:
        table = text[i + 1 :]  # plain: the rest, dots and all (an earlier text form)
    if not table:
        raise CdcUserError(f"'{text}' is not a table name: write it as schema.table, e.g. shop.orders.")
    return schema, table


@dataclass(frozen=True, order=True)
class TableRef:
    """A source table, `schema.table`."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{quote_part(self.schema)}.{quote_part(self.table)}"

    @staticmethod
    def parse(text: str) -> TableRef:
        return TableRef(*split_name(text))

    @property
    def path(self) -> str:
        """`<schema segment>/<table segment>`: where this table's files live under a layer."""
        return f"{path_segment(self.schema)}/{path_segment(self.table)}"


def path_segment(name: str) -> str:
    """A name as one safe path segment, different for every name (see the module docstring)."""
    if not name:
        raise ValueError("an empty name has no path segment (MySQL has no empty identifiers)")
    out = []
    for i, char in enumerate(name):
        if char in _PLAIN_ASCII or (char == "." and i > 0) or (ord(char) > 127 and char.isprintable() and not char.isspace()):
            out.append(char)
        else:
            out.extend(f"{_ESCAPE}{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


def name_of_segment(segment: str) -> str:
    """The name `path_segment` made `segment` from."""
    raw = bytearray()
    i = 0
    while i < len(segment):
        match = _ESCAPED.match(segment, i)
        if match:
            raw.append(int(match.group(1), 16))
            i = match.end()
        else:
            raw.extend(segment[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8")
