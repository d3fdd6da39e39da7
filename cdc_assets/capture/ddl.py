"""DDL statements from the binlog, turned into changes of table versions.

With `binlog_row_metadata=FULL` every row event names its columns as they were at that point, so
row images never need this module. What a row event cannot say is what a DDL did to the rows no
later event touches: which column a renamed one was, which default an added column gives the rows
already there, that a table was created, dropped or renamed. `schema_changes` reads that from the
statement and applies it to the table versions known just before it: a pure function of the
statement text, the default schema and those versions.

Supported: ALTER TABLE (ADD / DROP / MODIFY / CHANGE / RENAME COLUMN, ADD / DROP PRIMARY KEY,
RENAME TO), CREATE TABLE (with columns, LIKE, OR REPLACE, IF NOT EXISTS), DROP TABLE, RENAME TABLE,
DROP DATABASE. Anything else that names a known table changes no column (indexes, options).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from cdc_assets.core.mysql_charsets import python_codec, stored_text
from cdc_assets.core.mysql_conversions import InexactConversion, member_position
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ALTER, CREATE, DROP, ROWS_CHANGED, ROWS_REMOVED
from cdc_assets.core.shapes import Default, SchemaChange, TableShape

# -- tokens ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<comment>/\*(?!!).*?\*/|--[ \t][^\n]*|\#[^\n]*)
  | (?P<exec_open>/\*!\d*)
  | (?P<exec_close>\*/)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>[xXbBnN]?'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))
  | (?P<word>[A-Za-z0-9_$@]+)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class Token:
    kind: str  # word, quoted, string, number, punct
    text: str

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def name(self) -> str:
        """The identifier this token spells (backticks removed)."""
        return self.text[1:-1].replace("``", "`") if self.kind == "quoted" else self.text


def tokenize(sql: str) -> list[Token]:
    """Tokens of a statement; comments dropped, executable comments (`/*!50100 ... */`) kept as content."""
    tokens = []
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup
        if kind in ("ws", "comment", "exec_open", "exec_close") or kind is None:
            continue
        tokens.append(Token(kind, match.group()))
    return tokens


class _Cursor:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self, offset: int = 0) -> Token | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def upper(self, offset: int = 0) -> str:
        token = self.peek(offset)
        return token.upper if token else ""

    def take(self) -> Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def accept(self, *words: str) -> bool:
        """Consume the words if they come next, in order."""
        if all(self.upper(k) == w for k, w in enumerate(words)):
            self.i += len(words)
            return True
        return False

    def accept_punct(self, text: str) -> bool:
        token = self.peek()
        if token is not None and token.kind == "punct" and token.text == text:
            self.i += 1
            return True
        return False

    def at_end(self) -> bool:
        return self.i >= len(self.tokens)

    def identifier(self) -> str:
        token = self.take()
        if token.kind not in ("word", "quoted", "string"):
            raise DdlParseError(f"expected a name, found {token.text!r}")
        return token.name if token.kind != "string" else _string_value(token.text)

    def table(self, default_schema: str | None) -> TableRef:
        first = self.identifier()
        if self.accept_punct("."):
            return TableRef(first, self.identifier())
        if default_schema is None:
            raise DdlParseError(f"table {first} has no schema")
        return TableRef(default_schema, first)

    def parenthesised(self) -> list[Token]:
        """The tokens between a `(` (next) and its matching `)`."""
        if not self.accept_punct("("):
            raise DdlParseError("expected (")
        depth, inside = 1, []
        while True:
            token = self.take()
            if token.kind == "punct" and token.text == "(":
                depth += 1
            elif token.kind == "punct" and token.text == ")":
                depth -= 1
                if depth == 0:
                    return inside
            inside.append(token)


class DdlParseError(ValueError):
    pass


class UnknownStoredValue(DdlParseError):
    """A value a statement gives the rows already in its table that the statement alone does not tell as the server
    stored it (the message says why): capture quarantines `table` rather than fill the rows with a guess."""

    def __init__(self, message: str, table: TableRef | None = None) -> None:
        super().__init__(message)
        self.table = table


def _split_top_level(tokens: list[Token]) -> list[list[Token]]:
    """Tokens split at commas outside parentheses."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for token in tokens:
        if token.kind == "punct" and token.text == "(":
            depth += 1
        elif token.kind == "punct" and token.text == ")":
            depth -= 1
        elif token.kind == "punct" and token.text == "," and depth == 0:
            parts.append([])
            continue
        parts[-1].append(token)
    return [p for p in parts if p]


_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "\\": "\\", "'": "'", '"': '"'}


