"""Schemas written by other CDC projects' test suites and by hand (issue 27): each odd table is captured, applied and
verified like any other, on both flavours where the feature exists. And where one still cannot be handled, it is
quarantined and the others go on (test_quarantine.py)."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.quarantine import quarantined_tables
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv


def _synced_and_verified(cdc: CdcEnv) -> None:
    """A sync exits 0, nothing is quarantined, and every table verifies equal to the source."""
    assert cdc.sync() == 0
    assert quarantined_tables(cdc.lakehouse.store) == {}
    results = cdc.verify()
    assert results and all(r.ok for r in results), [r.describe() for r in results if not r.ok]


def _current(cdc: CdcEnv, table: str, columns: list[str]) -> list[tuple]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table), columns)
    assert rows is not None
    return sorted(tuple(r[c] for c in columns) for r in rows.to_pylist())


@pytest.mark.both_sources
def test_a_primary_key_named_in_another_letter_case(cdc: CdcEnv) -> None:
    """`PRIMARY KEY (ID)` over a column named `id` ended every sync with "'ID' is not in list"."""
    cdc.execute(
        "CREATE TABLE t (id INT NOT NULL, v VARCHAR(10), PRIMARY KEY (`ID`))",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
        "UPDATE t SET v = 'c' WHERE id = 1",
    )
    _synced_and_verified(cdc)
    cdc.execute("DELETE FROM t WHERE ID = 2", "INSERT INTO t VALUES (3, 'd')")
    _synced_and_verified(cdc)
    assert _current(cdc, "t", ["id", "v"]) == [(1, "c"), (3, "d")]


@pytest.mark.both_sources
@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_an_alter_naming_a_column_in_another_letter_case(cdc: CdcEnv, engine: str, monkeypatch) -> None:
    """`MODIFY COLUMN C …` for a column `c` (MariaDB then names it `C`), and a CHANGE that only changes its case, failed
    with "Duplicate field name (case-insensitive)" and stopped every later sync."""
    if engine == "spark":
        monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # every stage run on Spark, whatever its size
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, c INT, d INT)", "INSERT INTO t VALUES (1, 1, 1)")
    _synced_and_verified(cdc)
    cdc.execute("ALTER TABLE t MODIFY COLUMN C BIGINT", "INSERT INTO t VALUES (2, 5000000000, 2)")
    _synced_and_verified(cdc)
    cdc.execute("ALTER TABLE t CHANGE COLUMN d D INT", "UPDATE t SET D = 3 WHERE id = 1")
    _synced_and_verified(cdc)
    cdc.execute("INSERT INTO t VALUES (3, 3, 3)")
    _synced_and_verified(cdc)


def test_mariadb_uuid_inet4_and_inet6_as_their_text(cdc: CdcEnv) -> None:
    """UUID, INET4 and INET6 landed as raw bytes, and verify and snapshot failed on "unsupported MySQL type 'uuid'";
    they are kept as the text SELECT prints, in keys too, through capture, snapshot and verify."""
    cdc.execute(
        "CREATE TABLE net (u UUID PRIMARY KEY, i4 INET4, i6 INET6)",
        "INSERT INTO net VALUES ('6ccd780c-baba-1026-9564-5b8c656024db', '10.0.0.1', '2001:db8::1'), "
        "(UUID(), '0.0.0.0', '::ffff:1.2.3.4'), (UUID(), '255.255.255.255', '::'), (UUID(), NULL, '::1'), "
        "(UUID(), '1.2.3.4', 'fe80::1:0:0:1'), (UUID(), '1.2.3.5', '::1.2.3.4')",
    )
    _synced_and_verified(cdc)
    cdc.execute("UPDATE net SET i6 = '2001:db8:0:0:1:0:0:1' WHERE i4 = '10.0.0.1'", "DELETE FROM net WHERE i4 = '0.0.0.0'")
    _synced_and_verified(cdc)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT CAST(u AS CHAR), CAST(i4 AS CHAR), CAST(i6 AS CHAR) FROM net")
        source = sorted(cur.fetchall(), key=str)
    assert sorted(_current(cdc, "net", ["u", "i4", "i6"]), key=str) == source
    from cdc_assets.cli import main

    assert main(["snapshot", f"{cdc.database}.net"]) == 0
    _synced_and_verified(cdc)


def test_a_system_versioned_table_keeps_its_current_rows(cdc: CdcEnv) -> None:
    """Every sync failed ("Invalid sort key column row_end"), verify crashed, current state held history and deleted
    rows, and a snapshot with no argument skipped the table. Only current rows are kept, without row_start/row_end."""
    cdc.execute(
        "CREATE TABLE v (id INT PRIMARY KEY, x INT) WITH SYSTEM VERSIONING",
        "INSERT INTO v VALUES (1, 1), (2, 2), (3, 3)",
        "UPDATE v SET x = 10 WHERE id = 1",
        "DELETE FROM v WHERE id = 2",
        "UPDATE v SET id = 4 WHERE id = 3",
    )
    _synced_and_verified(cdc)
    assert _current(cdc, "v", ["id", "x"]) == [(1, 10), (4, 3)]
    columns = read_current(cdc.lakehouse, TableRef(cdc.database, "v"), None)
    assert columns is not None and not {"row_start", "row_end"} & set(columns.column_names)
    from cdc_assets.cli import main

    assert main(["snapshot"]) == 0
    cdc.execute("UPDATE v SET x = 11 WHERE id = 1", "DELETE FROM v WHERE id = 4", "INSERT INTO v VALUES (5, 5)")
    _synced_and_verified(cdc)
    assert _current(cdc, "v", ["id", "x"]) == [(1, 11), (5, 5)]


def test_a_mariadb_sequence_is_skipped(cdc: CdcEnv) -> None:
    """A SEQUENCE became a keyless table gaining a row per cache refill, and the sync failed on a Decimal. It is the
    server's state, not data: skipped (docs/lakehouse.md, Types: "Sequences"), while the table that takes its values is captured."""
    cdc.execute(
        "CREATE SEQUENCE s CACHE 2",
        "CREATE TABLE t (id BIGINT PRIMARY KEY)",
        "INSERT INTO t VALUES (NEXTVAL(s)), (NEXTVAL(s)), (NEXTVAL(s)), (NEXTVAL(s)), (NEXTVAL(s))",
    )
    _synced_and_verified(cdc)
    assert _current(cdc, "t", ["id"]) == [(1,), (2,), (3,), (4,), (5,)]
    assert not cdc.lakehouse.has_table("current", TableRef(cdc.database, "s"))


