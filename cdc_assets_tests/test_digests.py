"""Digests by key range (verification/digests.py): the source and the lakehouse write every value's text alike, so
equal tables have equal digests, and a row changed behind the pipeline's back shows in exactly its range."""

from __future__ import annotations

import datetime as dt
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.table import TableFeatures

from cdc_assets.cli import main
from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.mysql_types import ColumnSpec
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake import file_digests, files
from cdc_assets.lake.layout import CURRENT, file_digests_folder
from cdc_assets.lake.store import Lakehouse, ObjectStore
from cdc_assets.source import server as source
from cdc_assets.source.rows import source_shapes
from cdc_assets.stages.rewrite.layers import REWRITE_KEY, purge_old_versions
from cdc_assets.verification import digests
from cdc_assets_tests.conftest import CdcEnv

TABLE = """CREATE TABLE d (
  id BIGINT PRIMARY KEY, u BIGINT UNSIGNED, i8 TINYINT, dec38 DECIMAL(38,10), dec65 DECIMAL(65,30), b64 BIT(64),
  flag BOOL, t0 TIME, t6 TIME(6), dt0 DATETIME, dt3 DATETIME(3), dt6 DATETIME(6), ts6 TIMESTAMP(6) NULL, da DATE,
  y YEAR, e ENUM('a','c 🚀'), s SET('x','y'), j JSON, bl BLOB, bn BINARY(4), l1 VARCHAR(20) CHARACTER SET latin1,
  emoji VARCHAR(20), geo GEOMETRY
)"""
ROWS = [
    "(1, 18446744073709551615, -128, 9999999999999999999999999999.9999999999, -1.5, b'1111111111111111111111111111111111111111111111111111111111111111',"
    " TRUE, '-838:59:59', '12:30:00.123456', '9999-12-31 23:59:59', '2024-02-29 12:00:00.5', '1000-01-01 00:00:00.000001',"
    " '2038-01-19 03:14:07.999999', '2024-02-29', 2155, 'c 🚀', 'x,y', '{\"a\": [1, 2.5, \"é\"]}', x'00FF00', x'01',"
    " 'caf\\xe9', '🚀🙂', ST_GeomFromText('POINT(1 2)'))",
    "(2" + ", NULL" * 22 + ")",
    "(3, 0, 0, 0, 0, b'0', FALSE, '00:00:00', '-00:00:00.000001', '2024-01-01 00:00:00', '2024-01-01 00:00:00.000', "
    "'2024-01-01 00:00:00.000000', '1970-01-01 00:00:01', '1000-01-01', 0, 'a', '', '\"s\"', x'', x'00000000', '', '', "
    "ST_GeomFromText('LINESTRING(0 0, 1 1)'))",
]


@pytest.mark.both_sources
def test_equal_tables_have_equal_digests_and_a_drifted_row_shows_in_its_range(cdc: CdcEnv, monkeypatch) -> None:
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 4)
    monkeypatch.setattr(digests, "ROWS_PER_PART", 2)
    cdc.execute("SET SESSION time_zone = '+00:00'", TABLE)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET NAMES utf8mb4")
        for row in ROWS:
            cur.execute(f"INSERT INTO d VALUES {row}".replace("%", "%%"))
        cur.execute("INSERT INTO d (id, emoji) SELECT seq + 10, CONCAT('row ', seq) FROM " + cdc.numbers(20))
    assert cdc.sync() == 0
    table = TableRef(cdc.database, "d")
    url = source.MySQLUrl.parse(cdc.server.reader_url())
    conn = source.connect(url)
    try:
        shape = source_shapes(conn, [table])[table]
        assert shape is not None and digests.digestible(shape, ColumnPolicy())  # no column policy: the server writes every text
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        lake = digests.lake_rows(cdc.lakehouse, table, current, shape)
        ranges = digests.parts_of_table(lake)
        assert len(ranges) == 6 and ranges[0][0] is None and ranges[-1][1] is None, ranges
        # every type's text written alike on both sides: the whole table's digests are equal, range by range
        assert digests.source_digests(url, shape, ranges) == digests.lake_digests(lake.keys, lake.crcs, ranges)
        current.update(predicate="id = 15", updates={"emoji": "'drifted'"})
        current.delete("id = 3")
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        lake = digests.lake_rows(cdc.lakehouse, table, current, shape)
        differing = digests.differing_parts(digests.source_digests(url, shape, ranges), digests.lake_digests(lake.keys, lake.crcs, ranges), ranges)
        assert len(differing) == 2, (differing, ranges)
        parts = digests.parts_within(lake, differing)
        assert len(parts) > len(differing) and all(any(_inside(p, r) for r in differing) for p in parts), parts
        # the ranges cut by the data files' statistics (the source digests while the lakehouse's rows are read), or
        # by the lakehouse's keys where a file has none: the same keys found either way
        by_statistics = digests.narrowed(url, conn, cdc.lakehouse, table, current, shape)
        with monkeypatch.context() as m:
            m.setattr(digests, "ranges_by_file_statistics", lambda *_: None)
            by_keys = digests.narrowed(url, conn, cdc.lakehouse, table, current, shape)
        assert (by_keys.ranges, by_keys.differing) == (6, 2), by_keys
        assert by_statistics.ranges >= 4 and 1 <= by_statistics.differing <= 2, by_statistics
        for narrowed in (by_statistics, by_keys):
            keys = {k for (k,) in narrowed.keys}
            assert {3, 15} <= keys and len(keys) <= 2 * (digests.ROWS_PER_PART + 1), keys
    finally:
        conn.close()