def _string_value(text: str) -> str:
    """The value of a SQL string literal (MySQL escapes; `''` inside quotes)."""
    if text[0] in "nN":
        text = text[1:]
    quote, body = text[0], text[1:-1]
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append(_ESCAPES.get(nxt, "\\" + nxt if nxt in "%_" else nxt))
            i += 2
        elif ch == quote and i + 1 < len(body) and body[i + 1] == quote:
            out.append(quote)
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# -- column definitions ----------------------------------------------------------------------------------

_TYPE_ALIASES = {
    "integer": "int", "int1": "tinyint", "int2": "smallint", "int3": "mediumint", "int4": "int", "int8": "bigint",
    "middleint": "mediumint", "bool": "tinyint", "boolean": "tinyint", "numeric": "decimal", "dec": "decimal",
    "fixed": "decimal", "real": "double", "float4": "float", "float8": "double",
    "tinytext": "text", "mediumtext": "text", "longtext": "text", "long": "text",
    "tinyblob": "blob", "mediumblob": "blob", "longblob": "blob",
    "point": "geometry", "linestring": "geometry", "polygon": "geometry", "multipoint": "geometry",
    "multilinestring": "geometry", "multipolygon": "geometry", "geometrycollection": "geometry",
    "geomcollection": "geometry", "nchar": "char", "nvarchar": "varchar", "character": "char",
}  # fmt: skip
_KNOWN_TYPES = {
    "tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "float", "double", "bit", "date", "datetime",
    "timestamp", "time", "year", "char", "varchar", "text", "enum", "set", "json", "binary", "varbinary", "blob",
    "geometry", "serial", "vector", "uuid", "inet4", "inet6",
}  # fmt: skip
_BINARY_OF = {"varchar": "varbinary", "char": "binary", "text": "blob"}


@dataclass(frozen=True)
class ColumnDef:
    spec: ColumnSpec
    default: Default
    primary_key: bool = False
    unknown_default: str | None = None  # why `default` is not what the server gave rows already there (None: it is)


_TEXT_KINDS = ("char", "varchar", "text", "enum", "set")
_ATTRIBUTE_CHARSETS = {"ASCII": "latin1", "UNICODE": "ucs2", "BYTE": "binary"}  # CHAR(3) ASCII is latin1, …


def _collation_charset(collation: str) -> str | None:
    """The charset a collation name belongs to (`latin1_german1_ci`: latin1), or None for one that names none
    (MariaDB's `uca1400_ai_ci` takes the charset the column or table names)."""
    collation = collation.lower()
    if collation == "binary":
        return "binary"
    prefix = collation.split("_", 1)[0]
    return prefix if python_codec(prefix) is not None or prefix in ("ucs2", "utf16", "utf16le", "utf32") else None


def _parse_type(cur: _Cursor, name: str) -> tuple[ColumnSpec, bool, str | None]:
    """The column type at the cursor; returns the spec (an ENUM's or SET's members as the statement spells them, no
    charset yet), whether it implies NOT NULL (SERIAL), and the charset its attributes name, if any."""
    word = cur.take().text.lower()
    charset = None
    if word in ("national", "nchar", "nvarchar"):  # the national charset: utf8mb3
        charset = "utf8mb3"
        word = cur.take().text.lower() if word == "national" else word
    if word == "double" and cur.upper() == "PRECISION":
        cur.take()
    if word in ("char", "character") and cur.upper() == "VARYING":
        cur.take()
        word = "varchar"
    if word == "long" and cur.upper() in ("VARCHAR", "VARBINARY"):
        word = "text" if cur.take().upper == "VARCHAR" else "blob"
    kind = _TYPE_ALIASES.get(word, word)
    if kind not in _KNOWN_TYPES:
        raise DdlParseError(f"unknown column type {word!r} for {name!r}")
    args: list[Token] = []
    peeked = cur.peek()
    if peeked is not None and peeked.kind == "punct" and peeked.text == "(":
        args = cur.parenthesised()
    numbers = [int(t.text) for t in args if t.kind == "number" and t.text.isdigit()]
    unsigned, collated, serial = False, None, kind == "serial"
    if serial:
        return ColumnSpec(name=name, type="bigint", unsigned=True), True, None
    while True:  # attributes that belong to the type
        if cur.accept("UNSIGNED"):
            unsigned = True
        elif cur.accept("SIGNED") or cur.accept("ZEROFILL") or cur.accept("BINARY"):
            pass
        elif cur.accept("CHARACTER", "SET") or cur.accept("CHARSET"):
            charset = cur.identifier().lower()
        elif cur.accept("COLLATE"):
            collated = _collation_charset(cur.identifier())
        elif cur.upper() in _ATTRIBUTE_CHARSETS:
            charset = _ATTRIBUTE_CHARSETS[cur.take().upper]
        else:
            break
    charset = charset or collated
    if word in ("bool", "boolean"):
        numbers = [1]
    if kind in _BINARY_OF and charset == "binary":
        kind = _BINARY_OF[kind]
    if kind == "float" and numbers and numbers[0] > 24 and len(numbers) == 1:
        kind = "double"
    spec = ColumnSpec(name=name, type=kind, unsigned=unsigned)
    if kind == "decimal":
        spec = replace(spec, precision=numbers[0] if numbers else 10, scale=numbers[1] if len(numbers) > 1 else 0)
    elif kind in ("time", "datetime", "timestamp"):
        spec = replace(spec, fsp=numbers[0] if numbers else 0)
    elif kind in ("enum", "set"):
        spec = replace(spec, members=tuple(_string_value(t.text) for t in args if t.kind == "string"))
    elif kind in ("binary", "char", "bit"):  # CHAR, BINARY and BIT without a length have one
        spec = replace(spec, length=numbers[0] if numbers else 1)
    elif kind in ("varchar", "varbinary") and numbers:
        spec = replace(spec, length=numbers[0])
    if kind == "json":
        spec = replace(spec, charset="binary")
    return spec, False, charset