# (charset, a text it holds); the server's own SELECT of the same rows is what capture must give
_CHARSET_TEXTS = [
    ("armscii8", "Բարեւ"), ("dec8", "Zoë"), ("keybcs2", "Příliš"), ("geostd8", "გამარჯობა"), ("hp8", "Zoë"),
    ("swe7", "ABC"), ("eucjpms", "日本語①"), ("ucs2", "Zoë"), ("utf16", "Zoë 😀"), ("utf16le", "Zoë 😀"),
    ("utf32", "Zoë 😀"), ("koi8r", "Привет"), ("cp1250", "Žluťoučký"), ("latin2", "Žluťoučký"), ("greek", "Καλημέρα"),
    ("sjis", "日本"), ("big5", "中文"), ("gbk", "中文"), ("utf8mb3", "Zoë"), ("latin1", "Zoë"),
]  # fmt: skip


@pytest.mark.both_sources
def test_every_charset_decoded_as_the_server_returns_it(cdc: CdcEnv) -> None:
    """A column in a charset Python has no codec for ended every sync with UnicodeEncodeError (nothing captured for
    any table), and utf16/ucs2 text landed wrong ('Zoë' became '娀漀\\ueb00')."""
    columns = ", ".join(f"c_{name} VARCHAR(20) CHARACTER SET {name}" for name, _ in _CHARSET_TEXTS)
    cdc.execute(f"CREATE TABLE cs (id INT PRIMARY KEY, {columns})")
    values = ", ".join(["%s"] * len(_CHARSET_TEXTS))
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO cs VALUES (1, {values})", [text for _, text in _CHARSET_TEXTS])
        cur.execute(f"INSERT INTO cs VALUES (2, {values})", ["x"] * len(_CHARSET_TEXTS))
        cur.execute(f"UPDATE cs SET {', '.join(f'c_{n} = %s' for n, _ in _CHARSET_TEXTS)} WHERE id = 2", [t[::-1] for _, t in _CHARSET_TEXTS])
    _synced_and_verified(cdc)
    names = [f"c_{name}" for name, _ in _CHARSET_TEXTS]
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, {', '.join(names)} FROM cs ORDER BY id")
        source = [tuple(row) for row in cur.fetchall()]
    assert _current(cdc, "cs", ["id", *names]) == source
    assert source[0][names.index("c_utf16") + 1] == "Zoë 😀"


