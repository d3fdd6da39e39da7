"""Personal data against real servers (issue 31, items 1, 2 and 4): excluded, hashed (a primary key among them) and
masked columns through sync, snapshot and verify; then every file of the lakehouse and the Dagster home, and the
command's output, are searched for the clear values, as bytes and, for Parquet, as values."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc_assets.capture.run import capture
from cdc_assets.core.column_policy import hash_text
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.lake.raw_batches import list_batches, read_manifest
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import source_now

KEY = "personal-data-test-key-0123456789"
# distinctive clear values: none may be found anywhere
EMAILS = ["zq-ann.clear@example.org", "zq-bob.clear@example.org", "zq-cy.clear@example.org"]
CARD = "4929-5555-7777-1234"
NOTE = "zq-excluded-note-text"
LEGACY = "zq-legacy-secret-value"
CLEAR = [*EMAILS, CARD, CARD.replace("-", "")[:12], NOTE, LEGACY]


def _policies(monkeypatch: pytest.MonkeyPatch, db: str) -> None:
    monkeypatch.setenv("CDC_EXCLUDE_COLUMNS", f"{db}.customers.notes")
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.*.email,{db}.legacy.secret")
    monkeypatch.setenv("CDC_MASK_COLUMNS", f"{db}.customers.card")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)


def _found(paths: list[Path], texts: list[str]) -> list[str]:
    """Where any clear text is: in a file's bytes, or in a Parquet file's values."""
    found = []
    needles = [t.encode() for t in texts]
    for path in paths:
        data = path.read_bytes()
        found += [f"{path}: {n!r}" for n in needles if n in data]
        if path.suffix == ".parquet":
            values = str(pq.read_table(path).to_pylist())
            found += [f"{path} (values): {t}" for t in texts if t in values]
    return found


def _files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


@pytest.mark.both_sources
def test_policies_keep_clear_values_out_of_every_layer(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = cdc.database
    _policies(monkeypatch, db)
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.*")
    cdc.execute(
        "CREATE TABLE customers (email VARCHAR(100) PRIMARY KEY, name VARCHAR(20), card VARCHAR(30), notes TEXT)",
        "CREATE TABLE orders (id INT PRIMARY KEY, email VARCHAR(100), amount INT)",
        f"INSERT INTO customers VALUES ('{EMAILS[0]}', 'ann-zq-visible', '{CARD}', '{NOTE}'), ('{EMAILS[1]}', 'bob', NULL, '{NOTE}')",
        f"INSERT INTO orders VALUES (1, '{EMAILS[0]}', 10), (2, '{EMAILS[1]}', 20), (3, '{EMAILS[0]}', 30)",
    )
    assert cdc.sync() == 0
    cdc.execute(
        f"UPDATE customers SET email = '{EMAILS[2]}', notes = CONCAT(notes, '!') WHERE name = 'bob'",  # a key change
        f"UPDATE orders SET email = '{EMAILS[2]}' WHERE id = 2",
        f"INSERT INTO orders VALUES (4, '{EMAILS[2]}', 40)",
        "DELETE FROM orders WHERE id = 3",
    )
    assert cdc.sync() == 0
    # a table loaded by a snapshot goes through the same policy
    cdc.execute("CREATE TABLE legacy (id INT PRIMARY KEY, secret VARCHAR(40))", f"INSERT INTO legacy VALUES (1, '{LEGACY}')")
    from cdc_assets.cli import main

    assert main(["snapshot", f"{db}.customers", f"{db}.legacy"]) == 0
    assert cdc.sync() == 0
    results = cdc.verify()
    assert results and all(r.ok for r in results), [r.describe() for r in results]
    assert main(["verify"]) == 0

    key = KEY.encode()
    customers = read_current(cdc.lakehouse, TableRef(db, "customers"))
    orders = read_current(cdc.lakehouse, TableRef(db, "orders"))
    assert customers is not None and orders is not None
    assert "notes" not in customers.column_names  # excluded
    by_email = {r["email"]: r for r in customers.to_pylist()}
    assert set(by_email) == {hash_text(key, EMAILS[0]), hash_text(key, EMAILS[2])}  # the hashed key keys and merges
    assert by_email[hash_text(key, EMAILS[0])]["card"] == "***************1234"  # masked: length and the last 4
    # a join of two tables on the hashed column still matches
    joined = sorted((o["id"], by_email[o["email"]]["name"][:3]) for o in orders.to_pylist() if o["email"] in by_email)
    assert joined == [(1, "ann"), (2, "bob"), (4, "bob")]

    out, err = capfd.readouterr()
    files = _files(cdc.lakehouse_dir, tmp_path / "dagster_home")
    assert any(p.suffix == ".parquet" for p in files)
    assert _found(files, CLEAR) == []
    assert _found(files, ["ann-zq-visible"])  # the scan finds a clear value where one is (an unpoliced column)
    assert not [t for t in CLEAR if t in out + err]


class _Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def info(self, message: str) -> None:
        pass

    def error(self, message: str) -> None:
        pass

    def warning(self, message: str) -> None:
        self.warnings.append(message)


def test_policy_changes_are_explicit(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    db = cdc.database
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, email VARCHAR(100), age INT)", "INSERT INTO t VALUES (1, 'a@x.org', 30)")
    capture(source_now(), cdc.lakehouse)  # captured clear
    # a policy added: one sentence naming the command that rewrites earlier layers; the shape changes explicitly.
    # Each capture takes the settings a command started then reads from the environment, as a user's next sync does.
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.t.age")
    monkeypatch.setenv("CDC_HASH_KEY", KEY)
    cdc.execute("INSERT INTO t VALUES (2, 'b@x.org', 40)")
    log = _Log()
    capture(source_now(), cdc.lakehouse, log=log)
    assert log.warnings == [
        f"{db}.t: a column policy now covers age (hashed), but its earlier raw batches, change log, current state and "
        f"history still hold the clear values: run `cdc-lakehouse forget {db}.t --rewrite-policies` to rewrite them."
    ]
    last = read_manifest(cdc.lakehouse.store, list_batches(cdc.lakehouse.store)[-1])
    alters = [c for s, c in last.schema_changes() if s.get("column_policy")]
    assert [c["after"]["columns"][2]["type"] for c in alters] == ["varchar"]
    # a policy taken away is refused, in one sentence, before anything is captured
    monkeypatch.delenv("CDC_HASH_COLUMNS")
    cdc.execute("INSERT INTO t VALUES (3, 'c@x.org', 50)")
    batches = list_batches(cdc.lakehouse.store)
    with pytest.raises(CdcUserError, match=r"put the policy back, or accept the change by taking `cdc-lakehouse snapshot"):
        capture(source_now(), cdc.lakehouse)
    assert list_batches(cdc.lakehouse.store) == batches


def test_hashing_without_a_key_is_one_sentence(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{cdc.database}.t.email")
    monkeypatch.delenv("CDC_HASH_KEY", raising=False)
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, email VARCHAR(100))")
    assert cdc.sync() == 2
    out, err = capfd.readouterr()
    assert "CDC_HASH_COLUMNS is set but CDC_HASH_KEY is not" in out + err and "Traceback" not in out + err