def _stored_literal(text: str, charset: str | None, literal_charset: str | None) -> tuple[str, bool]:
    """A string literal as the server stores it in a column of `charset`, and whether that is known. The server
    reads a literal in the connection's charset (`literal_charset`: collation_connection's), then converts it to the
    column's, each character the column's charset cannot hold becoming '?' (mysql_charsets.stored_text). A column
    whose charset the statement does not name (the table's or the database's default) or that cannot be converted to
    here leaves a text that is not ASCII unknown; a binary column's text is its bytes in the connection's charset,
    which the lakehouse holds as their UTF-8 text (capture/binlog/table_map), unknown when they are not UTF-8."""
    if literal_charset is not None:
        try:
            text = stored_text(text, _CHARSET_NAMES.get(literal_charset, literal_charset))
        except LookupError:
            pass  # the text was read in the client's charset, which is the connection's but in odd sessions
    if text.isascii():
        return text, True
    if charset == "binary":
        try:
            return text.encode(python_codec(literal_charset) or "utf-8").decode("utf-8"), True
        except (LookupError, UnicodeError):
            return text, False
    if charset is None:
        return text, False
    try:
        return stored_text(text, _CHARSET_NAMES.get(charset, charset)), True
    except LookupError:
        return text, False


_CHARSET_NAMES = {"utf8": "utf8mb3"}  # DDL's names that are aliases (MySQL 8 and MariaDB: utf8 is utf8mb3)


def _literal(tokens: list[Token]) -> str | None | object:
    """The value of a constant default expression (a str for strings and numbers, None for NULL), or
    `_NOT_CONSTANT` when it is an expression."""
    sign = ""
    while tokens and tokens[0].kind == "punct" and tokens[0].text in "+-" and len(tokens) > 1:
        sign = "-" if (tokens[0].text == "-") != (sign == "-") else ""
        tokens = tokens[1:]
    if len(tokens) == 1:
        token = tokens[0]
        if token.kind == "number":
            return sign + token.text
        if token.kind == "string":
            if token.text[0] in "xX":
                return bytes.fromhex(token.text[2:-1])
            if token.text[0] in "bB":
                return str(int(token.text[2:-1] or "0", 2))
            return _string_value(token.text)
        if token.upper == "NULL":
            return None
        if token.upper in ("TRUE", "FALSE"):
            return "1" if token.upper == "TRUE" else "0"
        if token.text.lower().startswith("0x"):
            return bytes.fromhex(token.text[2:])
    return _NOT_CONSTANT


_NOT_CONSTANT = object()
_NOW_FUNCTIONS = {"CURRENT_TIMESTAMP", "NOW", "LOCALTIME", "LOCALTIMESTAMP", "SYSDATE"}
_COLUMN_ATTRIBUTE_ENDS = {
    "NOT", "NULL", "DEFAULT", "AUTO_INCREMENT", "PRIMARY", "KEY", "UNIQUE", "COMMENT", "ON", "COLLATE",
    "GENERATED", "AS", "VIRTUAL", "PERSISTENT", "STORED", "CHECK", "REFERENCES", "INVISIBLE", "FIRST", "AFTER",
    "COLUMN_FORMAT", "STORAGE", "CONSTRAINT", "WITH", "COMPRESSED",
}  # fmt: skip


