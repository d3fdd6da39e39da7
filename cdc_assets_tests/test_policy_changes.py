"""Column policy changes end to end through the command (issue 31, item 2): a policy added to a captured column is
said on the terminal and syncs go on with old clear rows beside new hashed ones (verify names the rewrite); a
policy taken away is refused, and the snapshot the sentence names loads the table under today's policy, after
which syncs go on, whether or not the snapshot's own capture wrote a batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_assets.cli import main
from cdc_assets.core.column_policy import hash_text
from cdc_assets.core.names import TableRef
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

KEY = "policy-change-test-key-0123456789"


def _rows(cdc: CdcEnv, table: str = "t") -> dict:
    current = read_current(cdc.lakehouse, TableRef(cdc.database, table))
    assert current is not None
    return {r["id"]: {k: v for k, v in r.items() if not k.startswith("_cdc_")} for r in current.to_pylist()}


@pytest.mark.both_sources
@pytest.mark.parametrize("write_between", [False, True], ids=["no-batch", "batch"])
def test_a_policy_taken_away_is_accepted_by_the_snapshot_it_names(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], write_between: bool
) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.email")
    monkeypatch.setenv("CDC_EXCLUDE_COLUMNS", f"{db}.t.note")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, email VARCHAR(100), age INT, note VARCHAR(20))",
        "INSERT INTO t VALUES (1, 'a@x.org', 30, 'n1'), (2, 'b@x.org', 40, 'n2')",
    )
    assert cdc.sync() == 0
    assert _rows(cdc)[1] == {"id": 1, "email": hash_text(KEY.encode(), "a@x.org"), "age": 30}
    # the hash moves from email to age, and note is no longer excluded
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.age")
    monkeypatch.delenv("CDC_EXCLUDE_COLUMNS")
    if write_between:
        cdc.execute("INSERT INTO t VALUES (3, 'c@x.org', 50, 'n3')")
    capfd.readouterr()
    assert cdc.sync() == 2
    out, err = capfd.readouterr()
    assert f"cdc-lakehouse snapshot {db}.t" in out + err
    assert main(["snapshot", f"{db}.t"]) == 0
    expected = {
        1: {"id": 1, "email": "a@x.org", "age": hash_text(KEY.encode(), "30"), "note": "n1"},
        2: {"id": 2, "email": "b@x.org", "age": hash_text(KEY.encode(), "40"), "note": "n2"},
    }
    if write_between:
        expected[3] = {"id": 3, "email": "c@x.org", "age": hash_text(KEY.encode(), "50"), "note": "n3"}
    assert _rows(cdc) == expected
    cdc.execute("INSERT INTO t VALUES (4, 'd@x.org', 60, 'n4')", "UPDATE t SET age = 31, note = 'm1' WHERE id = 1")
    assert cdc.sync() == 0
    expected[1] |= {"age": hash_text(KEY.encode(), "31"), "note": "m1"}
    expected[4] = {"id": 4, "email": "d@x.org", "age": hash_text(KEY.encode(), "60"), "note": "n4"}
    assert _rows(cdc) == expected
    assert main(["verify"]) == 0
    cdc.execute("DELETE FROM t WHERE id = 2")
    assert cdc.sync() == 0
    assert main(["verify"]) == 0


@pytest.mark.both_sources
def test_a_policy_added_to_a_captured_int_column(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    db = cdc.database
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, age INT)", "INSERT INTO t VALUES (1, 30), (2, 40)")
    assert cdc.sync() == 0
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.age")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)
    cdc.execute("INSERT INTO t VALUES (3, 50)", "UPDATE t SET age = 41 WHERE id = 2")
    capfd.readouterr()
    assert cdc.sync() == 0
    out, err = capfd.readouterr()
    sentence = f"run `cdc-lakehouse forget {db}.t --rewrite-policies` to rewrite them"
    assert sentence in out + err  # said on the terminal, not only in the run's log
    key = KEY.encode()
    # until the rewrite, current state holds the old clear row (as text) beside the new hashed ones
    assert _rows(cdc) == {
        1: {"id": 1, "age": "30"},
        2: {"id": 2, "age": hash_text(key, "41")},
        3: {"id": 3, "age": hash_text(key, "50")},
    }
    cdc.execute("INSERT INTO t VALUES (4, 60)")
    assert cdc.sync() == 0
    capfd.readouterr()
    assert main(["verify"]) == 1
    out, err = capfd.readouterr()
    assert sentence.replace(" to rewrite them", "") in out + err
    # a snapshot loads current state under the policy: nothing clear is left there (the change log keeps its own)
    assert main(["snapshot", f"{db}.t"]) == 0
    assert _rows(cdc)[1] == {"id": 1, "age": hash_text(key, "30")}
    assert main(["verify"]) == 0


@pytest.mark.both_sources
def test_a_column_renamed_out_of_its_policy_holds_its_table(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.email")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, email VARCHAR(100))",
        "CREATE TABLE other (id INT PRIMARY KEY)",
        "INSERT INTO t VALUES (1, 'zq-one@clear.example')",
    )
    assert cdc.sync() == 0
    cdc.execute(
        "ALTER TABLE t RENAME COLUMN email TO mail",
        "INSERT INTO t VALUES (2, 'zq-two@clear.example')",
        "INSERT INTO other VALUES (1)",
    )
    capfd.readouterr()
    cdc.sync()
    out, err = capfd.readouterr()
    assert (
        f"column {db}.t.email (hashed) was renamed to {db}.t.mail, which the column policy leaves clear" in out + err
        and f"add {db}.t.mail to CDC_HASH_COLUMNS" in out + err
        and f"`cdc-lakehouse snapshot {db}.t`" in out + err
    ), out + err
    assert [r["id"] for r in read_current(cdc.lakehouse, TableRef(db, "other")).to_pylist()] == [1]  # the others go on
    files = [p for root in (cdc.lakehouse_dir, tmp_path / "dagster_home") for p in root.rglob("*") if p.is_file()]
    assert not [p for p in files if b"zq-two@clear.example" in p.read_bytes()]
    assert "zq-two@clear.example" not in out + err
    # following the sentence: the policy set for the new name, the table loaded again under it
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.email,{db}.t.mail")
    assert main(["snapshot", f"{db}.t"]) == 0
    cdc.execute("INSERT INTO t VALUES (3, 'zq-three@clear.example')")
    assert cdc.sync() == 0
    key = KEY.encode()
    assert _rows(cdc) == {
        i: {"id": i, "mail": hash_text(key, f"zq-{n}@clear.example")} for i, n in ((1, "one"), (2, "two"), (3, "three"))
    }
    assert main(["verify"]) == 0
    files = [p for root in (cdc.lakehouse_dir, tmp_path / "dagster_home") for p in root.rglob("*") if p.is_file()]
    assert not [p for p in files if b"zq-two@clear.example" in p.read_bytes() or b"zq-three@clear.example" in p.read_bytes()]
