"""`cdc-lakehouse forget TABLE --rewrite-policies` (issue 31): column policies added to columns already captured are
applied to every earlier layer, against real MariaDB and MySQL.

A table is captured with clear values (several changes, so raw batches, the change log's before-images, current state
and history hold them), then a hash, an exclude and a mask policy are added and a sync says the sentence naming the
rewrite. After the rewrite, `verify` passes with no sentence about clear values left, every change of the raw batches
is in its change log once, a scan of every file under the lakehouse and the Dagster home (bytes, each Parquet file's
values, the Delta logs' JSON, the runs' config and event logs) finds none of the clear values, and later syncs go
on. The same after a rewrite killed at each failpoint and run again.
"""

from __future__ import annotations

import pytest

from cdc_assets.cli import main
from cdc_assets.core import failpoints
from cdc_assets.core.column_policy import hash_text, mask_text
from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CHANGES, HISTORY
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_forget import FORGET_POINTS, _assert_equal_to_source, _cli, _scan

# Tests that ask the source run on both flavours; the crash walk, S3, sinks and bad input are the lakehouse's
# alone and run on MariaDB (the suite must stay within its time).

SECRET = "policy-rewrite-test-key-0123456789"


def _table(cdc: CdcEnv, name: str, mark: str, age: int = 91827) -> list[str]:
    """A table captured with clear values (each holding `mark`, ages `age`1 to 3), changed so every layer holds
    some; its needles."""
    cdc.execute(
        f"CREATE TABLE {name} (id INT PRIMARY KEY, email VARCHAR(100), age INT, note VARCHAR(40), card VARCHAR(30))",
        f"INSERT INTO {name} VALUES (1, 'one-{mark}@example.invalid', {age}1, 'note-one-{mark}', '4929-{mark}-1234'), "
        f"(2, 'two-{mark}@example.invalid', {age}2, 'note-two-{mark}', '5555-{mark}-9876')",
        f"UPDATE {name} SET note = 'note-three-{mark}', age = {age}3 WHERE id = 2",
        f"INSERT INTO {name} VALUES (3, NULL, NULL, NULL, NULL)",
    )
    return [f"one-{mark}", f"two-{mark}", f"note-one-{mark}", f"note-two-{mark}", f"note-three-{mark}", f"4929-{mark}",
            f"5555-{mark}", f"{age}1", f"{age}2", f"{age}3"]  # fmt: skip


def _policies(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, tables: str) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.{tables}.email,{db}.{tables}.age")
    monkeypatch.setenv("CDC_EXCLUDE_COLUMNS", f"{db}.{tables}.note")
    monkeypatch.setenv("CDC_MASK_COLUMNS", f"{db}.{tables}.card")
    monkeypatch.setenv("CDC_HASH_KEY", SECRET)


def _rows(cdc: CdcEnv, name: str) -> dict:
    current = read_current(cdc.lakehouse, TableRef(cdc.database, name))
    assert current is not None
    return {r["id"]: {k: v for k, v in r.items() if not k.startswith("_cdc_")} for r in current.to_pylist()}


