"""A snapshot on Spark under column policies (issue 31): its tasks apply the same policy as the Arrow engine's
snapshot, so both load the same rows, and no clear value, nor the hash key, is in the lakehouse, the Dagster home,
the output or the Spark session's settings and environment."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from cdc_assets.cli import main
from cdc_assets.core.column_policy import ColumnPolicy, hash_text
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.source.rows import source_shapes
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.snapshot.spark_tasks import ChunkRead
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_personal_data import _files, _found

KEY = "spark-snapshot-policy-key-0123456789"
ROWS = 600


def _current(cdc: CdcEnv, table: str) -> list[dict]:
    rows = read_current(cdc.lakehouse, TableRef(cdc.database, table))
    assert rows is not None
    return sorted(
        ({k: v for k, v in r.items() if k not in ("_cdc_seq", "_cdc_commit_ts")} for r in rows.to_pylist()),
        key=repr,
    )


def source_shapes_of(cdc: CdcEnv, table: str) -> TableShape:
    conn = cdc.admin()
    try:
        shape = source_shapes(conn, [TableRef(cdc.database, table)])[TableRef(cdc.database, table)]
    finally:
        conn.close()
    assert shape is not None
    return shape


@pytest.mark.both_sources
def test_a_snapshot_on_spark_applies_the_column_policy(
    cdc: CdcEnv, spark: object, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_EXCLUDE_COLUMNS", f"{db}.people.notes")
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.people.email,{db}.*.age")
    monkeypatch.setenv("CDC_MASK_COLUMNS", f"{db}.people.card")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)
    monkeypatch.setenv("CDC_SNAPSHOT_CHUNK_ROWS", "100")
    cdc.execute(
        "CREATE TABLE people (email VARCHAR(60) PRIMARY KEY, age INT, card VARCHAR(30), notes TEXT, city VARCHAR(10))",
        "CREATE TABLE bag (age INT, label VARCHAR(10))",  # keyless: read whole by one task
    )
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO people VALUES (%s, %s, %s, %s, 'c')",
            [(f"zq{i:04d}@clear.example", 20 + i % 50, f"4929-5555-{i:04d}-9876", f"zq-note-{i:04d}") for i in range(ROWS)],
        )
        cur.executemany("INSERT INTO bag VALUES (%s, 'x')", [(7000 + i % 3,) for i in range(30)])
    tables = [f"{db}.people", f"{db}.bag"]
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "100000000")  # Arrow
    assert main(["snapshot", *tables]) == 0
    on_arrow = {t: _current(cdc, t) for t in ("people", "bag")}
    monkeypatch.setenv("CDC_SPARK_MIN_ROWS", "0")  # Spark, in key chunks of 100 rows
    assert main(["snapshot", *tables]) == 0
    out, err = capfd.readouterr()
    print(out, err)
    assert "chunks" in out + err  # read by Spark tasks, a key range each
    assert {t: _current(cdc, t) for t in ("people", "bag")} == on_arrow
    key = KEY.encode()
    people = {r["email"]: r for r in on_arrow["people"]}
    first = people[hash_text(key, "zq0000@clear.example")]
    assert first["age"] == hash_text(key, "20") and first["card"] == "***************9876" and "notes" not in first
    assert {r["age"] for r in on_arrow["bag"]} == {hash_text(key, str(7000 + i)) for i in range(3)}
    # syncs go on over it, and verify compares through the same policy
    cdc.execute("UPDATE people SET age = 99, card = '1111-2222' WHERE email = 'zq0001@clear.example'", "INSERT INTO bag VALUES (1, 'y')")
    assert cdc.sync() == 0
    assert main(["verify"]) == 0
    out2, err2 = capfd.readouterr()
    # no clear value anywhere, and the key in no file, no output, no Spark setting nor the environment Spark sees
    clear = ["zq0000@clear.example", "zq0599@clear.example", "4929-5555-0000", "zq-note-0000", KEY]
    files = _files(cdc.lakehouse_dir, tmp_path / "dagster_home")
    assert _found(files, clear) == []
    assert not [t for t in clear if t in out + err + out2 + err2]
    settings = repr(spark.sparkContext.getConf().getAll())  # type: ignore[attr-defined]
    assert KEY not in settings and not [n for n, v in os.environ.items() if KEY in v and n != "CDC_HASH_KEY"]
    shape = source_shapes_of(cdc, "people")
    work = ChunkRead("k", shape, None, None, 0, dt.datetime.now(dt.UTC), policy=ColumnPolicy(key=key))
    assert KEY not in repr(work)  # a task's description (Spark's UI, a log) never shows the key