def _default_expression(cur: _Cursor) -> list[Token]:
    """Tokens of a DEFAULT expression: a literal, a function call or a parenthesised expression."""
    token = cur.peek()
    if token is not None and token.kind == "punct" and token.text == "(":
        return [Token("punct", "(")] + cur.parenthesised() + [Token("punct", ")")]
    tokens = []
    while token is not None and token.kind == "punct" and token.text in "+-":
        tokens.append(cur.take())
        token = cur.peek()
    tokens.append(cur.take())
    nxt = cur.peek()
    if nxt is not None and nxt.kind == "punct" and nxt.text == "(":  # CURRENT_TIMESTAMP(6), NOW()
        tokens += [Token("punct", "(")] + cur.parenthesised() + [Token("punct", ")")]
    return tokens


def parse_column_definition(
    tokens: list[Token], table_charset: str | None = None, literal_charset: str | None = None
) -> ColumnDef:
    """`name type [attributes]` as in CREATE TABLE and ALTER TABLE ADD / MODIFY / CHANGE, given the charset the
    statement names for its table (None: the table's or database's default, which it does not say) and the one its
    string literals are read in (the connection's). An ENUM's or SET's members are as the server stores them: in the
    column's charset, trailing spaces cut."""
    cur = _Cursor(tokens)
    name = cur.identifier()
    spec, not_null, charset = _parse_type(cur, name)
    default_tokens: list[Token] | None = None
    primary = generated = False
    while not cur.at_end():
        if cur.accept("NOT", "NULL"):
            not_null = True
        elif cur.accept("NULL"):
            not_null = False
        elif cur.accept("COLLATE"):
            charset = charset or _collation_charset(cur.identifier())
        elif cur.accept("DEFAULT"):
            default_tokens = _default_expression(cur)
        elif cur.accept("PRIMARY", "KEY"):
            primary = not_null = True
        elif cur.accept("GENERATED", "ALWAYS", "AS") or cur.accept("AS"):
            generated = True
            cur.parenthesised()
        elif cur.upper() in ("FIRST", "AFTER"):
            break
        else:
            token = cur.take()
            if token.kind == "punct" and token.text == "(":
                cur.i -= 1
                cur.parenthesised()
    unknown = None
    if spec.type in _TEXT_KINDS:
        spec = replace(spec, charset=charset or table_charset)
        stored = [_stored_literal(member, spec.charset, literal_charset) for member in spec.members]
        spec = replace(spec, members=tuple(text.rstrip(" ") for text, _ in stored))
        if spec.type == "enum" and not_null and default_tokens is None and stored and not stored[0][1]:
            unknown = (
                f"column {spec.name!r} is added as an ENUM NOT NULL with no DEFAULT, so the rows there take its first "
                f"member {spec.members[0]!r} as the column's charset holds it, and the statement names no charset for "
                "the column that cdc-lakehouse can convert to"
            )
    try:
        default = _default_of(spec, default_tokens, not_null, generated, literal_charset)
    except UnknownStoredValue as exc:
        default, unknown = Default("unknown"), str(exc)
    return ColumnDef(spec, default, primary, unknown)


def _default_of(
    spec: ColumnSpec, tokens: list[Token] | None, not_null: bool, generated: bool, literal_charset: str | None = None
) -> Default:
    """What MySQL puts in existing rows for a new column: its DEFAULT, else NULL, else (NOT NULL) the
    type's implicit default. Raises UnknownStoredValue for a DEFAULT whose stored value the statement does not tell."""
    if generated:
        return Default("unknown")
    if tokens is None:
        return Default("value", _implicit_default(spec) if not_null else None)
    if tokens[0].upper in _NOW_FUNCTIONS or tokens[0].upper in ("CURRENT_DATE", "CURDATE", "UTC_TIMESTAMP"):
        return Default("now")
    value = _literal(tokens[1:-1] if tokens[0].text == "(" else tokens)
    if value is _NOT_CONSTANT:
        return Default("unknown")
    try:
        return Default("value", canonical_literal(spec, value, literal_charset))  # type: ignore[arg-type]
    except UnknownStoredValue:
        raise
    except (ValueError, InvalidOperation):
        return Default("unknown")


def _implicit_default(spec: ColumnSpec) -> str | None:
    t = spec.type
    if t in ("tinyint", "smallint", "mediumint", "int", "bigint", "bit", "year"):
        return "0"
    if t == "decimal":
        return format(Decimal(0).scaleb(-(spec.scale or 0)), "f")
    if t in ("float", "double"):
        return "0.0"
    if t == "time":
        return "00:00:00" + ("." + "0" * spec.fsp if spec.fsp else "")
    if t in ("date", "datetime", "timestamp"):
        return None  # the zero date, which the lakehouse holds as NULL
    if t == "enum":
        return spec.members[0] if spec.members else ""
    if t == "binary":
        return _b64(b"\0" * (spec.length or 0))
    if t in ("varbinary", "blob", "geometry", "vector"):  # a VECTOR NOT NULL added to rows: no element
        return _b64(b"")
    return ""


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


