"""Legal but hostile identifiers: dots, slashes, `..`, backticks, quotes, spaces, unicode, reserved words, the
64-character maximum and names differing only in case. Each table keeps a directory of its own under its layer,
no name reaches outside it, and capture, snapshot, verify and the checks work on every one of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from cdc_assets.cli import main
from cdc_assets.commands.runs import run_sync
from cdc_assets.core.names import TableRef, name_of_segment, path_segment
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.layout import CHANGES, CURRENT
from cdc_assets_tests.conftest import CdcEnv, use_s3
from cdc_assets_tests.env_settings import settings_now

pytestmark = pytest.mark.both_sources

HOSTILE_TABLES = [
    "..",
    "x/..",
    "a.b",
    "a`b",
    "it's \"quoted\"",
    "my table",
    "ünïcödé 表",
    "select",
    "T",
    "t",
    "l" * 64,
]


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@pytest.fixture
def hostile(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[TableRef]]:
    """The hostile tables in the test's database, plus schemas named `..`, `d.ot` and `d` (whose table `ot.t`
    would share `d.ot`.`t`'s text if names were split at the first dot)."""
    db = cdc.database
    schemas = {f"{db}..": ["t"], f"{db}d.ot": ["t"], f"{db}d": ["ot.t"], db: HOSTILE_TABLES}
    tables = [TableRef(schema, table) for schema, names in schemas.items() for table in names]
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        for schema in schemas:
            cur.execute(f"DROP DATABASE IF EXISTS {_q(schema)}")
            cur.execute(f"CREATE DATABASE {_q(schema)} CHARACTER SET utf8mb4")
        for n, table in enumerate(tables):
            name = f"{_q(table.schema)}.{_q(table.table)}"
            cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, {_q('v a.l`')} VARCHAR(20))")
            cur.executemany(f"INSERT INTO {name} VALUES (%s, %s)", [(i, f"{n}-{i}") for i in range(3)])
    globs = ",".join(f"{_q(s)}.*" for s in schemas)
    monkeypatch.setenv("CDC_TABLES", globs)
    yield tables
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        for schema in schemas:
            if schema != db:
                cur.execute(f"DROP DATABASE IF EXISTS {_q(schema)}")


def _change_everything(cdc: CdcEnv, tables: list[TableRef]) -> None:
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        for table in tables:
            name = f"{_q(table.schema)}.{_q(table.table)}"
            cur.execute(f"UPDATE {name} SET {_q('v a.l`')} = 'changed' WHERE id = 1")
            cur.execute(f"DELETE FROM {name} WHERE id = 2")
            cur.execute(f"INSERT INTO {name} VALUES (9, 'new')")


def _assert_all_equal(tables: list[TableRef], dropped: tuple[TableRef, ...] = ()) -> None:
    from cdc_assets.commands.runs import run_verify

    results = run_verify(settings_now())
    assert sorted(r.table for r in results) == sorted([*tables, *dropped])
    assert [r.describe() for r in results if not r.ok] == []
    assert all(r.compared_rows == 3 for r in results if r.table not in dropped), [r.describe() for r in results]


def test_path_segments_are_one_safe_directory_per_name() -> None:
    names = HOSTILE_TABLES + [".", "...", "a/b", "a%2Fb", "~2E", " lead", "a\\b"]
    segments = [path_segment(n) for n in names]
    assert len(set(segments)) == len(names)
    for name, segment in zip(names, segments, strict=True):
        assert segment not in ("", ".", "..") and "/" not in segment and "\\" not in segment
        assert name_of_segment(segment) == name
        assert len(segment.encode()) <= 255
    for table in (TableRef("d.ot", "t"), TableRef("d", "ot.t"), TableRef("..", ".."), TableRef("s", "a`b.c")):
        assert TableRef.parse(str(table)) == table
    assert str(TableRef("shop", "orders")) == "shop.orders"
    assert str(TableRef("d.ot", "t")) != str(TableRef("d", "ot.t"))


def test_hostile_names_end_to_end_locally(cdc: CdcEnv, hostile: list[TableRef]) -> None:
    outcome = run_sync(settings_now())
    assert outcome.success, outcome.failed_checks
    _assert_all_equal(hostile)
    _change_everything(cdc, hostile)
    assert cdc.sync() == 0
    _assert_all_equal(hostile)

    # Every table has a directory of its own inside its layer, and the lakehouse lists them back by name.
    lakehouse = cdc.lakehouse
    for layer in (CHANGES, CURRENT):
        assert sorted(lakehouse.tables(layer)) == sorted(hostile)
        dirs = {Path(lakehouse.table_uri(layer, t)).resolve() for t in hostile}
        assert len(dirs) == len(hostile)
        assert all(d.parent.parent == (cdc.lakehouse_dir / layer).resolve() for d in dirs)
    assert not (cdc.lakehouse_dir / CURRENT / cdc.database / "_delta_log").exists()

    # DROP TABLE `..` removes that table's current state only (it once removed every table of current/).
    dot_dot = TableRef(cdc.database, "..")
    cdc.execute(f"DROP TABLE {_q('..')}")
    assert cdc.sync() == 0
    rest = [t for t in hostile if t != dot_dot]
    assert sorted(lakehouse.tables(CURRENT)) == sorted(rest)
    _assert_all_equal(rest, dropped=(dot_dot,))

    # A snapshot of a table named with a dot, a backtick and of one in the schema `..`.
    picked = [TableRef(cdc.database, "a.b"), TableRef(cdc.database, "a`b"), TableRef(f"{cdc.database}..", "t")]
    assert main(["snapshot", *(str(t) for t in picked)]) == 0
    _assert_all_equal(rest, dropped=(dot_dot,))


@pytest.mark.lakehouse_side  # S3's side: the source's is the local variant's, on both
def test_hostile_names_on_s3(cdc: CdcEnv, hostile: list[TableRef], monkeypatch, s3_endpoint: str) -> None:
    use_s3(monkeypatch, s3_endpoint)
    bucket = f"hostile-{cdc.server.flavour}"  # a bucket of its own per flavour
    boto3.client("s3").create_bucket(Bucket=bucket)
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://{bucket}/lake")
    assert cdc.sync() == 0
    _change_everything(cdc, hostile)
    assert cdc.sync() == 0
    _assert_all_equal(hostile)
    lakehouse = initialized_resources().lakehouse.get()
    assert sorted(lakehouse.tables(CURRENT)) == sorted(hostile)
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)  # every key, escaped or not
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    assert keys
    for key in keys:
        assert key.startswith("lake/") and "/../" not in key and "/./" not in key