@pytest.mark.both_sources
def test_rewrite_policies_leaves_no_clear_value_in_any_layer(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.t")
    needles = _table(cdc, "t", "c1a7")
    cdc.execute("CREATE TABLE other (id INT PRIMARY KEY, email VARCHAR(100))", "INSERT INTO other VALUES (1, 'kept@example.com')")
    assert cdc.sync() == 0
    _policies(cdc, monkeypatch, "t")
    cdc.execute("INSERT INTO t VALUES (4, 'four@example.invalid', 40, 'n4', '1111-2222')", "UPDATE t SET age = 41 WHERE id = 1")
    capfd.readouterr()
    assert cdc.sync() == 0
    out, err = capfd.readouterr()
    sentence = f"run `cdc-lakehouse forget {db}.t --rewrite-policies` to rewrite them"
    assert sentence in out + err
    assert _scan(cdc, needles) != []  # the scan finds what the earlier layers still hold

    assert main(["forget", f"{db}.t", "--rewrite-policies"]) == 0
    out, err = capfd.readouterr()
    assert f"rewrote {db}.t under the column policies on age (hashed), card (masked), email (hashed), note (excluded)" in out
    key = SECRET.encode()
    assert _rows(cdc, "t") == {
        1: {"id": 1, "email": hash_text(key, "one-c1a7@example.invalid"), "age": hash_text(key, "41"), "card": mask_text("4929-c1a7-1234")},
        2: {"id": 2, "email": hash_text(key, "two-c1a7@example.invalid"), "age": hash_text(key, "918273"), "card": mask_text("5555-c1a7-9876")},
        3: {"id": 3, "email": None, "age": None, "card": None},
        4: {"id": 4, "email": hash_text(key, "four@example.invalid"), "age": hash_text(key, "40"), "card": mask_text("1111-2222")},
    }  # fmt: skip
    assert _rows(cdc, "other") == {1: {"id": 1, "email": "kept@example.com"}}  # another table is left as it was
    for layer in (CHANGES, HISTORY):
        assert "note" not in cdc.lakehouse.open(layer, TableRef(db, "t")).schema().to_arrow().names
    _assert_equal_to_source(cdc)
    assert all(r.clear_left is None for r in cdc.verify())
    assert main(["verify"]) == 0
    assert "--rewrite-policies" not in "".join(capfd.readouterr())
    assert _scan(cdc, needles) == []
    assert _scan(cdc, ["kept@example.com"]) != []

    # run again: nothing left to rewrite; later changes and syncs go on, and verify passes
    assert main(["forget", f"{db}.t", "--rewrite-policies"]) == 0
    assert "nothing to rewrite" in capfd.readouterr().out
    cdc.execute("INSERT INTO t VALUES (5, 'five@example.invalid', 50, 'n5', '3333-4444')", "UPDATE t SET email = 'x@y.z' WHERE id = 2")
    cdc.execute("DELETE FROM t WHERE id = 1")
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    assert main(["verify"]) == 0
    assert _scan(cdc, [*needles, "five@example.invalid", "3333-4444", "x@y.z"]) == []


def test_a_rewrite_killed_at_each_failpoint_and_run_again_finishes(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.t*")
    needles = {n: _table(cdc, f"t{n}", f"k{n}e9", 73519 + n * 10) for n in range(len(FORGET_POINTS))}
    assert cdc.sync() == 0
    _policies(cdc, monkeypatch, "t*")
    assert cdc.sync() == 0
    for n, (point, hit) in enumerate(FORGET_POINTS):
        cdc.execute(f"UPDATE t{n} SET age = 7 WHERE id = 1")
        crashed = _cli("forget", f"{db}.t{n}", "--rewrite-policies", failpoint=point, hit=hit)
        assert crashed.returncode == failpoints.EXIT_CODE, f"{point}: {crashed.stdout[-2000:]} {crashed.stderr[-2000:]}"
        cdc.execute(f"UPDATE t{n} SET age = 8 WHERE id = 2")
        assert cdc.sync() == 0, point  # a sync between the crash and the rerun fails on nothing
        assert main(["forget", f"{db}.t{n}", "--rewrite-policies"]) == 0, point
        _assert_equal_to_source(cdc)
        assert all(r.clear_left is None for r in cdc.verify() if r.table == TableRef(db, f"t{n}")), point
        assert _scan(cdc, needles[n]) == [], point


@pytest.mark.both_sources
def test_a_policy_added_to_a_key_column_is_not_rewritten(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Every layer is keyed on the clear key: the command refuses in one sentence naming the snapshot."""
    db = cdc.database
    cdc.execute("CREATE TABLE k (id INT PRIMARY KEY, v INT)", "INSERT INTO k VALUES (1, 10)")
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.k.id")
    monkeypatch.setenv("CDC_HASH_KEY", SECRET)
    cdc.sync()
    capsys.readouterr()
    assert main(["forget", f"{db}.k", "--rewrite-policies"]) == 2
    err = capsys.readouterr().err.strip()
    assert "key column id" in err and f"cdc-lakehouse snapshot {db}.k" in err and "\n" not in err, err
    assert main(["forget", f"{db}.k", "--rewrite-policies", "--key", "1"]) == 2
    assert "takes no key" in capsys.readouterr().err
