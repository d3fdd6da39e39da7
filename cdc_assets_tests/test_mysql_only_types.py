"""Types only Oracle MySQL has, or names differently: VECTOR (MySQL 9), captured as an array of float32 with every
value exact, and GEOMETRYCOLLECTION, which MySQL's information_schema calls `geomcollection`."""

from __future__ import annotations

import base64
import struct

import pyarrow as pa
import pytest

from cdc_assets.core.mysql_types import VECTOR_TYPE, ColumnSpec, arrow_type, decode_column, vector_array
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.sinks.events import json_values
from cdc_assets.source.rows import read_source_table, source_shapes
from cdc_assets.source.server import binlog_end
from cdc_assets.stages.changes.rows import cast_column
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.snapshot.run import take_snapshot
from cdc_assets.verification.compare import compare_tables
from cdc_assets.verification.row_hashes import content_checksum
from cdc_assets_tests.conftest import CdcEnv, on_spark
from cdc_assets_tests.env_settings import source_now
from cdc_assets_tests.pmr_reference import reference_events
from cdc_assets_tests.stage_runs import capture_and_apply, source_and_current
from cdc_assets_tests.test_binlog_decoder import _decoded, _without_binary_json

# float32s at their edges: the largest, the smallest subnormal, negative zero, one not exact in decimal, -1
EDGES = [3.4028234663852886e38, 1e-45, -0.0, 0.1, -1.0]
VECTORS = {
    1: EDGES,
    2: [1.5, -2.0, 3.25],
    3: None,
    5: [float(i) / 7 for i in range(1024)],
}


def _float32s(values: list[float]) -> list[float]:
    """The values as float32 holds them (what the lakehouse must give back, bit for bit)."""
    return list(struct.unpack(f"<{len(values)}f", struct.pack(f"<{len(values)}f", *values)))


def _bytes(values: list[float] | None) -> bytes | None:
    return None if values is None else struct.pack(f"<{len(values)}f", *values)


def test_vector_values_decode_exactly_from_canonical_text() -> None:
    column = ColumnSpec("v", "vector")
    assert arrow_type(column) == pa.list_(pa.float32())
    texts = pa.array([None if v is None else base64.b64encode(_bytes(v)).decode() for v in VECTORS.values()])
    decoded = decode_column(column, texts).to_pylist()
    assert decoded == [None if v is None else _float32s(v) for v in VECTORS.values()]
    assert str(decoded[0][2]) == "-0.0"
    assert vector_array([_bytes(EDGES)]).equals(decode_column(column, texts.slice(0, 1)))
    # the checksums the comparisons report see every bit of a vector
    one, other = (pa.table({"v": vector_array([_bytes(v)])}) for v in ([1.0, 2.0], [1.0, 2.0000002]))
    assert content_checksum(one) != content_checksum(other)
    # a sink's message holds a JSON array of the numbers; a VECTOR column modified to text keeps them as JSON
    vectors = vector_array([_bytes([1.5, -2.0]), None])
    assert json_values(vectors) == [[1.5, -2.0], None]
    assert cast_column(vectors, pa.string()).to_pylist() == ["[1.5, -2.0]", None]