def loaded_in_pieces(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, name: str, rows: int, piece_rows: int) -> TableRef:
    """A table of `rows` rows (id, v, n), its current state loaded by `snapshot` as files of `piece_rows` to twice
    as many rows: many data files, as a large table's."""
    monkeypatch.setattr(files, "FIRST_PIECE_ROWS", piece_rows)
    monkeypatch.setenv("CDC_CURRENT_FILE_KB", "1")
    cdc.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(8,2))")
    cdc.execute(f"INSERT INTO {name} SELECT seq, CONCAT('v', seq), seq / 4 FROM " + cdc.numbers(rows))
    assert cdc.sync() == 0 and main(["snapshot", f"{cdc.database}.{name}"]) == 0
    return TableRef(cdc.database, name)


@pytest.mark.both_sources
def test_a_data_files_digests_are_kept_until_the_file_or_the_columns_change(cdc: CdcEnv, monkeypatch) -> None:
    """A repair writes the digest texts of a file once: the next reads them back for the files the table still holds,
    writes them for a file written since (a drift rewrites a file under a new name), and so still finds the drift;
    columns changed or a rewrite that purges rows from storage leave nothing kept to be read."""
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 10)
    monkeypatch.setattr(digests, "ROWS_PER_PART", 3)
    table = loaded_in_pieces(cdc, monkeypatch, "k", 90, 15)
    url = source.MySQLUrl.parse(cdc.server.reader_url())
    conn = source.connect(url)
    kept = cdc.lakehouse.store.list_keys
    folder = file_digests_folder(table.path)

    def narrowed() -> digests.Narrowed:
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        shape = source_shapes(conn, [table])[table]
        assert shape is not None
        return digests.narrowed(url, conn, cdc.lakehouse, table, current, shape)

    try:
        first = narrowed()
        assert first.files >= 3 and first.files_kept == 0 and not first.keys, first
        assert len(kept(folder)) == 1  # the files' rows share an object
        again = narrowed()
        assert (again.files, again.files_kept, again.keys) == (first.files, first.files, set()), again
        kept_all = f"{first.files} of {first.files} data files' digests kept from an earlier repair"
        assert kept_all in again.describe(), again.describe()
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        current.update(predicate="id = 45", updates={"v": "'drifted'"})  # its file written again
        drifted = narrowed()
        assert drifted.files_kept == drifted.files - 1 and (45,) in drifted.keys, drifted
        assert narrowed().files_kept == drifted.files  # the rewritten file's rows kept too
        # a data file written again in place, outside Delta (its log's size and time unchanged): digested again
        current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))
        first_file, other_file = sorted(current.file_uris())[:2]
        original = Path(first_file).read_bytes()
        shutil.copyfile(other_file, first_file)
        overwritten = narrowed()
        assert overwritten.files_kept == overwritten.files - 1 and len(overwritten.keys) > 1, overwritten
        Path(first_file).write_bytes(original)  # delta-rs reads a file's footer where its log says it ends
        # a rewrite that purges rows (forget) committed while a repair digests: nothing the repair wrote is kept
        shape = source_shapes(conn, [table])[table]
        assert shape is not None
        purge_old_versions(cdc.lakehouse, CURRENT, table)
        digesting = DeltaTable(cdc.lakehouse.table_uri(CURRENT, table))  # the version a repair began digesting
        rewrite = CommitProperties(custom_metadata={REWRITE_KEY: "true"})
        DeltaTable(cdc.lakehouse.table_uri(CURRENT, table)).update(predicate="id = 46", updates={"v": "'v46'"}, commit_properties=rewrite)
        digests.lake_rows(cdc.lakehouse, table, digesting, shape)
        assert kept(folder) == []
        assert main(["repair", f"{cdc.database}.k"]) == 0  # equal again
        cdc.execute("ALTER TABLE k ADD COLUMN w INT")
        assert cdc.sync() == 0
        widened = narrowed()  # every text holds the new column now
        assert widened.files_kept == 0 and not widened.keys, widened
        assert kept(folder) and narrowed().files_kept == widened.files
        # deletion vectors allowed: a file's rows are no longer read alone; the table is read whole, nothing kept
        DeltaTable(cdc.lakehouse.table_uri(CURRENT, table)).alter.add_feature(TableFeatures.DeletionVectors, True)
        whole = narrowed()
        assert (whole.files, whole.keys, whole.source_rows, whole.lake_rows) == (0, set(), 90, 90), whole
        assert kept(folder) == []
        narrowed()  # and kept again? never: still read whole
        assert kept(folder) == []
        purge_old_versions(cdc.lakehouse, CURRENT, table)  # as forget's rewrite does
        assert kept(folder) == []
        cdc.lakehouse.store.put(f"{folder}/x.parquet", b"left over")
        cdc.lakehouse.delete_table(CURRENT, table)
        assert kept(folder) == []
    finally:
        conn.close()