_TIME = re.compile(r"^(-)?(\d+):(\d{1,2})(?::(\d{1,2}))?(?:\.(\d{1,6}))?$")


def canonical_literal(spec: ColumnSpec, value: str | bytes | None, literal_charset: str | None = None) -> str | None:
    """A constant default in the canonical text of the column's type (mysql_types), as the server stores it: a text
    read in the connection's charset (`literal_charset`), converted to the column's; a CHAR without its trailing
    spaces (as it is read); an ENUM's or SET's the members it names, as the server's store finds them. Raises
    UnknownStoredValue where that store's choice cannot be known."""
    if value is None:
        return None
    t = spec.type
    if isinstance(value, bytes):
        if t in ("binary", "varbinary", "blob"):
            return _b64(value.ljust(spec.length or 0, b"\0") if t == "binary" else value)
        value = (
            str(int.from_bytes(value, "big"))
            if t in ("bit", "tinyint", "smallint", "int", "bigint")
            else value.decode()
        )
    if t in _TEXT_KINDS:  # the server refuses a DEFAULT its column's charset cannot hold: no '?' comes of it
        value = _stored_literal(value, spec.charset, literal_charset)[0]
        if t == "char":
            value = value.rstrip(" ")
        elif t in ("enum", "set"):
            return _members_named(spec, value)
    text = str(value)
    if t in ("tinyint", "smallint", "mediumint", "int", "bigint", "year", "bit"):
        return str(int(Decimal(text).to_integral_value()))
    if t == "decimal":
        return format(Decimal(text).quantize(Decimal(1).scaleb(-(spec.scale or 0))), "f")
    if t in ("float", "double"):
        return repr(float(text))
    if t == "date":
        return dt.date.fromisoformat(text[:10]).isoformat()
    if t in ("datetime", "timestamp"):
        moment = dt.datetime.fromisoformat(text.replace("T", " "))
        return moment.isoformat(sep=" ", timespec="microseconds")
    if t == "time":
        match = _TIME.match(text)
        if not match:
            raise ValueError(text)
        sign, hours, minutes, seconds, fraction = match.groups()
        out = f"{sign or ''}{int(hours):02d}:{int(minutes):02d}:{int(seconds or 0):02d}"
        return out + ("." + (fraction or "").ljust(6, "0")[: spec.fsp] if spec.fsp else "")
    if t in ("binary", "varbinary", "blob", "geometry"):
        data = text.encode(python_codec(literal_charset) or "utf-8")  # the connection's bytes, as the server keeps them
        return _b64(data.ljust(spec.length or 0, b"\0") if t == "binary" else data)
    return text


def _members_named(spec: ColumnSpec, text: str) -> str:
    """An ENUM's or SET's DEFAULT as the server stores it: the member (a SET's members, in their order) the text
    names, found as the server's store finds them (mysql_conversions.member_position). A text that names none the
    statement tells is unknown: the server took it, so it named a member, by its column's collation."""
    parts = [text.rstrip(" ")] if spec.type == "enum" else [p for p in text.rstrip(" ").split(",") if p]
    chosen = set()
    for part in parts:
        try:
            found = member_position(spec.members, part)
        except InexactConversion as exc:
            found, why = 0, f": {exc}"
        else:
            why = ""
        if not found:
            raise UnknownStoredValue(
                f"column {spec.name!r} is given DEFAULT {text!r}, which the server took as the member of "
                f"{spec.type.upper()}{spec.members!r} its collation finds, and the statement does not tell which{why}"
            )
        chosen.add(found - 1)
    return ",".join(m for i, m in enumerate(spec.members) if i in chosen)


# -- statements ------------------------------------------------------------------------------------------


