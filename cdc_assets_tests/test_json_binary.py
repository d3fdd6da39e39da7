"""MySQL's binary JSON as capture decodes it (capture/binlog/json_binary.py), against two independent decoders:
the server itself (its SELECT of the same rows, through the text protocol the verification reads) and, where it
does not crash, python-mysql-replication. A fixed table of every value kind, a seeded generator of a few hundred
documents, and PARTIAL_JSON updates applied to their before-images, each document equal to the server's."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest

from cdc_assets.capture.binlog import events
from cdc_assets.capture.binlog.json_binary import (
    INSERT,
    REMOVE,
    REPLACE,
    InvalidJson,
    apply_diff,
    apply_diffs,
    document,
    double_text,
    json_text,
    node_text,
    parse_path,
)
from cdc_assets.capture.binlog.protocol import dump_events
from cdc_assets.capture.binlog.row_images import RowDecoder
from cdc_assets.capture.binlog.table_map import parse_table_map
from cdc_assets.core.mysql_conversions import json_double_text
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.local_source.server import LocalServer
from cdc_assets.source.rows import query_columns
from cdc_assets.source.server import binlog_end
from cdc_assets_tests.pmr_reference import pmr_json_value

READER_ID = 4251

# -- the server's side and capture's side of the same rows -------------------------------------------------


def _database(server: LocalServer, name: str) -> pymysql.Connection:
    conn = server.admin_connection()
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        cur.execute(f"USE {name}")
    return conn


def _server_texts(conn: pymysql.Connection, sql: str) -> list[list[str | None]]:
    """Rows of a SELECT as the server's own text of each value (the verification's reading of the source)."""
    columns = query_columns(conn, sql)
    return [list(row) for row in zip(*(c.cast("string").to_pylist() for c in columns), strict=True)]


def _binlog(server: LocalServer, schema: str, start: BinlogPosition) -> Iterator[tuple]:
    """The row changes of `schema` from `start` to the binlog's end as capture's decoder reads them, as
    (event type, before, after, the event's body), and ("commit",) at each transaction's end."""
    conn = pymysql.connect(**MySQLUrl.parse(server.reader_url()).connection_settings())  # type: ignore[arg-type]
    decoders: dict[int, RowDecoder | None] = {}
    try:
        for event in dump_events(conn, READER_ID, start):
            if event.type == events.TABLE_MAP:
                table_map = parse_table_map(event.body, mariadb=False)
                decoders[table_map.table_id] = RowDecoder(table_map) if table_map.table.schema == schema else None
            elif event.type in events.ROW_EVENTS:
                decoder = decoders.get(int.from_bytes(event.body[:6], "little"))
                if decoder is not None:
                    befores, afters = decoder.rows(event.type, event.body, 10)
                    for before, after in zip(befores, afters, strict=True):
                        yield event.type, before, after, event.body
            elif event.type == events.XID:
                yield ("commit",)
    finally:
        conn.close()


def _inserted_documents(body: bytes) -> list[tuple[int, bytes | None]]:
    """(id, binary JSON) of each row of a WRITE_ROWS_V2 event of `docs (id INT NOT NULL, j JSON)`, read by hand
    from the layout (the bytes python-mysql-replication is given)."""
    pos = 10 + int.from_bytes(body[8:10], "little") - 2 + 2  # post-header, extra row info, width, column bitmap
    rows: list[tuple[int, bytes | None]] = []
    while pos < len(body):
        nulls, key = body[pos], struct.unpack_from("<i", body, pos + 1)[0]
        pos += 5
        if nulls & 2:
            rows.append((key, None))
            continue
        length = int.from_bytes(body[pos : pos + 4], "little")
        rows.append((key, body[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return rows


def _load_documents(server: LocalServer, schema: str, expressions: list[str]) -> tuple[dict, dict, dict]:
    """Inserts one row per SQL expression into `docs`; returns by id the server's text of each document, capture's
    text of it from the binlog, and its binary form."""
    conn = _database(server, schema)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE src (id INT PRIMARY KEY, ts TIMESTAMP(6) NULL, b BIT(13), bl LONGBLOB, y YEAR)")
            cur.execute(
                "INSERT INTO src VALUES (1, '2024-05-06 07:08:09.123456', b'1010101010101', x'00ff10', 2024), "
                "(2, '1970-01-01 00:00:01', b'0', REPEAT(x'ab', 200), 1901), (3, NULL, NULL, '', 0)"
            )
            cur.execute("CREATE TABLE docs (id INT PRIMARY KEY, j JSON)")
            start = binlog_end(conn)
            for first in range(0, len(expressions), 25):
                values = ", ".join(f"({first + i}, {e})" for i, e in enumerate(expressions[first : first + 25]))
                cur.execute(f"INSERT INTO docs VALUES {values}")
        server_text = {int(i): j for i, j in _server_texts(conn, "SELECT id, j FROM docs")}
    finally:
        conn.close()
    ours: dict[int, str | None] = {}
    raw: dict[int, bytes | None] = {}
    for entry in _binlog(server, schema, start):
        if entry[0] == events.WRITE_ROWS_V2 and len(entry[2]) == 2:
            ours[int(entry[2][0])] = entry[2][1]
            raw.update(_inserted_documents(entry[3]))
    return server_text, ours, raw


# -- a fixed table of every value kind ------------------------------------------------------------------------

# Documents of every value kind; those holding opaque values (which python-mysql-replication prints its own
# way) are listed in OPAQUE_EXAMPLES.
EXAMPLES = [
    # the values
    "CAST('\"abc\"' AS JSON)",
    "CAST(CAST('-12:30:00' AS TIME) AS JSON)",
    "JSON_OBJECT('elapsed', TIMEDIFF('2024-01-03', '2024-01-01'))",
    "JSON_ARRAY(CAST('2024-01-02' AS DATE), CAST('2024-01-02 03:04:05.5' AS DATETIME(2)))",
    "CAST(12345678901234567890.123 AS JSON)",
    "CAST(x'00ff' AS JSON)",
    "CAST(1e308 AS JSON)",
    # literals and scalars at the top
    "CAST('true' AS JSON)", "CAST('false' AS JSON)", "CAST('null' AS JSON)", "CAST('-5' AS JSON)",
    "CAST('1.0' AS JSON)", "CAST('[]' AS JSON)", "CAST('{}' AS JSON)", "CAST('\"\"' AS JSON)",
    # integers at the edges of each stored width, inlined or not
    "JSON_ARRAY(-32768, 32767, 65535, 65536, -32769, -2147483648, 2147483647, 4294967295, 4294967296,"
    " -9223372036854775808, 9223372036854775807, 18446744073709551615, 0, -1)",
    "JSON_OBJECT('i16', -32768, 'u16', 65535, 'i32', -2147483648, 'u32', 4294967295, 'i64', -9223372036854775808,"
    " 'u64', 18446744073709551615)",
    # doubles as MySQL prints them
    "JSON_ARRAY(1e15, 1e14, 123456789012345678e0, 0.1e0, -0.0e0, 5e-324, 1.7976931348623157e308,"
    " 2.2250738585072014e-308, 1e-15, 1e-16, 0.00001e0, 123.456e0, 1e100, 1e-100, 1e-99, 1e101,"
    " 9007199254740993e0, -1.5e-7, 1e16, 1234567890123456.7e0, -1e308, 1e0, -2e0, 0.5e0, 100e0)",
    # strings: escapes, control characters, unicode beyond the BMP, keys in MySQL's order
    "JSON_OBJECT('a\"\\\\', CONCAT('tab\\there', CONVERT(CHAR(1, 31, 127) USING utf8mb4), 'é🚀\\n\\r\\b'),"
    " 'zz', 1, 'b', 2, '', 3, 'é', 4, 'ab', 5)",
    "JSON_ARRAY(CONVERT(CHAR(8232, 8233 USING utf16) USING utf8mb4), '\\\\u0041', '/', '<\\/script>')",
    # opaque values
    "JSON_ARRAY(CAST('838:59:58.999999' AS TIME(6)), CAST('-838:59:59' AS TIME), CAST('00:00:00' AS TIME),"
    " CAST('-00:00:01.5' AS TIME(1)), TIMEDIFF('2024-01-01', '2024-01-20 00:00:00.25'))",
    "JSON_ARRAY(CAST('9999-12-31 23:59:59.999999' AS DATETIME(6)), CAST('1000-01-01' AS DATETIME),"
    " CAST('2024-02-29' AS DATE), CAST('1000-01-01' AS DATE))",
    "JSON_ARRAY(CAST(-0.5 AS DECIMAL(3,1)), CAST(0 AS DECIMAL(65,30)), CAST(1.50 AS DECIMAL(5,2)),"
    " CAST('-99999999999999999999999999999999999.999999999999999999999999999999' AS DECIMAL(65,30)),"
    " CAST('0.000000000000000000000000000001' AS DECIMAL(30,30)), CAST(12345 AS DECIMAL(5,0)))",
    "JSON_ARRAY((SELECT ts FROM src WHERE id = 1), (SELECT b FROM src WHERE id = 1), (SELECT bl FROM src WHERE id = 1),"
    " (SELECT y FROM src WHERE id = 1), (SELECT bl FROM src WHERE id = 2), (SELECT bl FROM src WHERE id = 3))",
    "JSON_ARRAY(CAST(x'' AS BINARY), CAST(REPEAT(x'00', 100) AS BINARY), UNHEX('DEADBEEF'))",
    "JSON_ARRAY(ST_GeomFromText('POINT(1 2)'), ST_GeomFromText('LINESTRING(0 0, 1.5 1e-20)'))",
    # large documents (over 64 KB: four-byte offsets), nesting
    "JSON_OBJECT('big', REPEAT('x', 70000), 'n', JSON_ARRAY(1, 70000, -70000, 4000000000, 1.5e0, 'z', NULL, TRUE))",
    "JSON_ARRAY(REPEAT('é', 40000), JSON_OBJECT('k', -2147483648, 'u', 4294967295, 'l', CAST('true' AS JSON)))",
    "CAST(CONCAT(REPEAT('[', 90), REPEAT(']', 90)) AS JSON)",
    "CAST(CONCAT(REPEAT('{\"a\": ', 80), '1', REPEAT('}', 80)) AS JSON)",
]  # fmt: skip
OPAQUE_EXAMPLES = {1, 2, 3, 4, 5, 20, 21, 22, 23, 24}


def test_every_value_kind_prints_as_the_server_prints_it(mysql: LocalServer) -> None:
    server_text, ours, raw = _load_documents(mysql, "json_kinds", EXAMPLES)
    assert len(server_text) == len(EXAMPLES)
    assert {i: ours.get(i) for i in server_text} == server_text
    # the values, spelled out
    assert server_text[0] == '"abc"'
    assert server_text[1] == '"-12:30:00.000000"'
    assert server_text[2] == '{"elapsed": "48:00:00.000000"}'
    assert server_text[3] == '["2024-01-02", "2024-01-02 03:04:05.500000"]'
    assert server_text[4] == "12345678901234567890.123"
    assert server_text[5] == '"base64:type15:AP8="'
    assert server_text[6] == "1e308"
    # python-mysql-replication agrees on the documents without opaque values
    for i, sql in enumerate(EXAMPLES):
        if i not in OPAQUE_EXAMPLES:
            assert json.loads(ours[i]) == pmr_json_value(raw[i]), sql


# -- a seeded generator of documents ---------------------------------------------------------------------------

_TEXT_POOLS = (
    "abcdefghijklmnopqrstuvwxyz", "ABCXYZ0123456789 _-", '"\\/', "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x1f\x7f",
    "éüßñçøå", "🚀🙂😀𝄞", "\u2028\u2029\ufeff\u00a0", "中文字符", "Жук",
)  # fmt: skip
_INT_EDGES = (
    0, 1, -1, 127, -128, 255, 32767, -32768, 32768, -32769, 65535, 65536, 2147483647, -2147483648, 2147483648,
    -2147483649, 4294967295, 4294967296, 9223372036854775807, -9223372036854775808, 18446744073709551615,
)  # fmt: skip
_DOUBLE_EDGES = (
    0.0, -0.0, 1.0, -1.0, 0.1, 1e15, 1e14, 1e16, 9.999999999999999e14, 1e-15, 1e-16, 5e-324, 2.2250738585072014e-308,
    1.7976931348623157e308, 0.0001, 0.00001, 1e100, 1e-100, 123456789012345678.0, 2.0**53, 2.0**53 + 2, 0.5,
)  # fmt: skip


class _Documents:
    """SQL expressions that build random JSON documents of every kind (seeded: the same run every time)."""

    def __init__(self, seed: int, conn: pymysql.Connection) -> None:
        self.rng = random.Random(seed)
        self.conn = conn
        self.opaque = False  # whether the document being built holds an opaque value

    def text(self, most: int = 12) -> str:
        rng = self.rng
        return "".join(rng.choice(rng.choice(_TEXT_POOLS)) for _ in range(rng.randint(0, most)))

    def string(self, value: str) -> str:
        return "CONVERT(" + self.conn.escape(value) + " USING utf8mb4)"

    def double(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            value = rng.choice(_DOUBLE_EDGES)
        elif roll < 0.6:
            value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if value != value or value in (float("inf"), float("-inf")):
                value = 1.5
        else:
            value = rng.uniform(-10, 10) * 10.0 ** rng.randint(-30, 30)
        literal = repr(value)
        return literal if "e" in literal else literal + "e0"

    def integer(self) -> str:
        rng = self.rng
        if rng.random() < 0.5:
            return str(rng.choice(_INT_EDGES))
        return str(rng.randint(-(2**63), 2**64 - 1) >> rng.randint(0, 63))

    def opaque_value(self) -> str:
        rng = self.rng
        self.opaque = True
        kind = rng.randrange(8)
        if kind == 0:
            return f"CAST('{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}' AS DATE)"
        if kind == 1:
            fsp = rng.randint(0, 6)
            fraction = f".{rng.randrange(10**fsp):0{fsp}d}" if fsp else ""
            sign = rng.choice(("", "-"))
            return f"CAST('{sign}{rng.randint(0, 837)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{fraction}' AS TIME({fsp}))"
        if kind == 2:
            fsp = rng.randint(0, 6)
            fraction = f".{rng.randrange(10**fsp):0{fsp}d}" if fsp else ""
            return (
                f"CAST('{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{fraction}' AS DATETIME({fsp}))"
            )
        if kind == 3:
            precision = rng.randint(1, 65)
            scale = rng.randint(0, min(30, precision))
            whole = "".join(rng.choice("0123456789") for _ in range(precision - scale)) or "0"
            fraction = "".join(rng.choice("0123456789") for _ in range(scale))
            sign = rng.choice(("", "-"))
            return f"CAST('{sign}{whole}{'.' + fraction if fraction else ''}' AS DECIMAL({precision},{scale}))"
        if kind == 4:
            return f"CAST(x'{rng.randbytes(rng.randint(0, 120)).hex()}' AS BINARY)"
        if kind == 5:
            return f"TIMEDIFF('2024-01-{rng.randint(1, 31):02d} 10:00:00', '2024-01-{rng.randint(1, 31):02d} {rng.randint(0, 23):02d}:30:15.25')"
        if kind == 6:
            return f"(SELECT {rng.choice(('ts', 'b', 'bl', 'y'))} FROM src WHERE id = {rng.randint(1, 2)})"
        return self.string(self.text())  # a string in between

    def scalar(self) -> str:
        roll = self.rng.random()
        if roll < 0.25:
            return self.integer()
        if roll < 0.45:
            return self.double()
        if roll < 0.75:
            return self.string(self.text())
        if roll < 0.85:
            return self.rng.choice(("CAST('true' AS JSON)", "CAST('false' AS JSON)", "NULL"))
        return self.opaque_value()

    def value(self, depth: int) -> str:
        roll = self.rng.random()
        if depth < 5 and roll < 0.2:
            return self.array(depth + 1)
        if depth < 5 and roll < 0.4:
            return self.object(depth + 1)
        return self.scalar()

    def array(self, depth: int) -> str:
        return "JSON_ARRAY(" + ", ".join(self.value(depth) for _ in range(self.rng.randint(0, 7))) + ")"

    def object(self, depth: int) -> str:
        members = [f"{self.string(self.text(6))}, {self.value(depth)}" for _ in range(self.rng.randint(0, 7))]
        return "JSON_OBJECT(" + ", ".join(members) + ")"

    def document(self) -> tuple[str, bool]:
        """A document's SQL expression, and whether it holds an opaque value."""
        self.opaque = False
        rng = self.rng
        roll = rng.random()
        if roll < 0.06:  # over 64 KB: the large format
            sql = f"JSON_OBJECT('big', REPEAT({self.string(self.text(3) or 'x')}, 30000), 'rest', {self.object(1)})"
        elif roll < 0.09:
            depth = rng.randint(20, 95)
            sql = "CAST(" + self.conn.escape("[" * depth + json.dumps(self.text()) + "]" * depth) + " AS JSON)"
        elif roll < 0.45:
            sql = self.object(0)
        elif roll < 0.85:
            sql = self.array(0)
        else:  # a scalar document
            sql = f"JSON_EXTRACT(JSON_ARRAY({self.scalar()}), '$[0]')"
        return sql, self.opaque


def test_random_documents_print_as_the_server_prints_them(mysql: LocalServer) -> None:
    with mysql.admin_connection() as conn:
        generator = _Documents(20261126, conn)
        made = [generator.document() for _ in range(400)]
    server_text, ours, raw = _load_documents(mysql, "json_random", [sql for sql, _ in made])
    assert len(server_text) == len(made)
    differing = [(i, made[i][0], server_text[i], ours.get(i)) for i in server_text if ours.get(i) != server_text[i]]
    assert differing == []
    assert sum(len(t or "") > 65536 for t in server_text.values()) >= 10  # the large format was exercised
    compared = crashed = 0
    for i, (_, opaque) in enumerate(made):
        if opaque or raw[i] is None:  # python-mysql-replication prints opaque values its own way
            continue
        try:
            theirs = pmr_json_value(raw[i])
        except (ValueError, UnicodeDecodeError, IndexError):
            crashed += 1
            continue
        assert json.loads(ours[i]) == theirs, made[i][0]
        compared += 1
    assert compared > 150, (compared, crashed)


# -- PARTIAL_JSON: diffs applied to the before-image -----------------------------------------------------------

PARTIAL_ROWS = [
    "(1, '{\"a\": 1, \"arr\": [1, 2, 3], \"obj\": {\"k\": \"v\", \"n\": [true, null]}}', 1, '[1, {\"x\": 2}, 3]')",
    "(2, '[\"a\", {\"b\": [1, 2]}, 3.5]', 2, '{\"k\": [1, 2, 3]}')",
    "(3, NULL, 3, '{\"only\": \"k\"}')",
    "(4, '{\"gone\": true}', 4, NULL)",
    "(5, JSON_OBJECT('big', REPEAT('y', 70000), 'n', 1, 'list', JSON_ARRAY(1, 2, 3)), 5, '[]')",
]
PARTIAL_TRANSACTIONS = [
    ["UPDATE p SET j = JSON_SET(j, '$.a', 5, '$.new', 'x') WHERE id = 1"],
    [
        "UPDATE p SET j = JSON_REPLACE(j, '$.arr[1]', JSON_OBJECT('deep', JSON_ARRAY(1, 2))), k = JSON_REMOVE(k, '$[0]')"
        " WHERE id = 1",
        "UPDATE p SET j = JSON_SET(j, '$[1].b[0]', 'first', '$[1].c', CAST('2024-01-02' AS DATE)) WHERE id = 2",
    ],
    [  # partial updates, a whole-document update and NULL documents in one transaction
        "UPDATE p SET j = JSON_SET(j, '$.arr[100]', 'appended', '$.\"key with space\"', 1, '$.é', 'accent',"
        " '$.obj.zz', JSON_ARRAY()) WHERE id = 1",
        "UPDATE p SET j = '{\"whole\": [1, 2]}' WHERE id = 2",
        "UPDATE p SET j = JSON_SET(j, '$.whole[0]', 10, '$.whole[last]', 20) WHERE id = 2",
        "UPDATE p SET k = JSON_SET(k, '$.more', TIMEDIFF('2024-01-03', '2024-01-01')) WHERE id = 3",
        "UPDATE p SET j = NULL, k = JSON_ARRAY('now', 'set') WHERE id = 4",
    ],
    [
        "UPDATE p SET j = JSON_REMOVE(j, '$.a', '$.arr[0]', '$.obj.n[1]') WHERE id = 1",
        "UPDATE p SET j = JSON_SET(j, '$.n', 2.5e0, '$.list[1]', CAST(1.50 AS DECIMAL(5,2)), '$.t',"
        " CAST('-12:30:00.5' AS TIME(1)), '$.b', CAST(x'00ff' AS BINARY)) WHERE id = 5",
        "UPDATE p SET j = JSON_SET(j, '$.b', 1, '$.aaa', 2, '$.zz', 3, '$.a', 4) WHERE id = 1",
    ],
    [
        "UPDATE p SET j = JSON_OBJECT('from', 'null') WHERE id = 3",
        "UPDATE p SET j = JSON_REPLACE(j, '$.from', 'a document'), n = n + 1 WHERE id IN (1, 3)",
        "UPDATE p SET j = JSON_REPLACE(j, '$.absent', 1) WHERE id = 2",  # changes nothing
        "UPDATE p SET j = JSON_REMOVE(j, '$.list') WHERE id = 5",
    ],
]


def test_partial_json_updates_give_the_servers_documents(mysql: LocalServer) -> None:
    """Every update's before-image (the server's own full document) equals the after-image capture computed
    for the change before it, and the rows after each transaction equal the server's SELECT."""
    conn = _database(mysql, "json_partial")
    snapshots: list[dict[str, list[str | None]]] = []
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE p (id INT PRIMARY KEY, j JSON, n INT, k JSON)")
            start = binlog_end(conn)
            cur.execute(f"INSERT INTO p VALUES {', '.join(PARTIAL_ROWS)}")
            snapshots.append(_snapshot(conn))
            cur.execute("SET SESSION binlog_row_value_options = 'PARTIAL_JSON'")
            for transaction in PARTIAL_TRANSACTIONS:
                cur.execute("BEGIN")
                for statement in transaction:
                    cur.execute(statement)
                cur.execute("COMMIT")
                snapshots.append(_snapshot(conn))
    finally:
        conn.close()

    state: dict[str, list[str | None]] = {}
    commits = partial_events = 0
    for entry in _binlog(mysql, "json_partial", start):
        if entry[0] == "commit":
            assert state == snapshots[commits], f"after transaction {commits}"
            commits += 1
            continue
        kind, before, after, _ = entry
        partial_events += kind == events.PARTIAL_UPDATE_ROWS
        if before is not None:
            assert before == state[before[0]]
        if after is not None:
            state[after[0]] = after
    assert commits == len(snapshots)
    assert partial_events >= len(PARTIAL_TRANSACTIONS)


def _snapshot(conn: pymysql.Connection) -> dict[str, list[str | None]]:
    return {row[0]: row for row in _server_texts(conn, "SELECT id, j, n, k FROM p")}  # type: ignore[misc]


# -- no server: the rules on their own ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [  # as MySQL 9.7 prints them
        (1e308, "1e308"), (1e15, "1e15"), (1e14, "100000000000000.0"), (0.0001, "0.0001"), (1e-16, "1e-16"),
        (1e-15, "0.000000000000001"), (-0.0, "-0.0"), (0.0, "0.0"), (5e-324, "5e-324"), (1.0, "1.0"),
        (123456789012345678.0, "1.2345678901234568e17"), (1234567890123456.7, "1234567890123456.8"),
        (-1.5e-7, "-0.00000015"), (2.0**53, "9.007199254740992e15"),
        (1e100, "1e100"), (1e-100, "1e-100"), (-1.7976931348623157e308, "-1.7976931348623157e308"),
    ],
)  # fmt: skip
def test_doubles_print_as_mysql_prints_them(value: float, text: str) -> None:
    assert double_text(value) == text
    assert json_double_text(value) == text