def _objects(store: ObjectStore, table: TableRef, *objects: list[pa.Table]) -> None:
    """Digest rows kept as the objects given, one object each."""
    for parts in objects:
        writer = file_digests.FileDigestWriter(store, table)
        for part in parts:
            writer.add(part)
        writer.flush()


def test_kept_digest_objects_hold_mostly_present_files(tmp_path) -> None:
    """An object none of whose files the table holds is removed; one holding more rows of removed files than of
    present ones is written again with the present ones' rows only; rows under one name are read once."""
    store, table = Lakehouse(str(tmp_path)).store, TableRef("s", "t")

    def rows(name: str, n: int) -> pa.Table:
        keys, crcs = pa.array(range(n), pa.int64()), pa.array([7] * n, pa.uint32())
        return pa.table({"name": [name] * n, "key": keys, "crc": crcs})

    _objects(store, table, [rows("a", 3), rows("b", 1)], [rows("c", 2)], [rows("d", 2), rows("a", 3)])
    assert len(store.list_keys(file_digests_folder(table.path))) == 3
    taken: list[pa.Table] = []
    kept = file_digests.load_file_digests(store, table, {"a", "b", "d"}, pa.int64(), taken.append)
    assert kept.names == {"a", "b", "d"} and sum(r.num_rows for r in taken) == 3 + 1 + 2
    # whichever of the two objects holding a is read first, the other holds mostly rows read already: written again
    carried = [r.column("name").to_pylist() for r in kept.carried]
    assert len(kept.stale) == 2 and carried in ([["d", "d"]], [["b"]]), (kept.stale, carried)
    taken.clear()
    kept = file_digests.load_file_digests(store, table, {"a", "b", "d"}, pa.uint64(), taken.append)  # another key type
    assert kept.names == set() and taken == [] and len(kept.stale) == 3  # none read


def test_a_name_in_an_objects_dictionary_without_rows_is_not_taken_as_kept(tmp_path) -> None:
    """Rows filtered out of an object keep their names in its dictionary: a name is kept only where rows hold it."""
    store, table = Lakehouse(str(tmp_path)).store, TableRef("s", "t")
    names = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["a", "x"]))
    _objects(
        store, table,
        [pa.table({"name": names, "key": pa.array([1, 2], pa.int64()), "crc": pa.array([7, 7], pa.uint32())})],
        [pa.table({"name": ["x"] * 3, "key": pa.array([5, 6, 7], pa.int64()), "crc": pa.array([1, 1, 1], pa.uint32())})],
    )  # fmt: skip
    folder = file_digests_folder(table.path)
    for reverse in (False, True):  # whichever object is read first (objects are read in the order of their keys)
        order = store.list_keys(folder)[:: -1 if reverse else 1]
        for n, key in enumerate(order):
            store.move(key, f"{folder}/moving-{n}")
        for n in range(len(order)):
            store.move(f"{folder}/moving-{n}", f"{folder}/{n}.parquet")
        taken: list[pa.Table] = []
        kept = file_digests.load_file_digests(store, table, {"a", "x"}, pa.int64(), taken.append)
        assert kept.names == {"a", "x"} and sorted(k for r in taken for k in r.column("key").to_pylist()) == [1, 2, 5, 6, 7]


def _inside(part: digests.Part, outer: digests.Part) -> bool:
    (low, high), (outer_low, outer_high) = part, outer
    above = outer_low is None or (low is not None and low >= outer_low)
    below = outer_high is None or (high is not None and high <= outer_high)
    return above and below