def schema_changes(
    statement: str,
    default_schema: str | None,
    known: dict[TableRef, TableShape],
    literal_charset: str | None = None,
) -> list[SchemaChange]:
    """The table changes a DDL statement makes, given the shapes known just before it and the charset its string
    literals were read in (the session's collation_connection; None: as they are).

    Raises DdlParseError for a statement about tables that cannot be read, UnknownStoredValue (naming the table) for
    one that gives a table's rows a value it does not tell; returns [] for DDL that changes no table's columns
    (CREATE INDEX, views, routines, ...).
    """
    cur = _Cursor(tokenize(statement))
    if cur.accept("ALTER"):
        while cur.accept("ONLINE") or cur.accept("IGNORE"):
            pass
        if cur.accept("TABLE"):
            cur.accept("IF", "EXISTS")
            table = cur.table(default_schema)
            try:
                return _alter(cur, table, default_schema, known, literal_charset)
            except UnknownStoredValue as exc:
                raise UnknownStoredValue(
                    f"an ALTER TABLE gives the rows there a value it does not tell: {exc}", table
                ) from None
        return []
    if cur.accept("CREATE"):
        replace_ = cur.accept("OR", "REPLACE")
        if cur.accept("TEMPORARY"):
            return []  # temporary tables are not replicated in ROW format
        if cur.accept("TABLE"):
            if_not_exists = cur.accept("IF", "NOT", "EXISTS")
            table = cur.table(default_schema)
            if if_not_exists and table in known:
                return []
            changes = [_dropped(table, known)] if replace_ and table in known else []
            return changes + [_create(cur, table, default_schema, known, literal_charset)]
        return []
    if cur.accept("DROP"):
        if cur.accept("TEMPORARY"):
            return []
        if cur.accept("TABLE"):
            cur.accept("IF", "EXISTS")
            parts = _split_top_level(cur.tokens[cur.i :])
            tables = [_Cursor(part).table(default_schema) for part in parts]
            return [_dropped(t, known) for t in tables if t in known]
        if cur.accept("DATABASE") or cur.accept("SCHEMA"):
            cur.accept("IF", "EXISTS")
            schema = cur.identifier()
            return [_dropped(t, known) for t in sorted(known, key=str) if t.schema == schema]
        return []
    if cur.accept("RENAME", "TABLE") or cur.accept("RENAME", "TABLES"):
        changes: list[SchemaChange] = []
        shapes = dict(known)
        for part in _split_top_level(cur.tokens[cur.i :]):
            pc = _Cursor(part)
            old = pc.table(default_schema)
            if not pc.accept("TO"):
                raise DdlParseError("RENAME TABLE without TO")
            new = pc.table(default_schema)
            changes += _renamed(old, new, shapes)
            if old in shapes:
                shapes[new] = replace(shapes.pop(old), table=new)
        return changes
    return []


def _dropped(table: TableRef, known: dict[TableRef, TableShape]) -> SchemaChange:
    return SchemaChange(table, DROP, known.get(table), None)


def _renamed(old: TableRef, new: TableRef, known: dict[TableRef, TableShape]) -> list[SchemaChange]:
    before = known.get(old)
    after = replace(before, table=new) if before else None
    return [
        SchemaChange(new, CREATE, None, after, renamed_from=old),
        SchemaChange(old, DROP, before, None, renamed_to=new),
    ]


def _table_charset(tokens: list[Token]) -> str | None:
    """The charset table options name (`[DEFAULT] CHARSET [=] x`, `CHARACTER SET x`, else a `COLLATE [=] y`'s)."""
    collated = None
    for i, token in enumerate(tokens):
        if token.upper in ("CHARSET", "SET", "COLLATE") and i + 1 < len(tokens):
            nxt = tokens[i + 2] if tokens[i + 1].kind == "punct" and tokens[i + 1].text == "=" else tokens[i + 1]
            if token.upper == "COLLATE":
                collated = collated or _collation_charset(nxt.name)
            elif i == 0 or token.upper == "CHARSET" or tokens[i - 1].upper == "CHARACTER":
                return nxt.name.lower()
    return collated