# ENUM and SET members in the column's charset: the table map carries them as the server stores them
_MEMBERS_TABLE = """
CREATE TABLE members (
  id INT PRIMARY KEY,
  e_latin1 ENUM('a', 'é', '€ÿ') CHARACTER SET latin1, s_latin1 SET('x', 'ñ', 'Ø') CHARACTER SET latin1,
  e_cp1251 ENUM('да', 'нет') CHARACTER SET cp1251, s_cp1251 SET('красный', 'зелёный') CHARACTER SET cp1251,
  e_emoji ENUM('🚀', 'é 🙂') CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  s_emoji SET('🚀', '🙂') CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,  -- unicode_ci weighs every emoji alike
  e_binary ENUM('a', 'é') CHARACTER SET binary
)
"""
_MEMBER_ROWS = [
    (1, "a", "x", "да", "красный", "🚀", "🚀", "a"),
    (2, "é", "ñ", "нет", "зелёный", "é 🙂", "🙂", "é"),
    (3, "€ÿ", "x,ñ,Ø", "да", "красный,зелёный", "🚀", "🚀,🙂", "é"),
    (4, "no such member", "", "no such member", "", "no such member", "", "no such member"),  # '': the error value
    (5, None, None, None, None, None, None, None),
]


@pytest.mark.both_sources
def test_enum_and_set_members_decoded_in_their_columns_charset(cdc: CdcEnv) -> None:
    """The table map's ENUM/SET members were decoded as UTF-8 whatever the column's charset: a latin1 'é' became ''
    and a cp1251 'да' too, so those rows landed wrong."""
    cdc.execute(_MEMBERS_TABLE)
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # an ENUM's value that is no member is stored as '' (index 0)
        cur.executemany(f"INSERT INTO members VALUES ({', '.join(['%s'] * 8)})", _MEMBER_ROWS)
        cur.execute("UPDATE members SET e_latin1 = '€ÿ', s_latin1 = 'Ø', e_cp1251 = 'нет', s_emoji = '🙂' WHERE id = 1")
        cur.execute("DELETE FROM members WHERE id = 2")
    _synced_and_verified(cdc)
    names = ["id", "e_latin1", "s_latin1", "e_cp1251", "s_cp1251", "e_emoji", "s_emoji", "e_binary"]
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(names)} FROM members ORDER BY id")
        # a binary ENUM's value comes as its bytes: the UTF-8 of the member, as the statement that made it sent it
        source = [tuple(v.decode() if isinstance(v, bytes) else v for v in row) for row in cur.fetchall()]
    assert _current(cdc, "members", names) == source
    assert source[0][1:4] == ("€ÿ", "Ø", "нет") and source[2][1] == ""


def test_members_and_text_of_mariadb_uca1400_collations_and_a_binary_member_that_is_no_text(cdc: CdcEnv) -> None:
    """MariaDB's UCA-14.0.0 collations (numbered from 2048) were all taken for utf8: a ucs2 column's text and members
    were decoded as UTF-8. And a binary ENUM's member that is not UTF-8 has no text the lakehouse could hold: its
    table is quarantined with one sentence naming the column and charset, and the other goes on."""
    cdc.execute(
        "CREATE TABLE uca (id INT PRIMARY KEY, t VARCHAR(10) CHARACTER SET ucs2 COLLATE ucs2_uca1400_ai_ci,"
        " e ENUM('é', 'x') CHARACTER SET ucs2 COLLATE ucs2_uca1400_ai_ci,"
        " s SET('🚀', 'é') CHARACTER SET utf8mb4 COLLATE utf8mb4_uca1400_as_cs)",
        "INSERT INTO uca VALUES (1, 'Zoë', 'é', '🚀,é'), (2, NULL, 'x', '')",
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET NAMES latin1")  # the statement's bytes as they are: the member is the one byte E9
        statement = "CREATE TABLE bin (id INT PRIMARY KEY, e ENUM('a', 'caf\xe9') CHARACTER SET binary)"
        conn.query(statement.encode("latin1"))
        cur.execute("INSERT INTO bin VALUES (1, 'a')")
    assert cdc.sync() == 1  # the quarantined table's own check fails
    held = quarantined_tables(cdc.lakehouse.store)
    assert list(held) == [f"{cdc.database}.bin"]
    sentence = held[f"{cdc.database}.bin"].sentence()
    assert "Column 'e' is an ENUM/SET in the binary charset with a member that is not UTF-8" in sentence, sentence
    results = {r.table.table: r for r in cdc.verify()}
    assert results["uca"].ok and results["bin"].differs, results["uca"].describe()
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT id, t, e, s FROM uca ORDER BY id")
        assert _current(cdc, "uca", ["id", "t", "e", "s"]) == [tuple(row) for row in cur.fetchall()]