@pytest.mark.parametrize("source", ["mysql"], indirect=True)
@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_vector_columns_are_captured_exactly(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, engine: str, spark: object
) -> None:
    """Inserts, an update and a delete of VECTOR values reach current state and the change log bit for bit, and so
    does the empty vector a NOT NULL VECTOR column added later gives existing rows; a VECTOR table left out of capture
    does not stop the others."""
    monkeypatch.setenv("CDC_EXCLUDE_TABLES", f"{cdc.database}.left_out")
    cdc.execute(
        "CREATE TABLE vec (id INT PRIMARY KEY, v VECTOR(1024), note VARCHAR(10))",
        "CREATE TABLE left_out (id INT PRIMARY KEY, v VECTOR(2))",
        "CREATE TABLE plain (id INT PRIMARY KEY)",
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        for key, values in VECTORS.items():
            cur.execute("INSERT INTO vec VALUES (%s, %s, 'x')", (key, _bytes(values)))
        cur.execute("INSERT INTO left_out VALUES (1, STRING_TO_VECTOR('[1, 2]'))")
        cur.execute("INSERT INTO plain VALUES (1)")
        cur.execute("UPDATE vec SET v = %s WHERE id = 2", (_bytes([9.5, -0.0]),))
        cur.execute("DELETE FROM vec WHERE id = 3")
        cur.execute("ALTER TABLE vec ADD COLUMN w VECTOR(2) NOT NULL")
        cur.execute("INSERT INTO vec VALUES (6, NULL, 'y', STRING_TO_VECTOR('[1, 2]'))")

    report = capture_and_apply(cdc, on_spark(lambda: spark) if engine == "spark" else None)

    assert sorted(report.tables) == [f"{cdc.database}.plain", f"{cdc.database}.vec"]
    source_rows, current = source_and_current(cdc, "vec")
    assert current.schema.field("v").type == pa.list_(pa.float32())
    assert current.equals(source_rows)  # the source read as verify reads it: binary over the text protocol
    expected = {k: None if v is None else _float32s(v) for k, v in VECTORS.items() if k != 3}
    expected[2] = _float32s([9.5, -0.0])
    expected[6] = None
    assert dict(zip(current["id"].to_pylist(), current["v"].to_pylist(), strict=True)) == expected
    assert current["w"].to_pylist() == [[], [], [], [1.0, 2.0]]
    assert content_checksum(current) == content_checksum(source_rows)
    log = cdc.lakehouse.open(CHANGES, TableRef(cdc.database, "vec"))
    changes = read_query(log, "SELECT id, v, _cdc_op FROM log ORDER BY _cdc_seq", "log").to_pylist()
    assert [(c["id"], c["_cdc_op"]) for c in changes if c["_cdc_op"] != "alter"][-3:] == [
        (2, "update"),
        (3, "delete"),
        (6, "insert"),
    ]
    assert next(c["v"] for c in changes if c["id"] == 1) == _float32s(EDGES)


@pytest.mark.parametrize("source", ["mysql"], indirect=True)
def test_a_geometrycollection_column_is_snapshotted_and_captured(cdc: CdcEnv, spark: object) -> None:
    """MySQL's information_schema names GEOMETRYCOLLECTION `geomcollection`: the source's shape of such a table is
    read (snapshot, checks, verify all start there), and its rows load and follow the binlog."""
    cdc.execute(
        "CREATE TABLE shapes (id INT PRIMARY KEY, g GEOMETRYCOLLECTION, p POINT)",
        "INSERT INTO shapes VALUES (1, ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 2), LINESTRING(0 0, 1 1))'),"
        " ST_GeomFromText('POINT(3 4)')), (2, NULL, NULL)",
    )
    table = TableRef(cdc.database, "shapes")
    with cdc.admin() as conn:
        shape = source_shapes(conn, [table])[table]
    assert shape is not None and [c.type for c in shape.columns] == ["int", "geometry", "geometry"]
    # On Spark (tasks by key range); the Arrow snapshot starts from the same source shapes.
    settings = source_now()
    report = take_snapshot(settings, cdc.lakehouse, [str(table)], transforms=on_spark(lambda: spark))
    assert report.rows == {str(table): 2}
    cdc.execute("INSERT INTO shapes VALUES (3, ST_GeomFromText('GEOMETRYCOLLECTION(POINT(5 6))'), NULL)")
    cdc.execute("UPDATE shapes SET p = ST_GeomFromText('POINT(7 8)') WHERE id = 2")
    capture_and_apply(cdc)
    source_rows, current = source_and_current(cdc, "shapes")
    assert current.equals(source_rows) and current.num_rows == 3
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, ST_AsBinary(g) FROM shapes ORDER BY id")
        wkb = dict(cur.fetchall())
    rows = read_current(cdc.lakehouse, table, ["id", "g"]).to_pylist()
    assert {r["id"]: r["g"] for r in rows} == wkb  # plain WKB, as ST_AsBinary gives it


@pytest.mark.parametrize("source", ["mysql"], indirect=True)
def test_a_keyless_table_with_a_vector_keeps_its_duplicates(cdc: CdcEnv) -> None:
    """Without a key, rows are told apart by all their values, a VECTOR's included: Arrow neither groups nor sorts by
    a list, so the copies are counted, and the tables compared, by its elements' bytes."""
    cdc.execute(
        "CREATE TABLE k (a INT, v VECTOR(2))",
        "INSERT INTO k VALUES (1, STRING_TO_VECTOR('[1, 2]')), (1, STRING_TO_VECTOR('[1, 2]')),"
        " (1, STRING_TO_VECTOR('[1, 2.5]')), (2, NULL), (3, STRING_TO_VECTOR('[0, -1]'))",
        "UPDATE k SET v = STRING_TO_VECTOR('[7, 8]') WHERE a = 3",
        "DELETE FROM k WHERE a = 2",
    )
    capture_and_apply(cdc)
    cdc.execute("DELETE FROM k WHERE v = STRING_TO_VECTOR('[1, 2.5]')", "INSERT INTO k VALUES (4, NULL)")
    capture_and_apply(cdc)
    source_rows, current = source_and_current(cdc, "k")
    diff = compare_tables(TableRef(cdc.database, "k"), source_rows, current, [])
    assert diff.ok and diff.source_rows == diff.lakehouse_rows == 4, diff.describe()
    assert sorted(map(str, current.to_pylist()), key=str) == sorted(map(str, source_rows.to_pylist()), key=str)
    changed = source_rows.set_column(1, "v", vector_array([_bytes([1.0, 2.0])] * 2 + [_bytes([7.0, 8.5]), None]))
    assert not compare_tables(TableRef(cdc.database, "k"), changed, current, []).ok  # one element differs: seen


# Tables mixing VECTORs with every other kind of column the binlog's optional metadata describes: text (the charsets),
# binary, ENUM/SET (their own charsets and members), JSON, geometry. `mixed`'s VECTORs stand first, in the middle and
# last, and MySQL states its charsets as a default (binary) with exceptions; the issue's `v` as one charset per column.
# Each column: its definition, its lakehouse type, its value in rows 1 to 4 (SQL).
_V = VECTOR_TYPE
MIXED_TABLES: dict[str, list[tuple[str, str, pa.DataType, tuple[str, ...]]]] = {
    "v": [
        ("id", "INT PRIMARY KEY", pa.int32(), ("1", "2", "3", "4")),
        ("emb", "VECTOR(3)", _V, ("STRING_TO_VECTOR('[1, 2, 3]')", "NULL", "STRING_TO_VECTOR('[-0, 0.1, 2.5]')", "NULL")),
        ("label", "VARCHAR(10)", pa.string(), ("'a'", "'é🚀'", "NULL", "'d'")),
    ],
    "mixed": [
        ("v1", "VECTOR(2)", _V, ("STRING_TO_VECTOR('[1, 2]')", "NULL", "STRING_TO_VECTOR('[-0, 3.5]')", "NULL")),
        ("id", "INT PRIMARY KEY", pa.int32(), ("1", "2", "3", "4")),
        ("c", "CHAR(3)", pa.string(), ("'abc'", "'é'", "NULL", "'x'")),
        ("vc", "VARCHAR(20)", pa.string(), ("'héllo 🚀'", "''", "NULL", "'y'")),
        ("v2", "VECTOR(3)", _V, ("STRING_TO_VECTOR('[0.5, -1, 3]')", "NULL", "STRING_TO_VECTOR('[1, 0, 1]')", "NULL")),
        ("t", "TEXT CHARACTER SET latin1", pa.string(), ("'café'", "'ÿ'", "NULL", "'z'")),
        ("w", "VARCHAR(5) CHARACTER SET cp1251", pa.string(), ("'Жук'", "'я'", "NULL", "'w'")),
        ("b", "BINARY(4)", pa.binary(), ("x'00ff'", "x'01020304'", "NULL", "x'00'")),
        ("vb", "VARBINARY(8)", pa.binary(), ("x'0102'", "x''", "NULL", "x'ff'")),
        ("bl", "BLOB", pa.binary(), ("x'deadbeef'", "x'00'", "NULL", "x'01'")),
        ("e", "ENUM('a', 'b') CHARACTER SET latin1", pa.string(), ("'b'", "'a'", "NULL", "'a'")),
        ("s", "SET('x', 'y')", pa.string(), ("'x,y'", "''", "NULL", "'y'")),
        ("j", "JSON", pa.string(), ("'{\"a\": [1, \"é\"]}'", "'[]'", "NULL", "'1'")),
        ("g", "POINT", pa.binary(), ("ST_GeomFromText('POINT(1 2)')", "ST_GeomFromText('POINT(-3 4.5)')", "NULL",
                                     "ST_GeomFromText('POINT(0 0)')")),
        ("v3", "VECTOR(1)", _V, ("STRING_TO_VECTOR('[7]')", "NULL", "STRING_TO_VECTOR('[8]')", "NULL")),
    ],
}  # fmt: skip
# Row 1 updated (a VECTOR and a text column each time: its twin's update must change a row too), row 4 deleted.
MIXED_UPDATES = {
    "v": [("emb", "STRING_TO_VECTOR('[4, 5, 6]')"), ("label", "'ä'")],
    "mixed": [("v1", "NULL"), ("t", "'über'"), ("v2", "STRING_TO_VECTOR('[9, 8, 7]')"), ("bl", "x'00'")],
}
PLAIN = "_plain"  # each table's twin without its VECTORs, which python-mysql-replication can read


def _mixed_statements(table: str, vectors: bool) -> list[str]:
    """The CREATE, INSERT, UPDATE and DELETE of a `MIXED_TABLES` table, or of its twin without VECTOR columns."""
    columns = [c for c in MIXED_TABLES[table] if vectors or not c[1].startswith("VECTOR")]
    name = table if vectors else table + PLAIN
    rows = zip(*(c[3] for c in columns), strict=True)
    updates = [f"{c} = {v}" for c, v in MIXED_UPDATES[table] if c in {column[0] for column in columns}]
    return [
        f"CREATE TABLE {name} ({', '.join(f'{c[0]} {c[1]}' for c in columns)})",
        f"INSERT INTO {name} ({', '.join(c[0] for c in columns)}) VALUES "
        + ", ".join(f"({', '.join(row)})" for row in rows),
        f"UPDATE {name} SET {', '.join(updates)} WHERE id = 1",
        f"DELETE FROM {name} WHERE id = 4",
    ]


def _as_plain_twin(events: list[tuple]) -> list[tuple]:
    """Our decoder's events of the VECTOR tables as their twins' would be: VECTOR columns and values left out, each
    table named as its twin; the twins' own events left out."""
    out: list[tuple] = []
    keep: list[int] | None = None
    for event in events:
        if event[0] == "map":
            _, schema, table, columns, key = event
            keep = None if table.endswith(PLAIN) else [i for i, c in enumerate(columns) if c.type != "vector"]
            if keep is not None:
                out.append(("map", schema, table + PLAIN, tuple(columns[i] for i in keep), key))
        elif keep is not None:
            op, before, after = event
            out.append((op, *(None if image is None else [image[i] for i in keep] for image in (before, after))))
    return out


@pytest.mark.parametrize("source", ["mysql"], indirect=True)
def test_vector_beside_other_columns_keeps_every_column_type(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL 9 counts a VECTOR among the character columns of a table map's charsets (its binary charset): the
    columns after one keep their own charset, so a VARCHAR beside a VECTOR stays text (issue 42). One sync of
    `MIXED_TABLES` succeeds, its checks and `verify` find them equal, every column lands in its type with the source's
    rows; our decoder reads every other column as python-mysql-replication reads the same table without VECTORs."""
    monkeypatch.setenv("CDC_EXCLUDE_TABLES", f"{cdc.database}.*{PLAIN}")
    with cdc.admin() as conn, conn.cursor() as cur:
        start = binlog_end(conn)
        for table in MIXED_TABLES:
            for statements in zip(_mixed_statements(table, True), _mixed_statements(table, False), strict=True):
                for statement in statements:
                    cur.execute(statement)
        end = binlog_end(conn)
    url = MySQLUrl.parse(cdc.server.reader_url())
    ours = _as_plain_twin(_decoded(url, start, end, mariadb=False))
    theirs = reference_events(url, 4252, start, end, only_tables=[t + PLAIN for t in MIXED_TABLES])
    assert len(theirs) == 2 * (3 + 4 + 1 + 1)  # per table: a map before each of 3 row events; 4 + 1 + 1 rows
    assert _without_binary_json(ours) == _without_binary_json(theirs)

    assert cdc.sync() == 0
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    assert sorted(str(r.table) for r in results) == sorted(f"{cdc.database}.{t}" for t in MIXED_TABLES)
    for table, columns in MIXED_TABLES.items():
        ref = TableRef(cdc.database, table)
        current = read_current(cdc.lakehouse, ref, [c[0] for c in columns])
        assert current is not None
        assert {f.name: f.type for f in current.schema} == {c[0]: c[2] for c in columns}
        with cdc.admin() as conn:
            shape = source_shapes(conn, [ref])[ref]
            assert shape is not None
            source_rows = read_source_table(conn, ref, list(shape.columns))
        assert source_rows.num_rows == 3
        assert current.sort_by("id").cast(source_rows.schema).equals(source_rows.sort_by("id"))