def _create(
    cur: _Cursor,
    table: TableRef,
    default_schema: str | None,
    known: dict[TableRef, TableShape],
    literal_charset: str | None = None,
) -> SchemaChange:
    if cur.accept("LIKE") or (cur.peek() is not None and cur.peek().text == "(" and cur.upper(1) == "LIKE"):
        cur.accept_punct("(")
        cur.accept("LIKE")
        source = cur.table(default_schema)
        like = known.get(source)
        return SchemaChange(table, CREATE, None, replace(like, table=table) if like else None)
    token = cur.peek()
    if token is None or token.kind != "punct" or token.text != "(":
        return SchemaChange(table, CREATE, None, None)  # CREATE TABLE ... SELECT without columns: row events tell
    body = cur.parenthesised()
    charset = _table_charset(cur.tokens[cur.i :])
    columns: list[ColumnSpec] = []
    key: tuple[str, ...] = ()
    for part in _split_top_level(body):
        head = part[0].upper
        if head in ("PRIMARY", "CONSTRAINT") and any(t.upper == "PRIMARY" for t in part[:3]):
            key = _key_columns(part)
        elif head in ("KEY", "INDEX", "UNIQUE", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK", "CONSTRAINT", "PERIOD"):
            continue
        else:
            column = parse_column_definition(part, charset, literal_charset)
            columns.append(column.spec)
            if column.primary_key:
                key = (column.spec.name,)
    if cur.upper() in ("SELECT", "AS", "IGNORE", "REPLACE") or any(t.upper == "SELECT" for t in cur.tokens[cur.i :]):
        return SchemaChange(table, CREATE, None, None)  # the SELECT adds columns only the row events show
    return SchemaChange(table, CREATE, None, TableShape(table, tuple(columns), _as_columns_named(key, columns)))


def _as_columns_named(key: Iterable[str], columns: Iterable[ColumnSpec]) -> tuple[str, ...]:
    """Key columns as the columns are named: MySQL's names are case-insensitive, so `PRIMARY KEY (ID)` names `id`."""
    names = {c.name.lower(): c.name for c in columns}
    return tuple(names.get(k.lower(), k) for k in key)


def _key_columns(part: list[Token]) -> tuple[str, ...]:
    for i, token in enumerate(part):
        if token.kind == "punct" and token.text == "(":
            cur = _Cursor(part[i:])
            inside = cur.parenthesised()
            return tuple(_Cursor(p).identifier() for p in _split_top_level(inside))
    raise DdlParseError("PRIMARY KEY without columns")


def _place(columns: list[ColumnSpec], column: ColumnSpec, cur: _Cursor) -> None:
    if cur.accept("FIRST"):
        columns.insert(0, column)
    elif cur.accept("AFTER"):
        anchor = cur.identifier()
        names = [c.name.lower() for c in columns]
        columns.insert(names.index(anchor.lower()) + 1, column)
    else:
        columns.append(column)


def _index_of(columns: list[ColumnSpec], name: str) -> int:
    for i, column in enumerate(columns):
        if column.name.lower() == name.lower():
            return i
    raise DdlParseError(f"no column {name!r}")


def _unlogged_row_changes(
    specs: list[list[Token]], table: TableRef, default_schema: str | None, known: dict[TableRef, TableShape]
) -> list[SchemaChange]:
    """The partition maintenance of an ALTER that changes rows without row events, as `rows_removed` (a partition
    truncated or dropped) and `rows_changed` (a partition exchanged with a table, or converted to or from one:
    MariaDB) changes of the captured tables it touches; the tables owe a repair (lake/repair_marks). Partition
    maintenance that keeps every row where it is (ADD, REORGANIZE, COALESCE, REBUILD, …) changes nothing."""
    found: list[tuple[TableRef, str]] = []
    for spec in specs:
        sc = _Cursor(spec)
        word, then = sc.upper(), sc.upper(1)
        if word in ("TRUNCATE", "DROP") and then == "PARTITION":
            found.append((table, ROWS_REMOVED))
        elif word == "EXCHANGE" and then == "PARTITION":
            sc.take(), sc.take(), sc.identifier()
            if sc.accept("WITH", "TABLE"):
                found += [(table, ROWS_CHANGED), (sc.table(default_schema), ROWS_CHANGED)]
        elif word == "CONVERT" and then == "PARTITION":  # MariaDB: CONVERT PARTITION p TO TABLE t2
            found.append((table, ROWS_REMOVED))
        elif word == "CONVERT" and then == "TABLE":  # MariaDB: CONVERT TABLE t2 TO PARTITION p …
            found.append((table, ROWS_CHANGED))
    return [SchemaChange(t, action, known[t], known[t]) for t, action in dict.fromkeys(found) if t in known]


def _alter(
    cur: _Cursor,
    table: TableRef,
    default_schema: str | None,
    known: dict[TableRef, TableShape],
    literal_charset: str | None = None,
) -> list[SchemaChange]:
    before = known.get(table)
    specs = _split_top_level(cur.tokens[cur.i :])
    unlogged = _unlogged_row_changes(specs, table, default_schema, known)
    renamed_to: TableRef | None = None
    if before is None:  # a table the pipeline has never seen a row of: only a rename matters
        for spec in specs:
            sc = _Cursor(spec)
            if sc.accept("RENAME") and sc.upper() not in ("COLUMN", "INDEX", "KEY"):
                sc.accept("TO") or sc.accept("AS")
                renamed_to = sc.table(default_schema)
        return (_renamed(table, renamed_to, known) if renamed_to else []) + unlogged
    columns = list(before.columns)
    key = list(before.primary_key)
    renames: dict[str, str] = {}  # new name -> original name
    defaults: dict[str, Default] = {}
    # the table's charset, when the statement names it, is its new columns' wherever it is named among them
    charset = next((c for spec in specs if spec[0].upper in _TABLE_CHARSET_WORDS and (c := _table_charset(spec))), None)
    for spec in specs:
        sc = _Cursor(spec)
        if sc.accept("ADD"):
            if sc.accept("PRIMARY", "KEY") or (
                sc.upper() == "CONSTRAINT" and any(t.upper == "PRIMARY" for t in spec[:4])
            ):
                key = list(_key_columns(spec))
                continue
            if sc.upper() in (
                "INDEX",
                "KEY",
                "UNIQUE",
                "FULLTEXT",
                "SPATIAL",
                "FOREIGN",
                "CONSTRAINT",
                "CHECK",
                "PARTITION",
                "PERIOD",
                "SYSTEM",
            ):
                continue
            sc.accept("COLUMN")
            sc.accept("IF", "NOT", "EXISTS")
            token = sc.peek()
            if token is not None and token.kind == "punct" and token.text == "(":
                parts = _split_top_level(sc.parenthesised())
                defs = [parse_column_definition(p, charset, literal_charset) for p in parts]
            else:
                defs = [parse_column_definition(sc.tokens[sc.i :], charset, literal_charset)]
                sc = _Cursor(_tail_after_definition(sc.tokens[sc.i :]))
            for column in defs:
                if any(c.name.lower() == column.spec.name.lower() for c in columns):
                    continue  # IF NOT EXISTS on a column that is there
                if column.unknown_default is not None:
                    raise UnknownStoredValue(column.unknown_default)
                _place(columns, column.spec, sc)
                defaults[column.spec.name] = column.default
                if column.primary_key:
                    key = [column.spec.name]
        elif sc.accept("DROP"):
            if sc.accept("PRIMARY", "KEY"):
                key = []
            elif sc.upper() in ("INDEX", "KEY", "FOREIGN", "CONSTRAINT", "CHECK", "PARTITION", "PERIOD", "SYSTEM"):
                continue
            else:
                sc.accept("COLUMN")
                if_exists = sc.accept("IF", "EXISTS")
                name = sc.identifier()
                try:
                    index = _index_of(columns, name)
                except DdlParseError:
                    if if_exists:
                        continue
                    raise
                dropped = columns.pop(index)
                key = [k for k in key if k.lower() != dropped.name.lower()]
                renames.pop(dropped.name, None)
                defaults.pop(dropped.name, None)
        elif sc.accept("MODIFY") or sc.accept("CHANGE"):
            changing = spec[0].upper == "CHANGE"
            sc.accept("COLUMN")
            sc.accept("IF", "EXISTS")
            old = sc.identifier() if changing else sc.peek().name  # type: ignore[union-attr]
            column = parse_column_definition(sc.tokens[sc.i :], charset, literal_charset)
            index = _index_of(columns, old)
            previous = columns.pop(index)
            tail = _Cursor(_tail_after_definition(sc.tokens[sc.i :]))
            if tail.upper() in ("FIRST", "AFTER"):
                _place(columns, column.spec, tail)
            else:
                columns.insert(index, column.spec)
            _renamed_column(renames, defaults, key, previous.name, column.spec.name)
            if column.primary_key:
                key = [column.spec.name]
        elif sc.accept("RENAME", "COLUMN"):
            old = sc.identifier()
            sc.accept("TO")
            new = sc.identifier()
            index = _index_of(columns, old)
            previous = columns[index]
            columns[index] = replace(previous, name=new)
            _renamed_column(renames, defaults, key, previous.name, new)
        elif sc.accept("RENAME") and sc.upper() not in ("INDEX", "KEY"):
            sc.accept("TO") or sc.accept("AS")
            renamed_to = sc.table(default_schema)
        elif sc.accept("CONVERT", "TO") or sc.upper() in _TABLE_CHARSET_WORDS:
            converted = _table_charset(spec)
            if spec[0].upper == "CONVERT" and converted:
                columns = [replace(c, charset=converted) if c.type in _TEXT_KINDS else c for c in columns]
    after = TableShape(table, tuple(columns), _as_columns_named(key, columns))
    changes = []
    if not before.same_layout(after) or renames or before.columns != after.columns:
        changes.append(SchemaChange(table, ALTER, before, after, renames, defaults))
    if renamed_to is not None:
        changes += _renamed(table, renamed_to, {table: after})
    return changes + unlogged


_TABLE_CHARSET_WORDS = ("CONVERT", "DEFAULT", "CHARACTER", "CHARSET", "COLLATE")


def _renamed_column(renames: dict[str, str], defaults: dict[str, Default], key: list[str], old: str, new: str) -> None:
    if old == new:
        return
    if old in defaults:  # added in this same statement: still a new column, under its new name
        defaults[new] = defaults.pop(old)
    else:
        renames[new] = renames.pop(old, old)
    key[:] = [new if k.lower() == old.lower() else k for k in key]


def _tail_after_definition(tokens: list[Token]) -> list[Token]:
    """The FIRST / AFTER clause that ends a column definition, if any."""
    for i, token in enumerate(tokens):
        if token.upper in ("FIRST", "AFTER"):
            return tokens[i:]
    return []