def test_the_shortcut_for_doubles_is_mysqls_form() -> None:
    """double_text takes Python's repr where it writes what my_gcvt writes: checked over random doubles there."""
    rng = random.Random(5)
    for _ in range(100_000):
        value = rng.choice((1, -1)) * rng.uniform(1, 10) * 10.0 ** rng.randint(-4, 14)
        if 1e-4 <= abs(value) < 1e15:
            assert double_text(value) == json_double_text(value), value
    for value in (1e-4, -1e-4, 999999999999999.9, 0.0, -0.0, 0.1, 100.0, 2.5):
        assert double_text(value) == json_double_text(value), value


def test_documents_built_by_hand() -> None:
    small_object = bytes.fromhex("00" "0200" "1600" "12000100" "13000100" "050100" "0c1400" "61" "62" "0178")
    assert json_text(small_object) == '{"a": 1, "b": "x"}'
    assert json_text(b"") == "null"  # what a JSON column added NOT NULL holds in older rows
    assert json_text(bytes.fromhex("0c03616263")) == '"abc"'
    with pytest.raises(InvalidJson):
        json_text(bytes.fromhex("0c05616263"))  # a string cut short
    with pytest.raises(InvalidJson):
        json_text(bytes.fromhex("0e00"))  # no such type


def test_paths_as_the_server_writes_them() -> None:
    assert parse_path('$.a."b c"[3][last][last-2].é') == ["a", "b c", (3, False), (0, True), (2, True), "é"]
    assert parse_path('$."a\\"b"') == ['a"b']
    with pytest.raises(InvalidJson):
        parse_path("$.a[*]")


def _doc(text_of_binary: str) -> Any:
    return document(bytes.fromhex(text_of_binary))


def test_diffs_that_do_not_apply_are_refused() -> None:
    array = "02" "0200" "0a00" "050100" "050200"  # [1, 2]
    true = document(bytes.fromhex("0401"))
    assert node_text(apply_diff(_doc(array), INSERT, [(5, False)], true)) == "[1, 2, true]"  # type: ignore[arg-type]
    assert node_text(apply_diff(_doc(array), REPLACE, [(0, True)], true)) == "[1, true]"  # type: ignore[arg-type]
    assert apply_diff(_doc(array), REPLACE, [(2, False)], true) is None  # no third element
    assert apply_diff(_doc(array), REMOVE, ["a"], None) is None  # no member of an array
    assert apply_diff(_doc(array), REPLACE, [], true) is None  # never the root
    remove_missing = bytes([REMOVE, 4]) + b"$[9]"
    with pytest.raises(InvalidJson, match=r"REMOVE at \$\[9\] does not apply"):
        apply_diffs(_doc(array), remove_missing)