def test_a_table_is_cut_into_ranges_by_its_data_files_statistics(tmp_path, monkeypatch) -> None:
    """The source starts digesting before the lakehouse's rows are read: the key range is cut from the data files'
    statistics, each file's rows taken as spread evenly over its keys, into parts of about ROWS_PER_RANGE rows; a
    table with a file that has no statistics of the key is left to be cut by its keys."""
    monkeypatch.setattr(digests, "ROWS_PER_RANGE", 100)
    path = str(tmp_path / "t")
    for start in (0, 250, 500, 750):  # four files of 250 keys each, in key order
        write_deltalake(path, pa.table({"id": pa.array(range(start, start + 250), pa.int64())}), mode="append")
    write_deltalake(path, pa.table({"id": pa.array([5000, 9000], pa.int64())}), mode="append")  # two keys far apart
    write_deltalake(path, pa.table({"id": pa.array([], pa.int64())}), mode="append")  # a file of no rows, if written
    ranges = digests.ranges_by_file_statistics(DeltaTable(path), "id")
    assert ranges is not None and ranges[0][0] is None and ranges[-1][1] is None, ranges
    edges = [low for low, _ in ranges[1:]]
    assert edges == sorted(set(edges)) and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    keys = np.array([*range(1000), 5000, 9000], np.int64)
    held = [n for n, _ in digests.lake_digests(keys, np.zeros(len(keys), np.uint32), ranges).values()]
    assert sum(held) == len(keys) and len(ranges) >= 8 and max(held) <= 150, (ranges, held)
    bare = str(tmp_path / "bare")
    write_deltalake(bare, pa.table({"id": pa.array(range(10), pa.int64())}), configuration={"delta.dataSkippingNumIndexedCols": "0"})
    assert digests.ranges_by_file_statistics(DeltaTable(bare), "id") is None
    empty = str(tmp_path / "empty")
    write_deltalake(empty, pa.table({"id": pa.array([], pa.int64())}))
    assert digests.ranges_by_file_statistics(DeltaTable(empty), "id") == [(None, None)]


def test_a_parts_digest_sums_every_crc_exactly_however_many_rows_it_holds() -> None:
    """A part cut by the files' statistics may hold far more rows than its share: its sum of CRC-32s is still the
    exact one the source computes (past 2**53, where a float64 sum would round)."""
    rows = 3_000_001
    keys, crcs = np.arange(rows, dtype=np.int64), np.full(rows, 0xFFFFFFFF, np.uint32)
    assert digests.lake_digests(keys, crcs, [(None, 10), (10, None)]) == {0: (10, 10 * 0xFFFFFFFF), 1: (rows - 10, (rows - 10) * 0xFFFFFFFF)}


def test_a_table_is_cut_at_every_nth_key_and_a_part_again_within_it() -> None:
    keys = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89])
    assert digests.cut(keys, [(None, None)], 4) == [(None, 8), (8, 55), (55, None)]
    assert digests.cut(keys, [(8, 55)], 2) == [(8, 21), (21, 55)]
    assert digests.cut(keys, [(100, 200)], 2) == [(100, 200)]  # a part the lakehouse holds no key of stays whole
    assert digests.cut(np.array([], np.int64), [(None, None)], 4) == [(None, None)]


def test_digest_texts_are_one_per_value_framed_by_its_length() -> None:
    """The same values give the same text whether DuckDB or Arrow writes them, and NULL differs from every text: a
    number's, a time's or hex followed by a comma, any other text framed by its length."""
    shape = TableShape(
        TableRef("s", "t"),
        (
            ColumnSpec("id", "bigint"), ColumnSpec("d", "decimal"), ColumnSpec("ts", "datetime", fsp=3),
            ColumnSpec("b", "blob"), ColumnSpec("s", "varchar"), ColumnSpec("dt", "date"),
        ),
        ("id",),
    )  # fmt: skip
    rows = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "d": pa.array([Decimal("0.00"), Decimal("-12.50")], pa.decimal128(12, 2)),
        "ts": pa.array([dt.datetime(2024, 2, 29, 12, 0, 0, 500000), None], pa.timestamp("us")),
        "b": pa.array([b"\x00\xab", b""], pa.binary()),
        "s": pa.array(["zoë", None]),
        "dt": pa.array([dt.date(999, 1, 2), dt.date(2024, 1, 1)], pa.date32()),
    })  # fmt: skip
    assert digests.row_texts(shape, rows).to_pylist() == [
        "1,0.00,2024-02-29 12:00:00.500,00AB,4:zoë0999-01-02,".encode(),
        b"2,-12.50,N,,-2024-01-01,",
    ]
    def framed(c: ColumnSpec) -> list[bytes]:
        texts = digests._value_texts(c, rows.column(c.name).combine_chunks()).to_pylist()
        if c.type in ("text", "varchar"):
            return [b"-" if v is None else str(len(v)).encode() + b":" + v for v in texts]
        return [(b"N" if v is None else v) + b"," for v in texts]

    assert digests.row_texts(shape, rows).to_pylist() == [b"".join(p) for p in zip(*map(framed, shape.columns), strict=True)]
