"""No difference hides: a table that could not be compared is reported "not compared" (never "ok", never counted as
matching), a table nobody has is a mistyped name, and a check that finds a difference names the table whatever
its key's type."""

from __future__ import annotations

import pytest
from dagster import AssetCheckSeverity
from deltalake import DeltaTable

from cdc_assets.cli import main
from cdc_assets.commands.runs import run_sync
from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.lake.layout import CURRENT
from cdc_assets_tests.conftest import CdcEnv, run_cli
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.test_table_checks import _latest_check

pytestmark = pytest.mark.both_sources

EQUALITY_CHECK = "current_matches_source"


def test_verify_of_a_table_neither_side_has_names_the_mistake(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    assert cdc.sync() == 0
    code = main(["verify", f"{cdc.database}.nosuch"])
    out, err = capsys.readouterr()
    assert code == 2 and "match" not in out, out
    assert f"No table {cdc.database}.nosuch in the source or in the lakehouse: check the name" in err


def test_verify_after_a_failed_sync_says_not_compared(cdc: CdcEnv, capsys) -> None:
    """A sync fails before its batch is durable: every row of the new tables is past the checkpoint, in flight.
    Nothing could be compared, and verify says so (it used to print `ok … 0 rows match`, exit 0)."""
    cdc.execute("CREATE TABLE z (id INT PRIMARY KEY)", "INSERT INTO z VALUES (1)")
    assert cdc.sync() == 0
    cdc.execute("CREATE TABLE a (id INT PRIMARY KEY, v INT)", "CREATE TABLE b (v INT)")
    cdc.execute("INSERT INTO a VALUES (1, 1), (2, 2)", "INSERT INTO b VALUES (7), (7)")
    failed = run_cli("sync", env={failpoints.ENV: "capture.batch_data_written=ioerror"})
    assert failed.returncode != 0, failed.stdout
    code = main(["verify", f"{cdc.database}.a", f"{cdc.database}.b"])
    out = capsys.readouterr().out
    assert code == 3, out
    for table in ("a", "b"):
        assert f"NOT COMPARED {cdc.database}.{table}: not compared" in out and "run `cdc-lakehouse sync`" in out
    assert "0 of 2 tables match the source, 2 not compared" in out
    assert "0 rows match" not in out and "\nok" not in out
    assert cdc.sync() == 0
    assert main(["verify"]) == 0
    assert "3 of 3 tables match the source" in capsys.readouterr().out


def test_every_key_changed_in_flight_is_not_compared_rather_than_zero_rows_matching(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2)")
    assert cdc.sync() == 0
    cdc.execute("UPDATE t SET v = v + 10")  # every key changes after the lakehouse's applied seq
    [result] = cdc.verify()
    assert result.not_compared and not result.ok and not result.differs, result.describe()
    assert result.status == "not compared" and "every one of its rows changed" in result.describe()
    cdc.execute("INSERT INTO t VALUES (3, 3)")  # some rows compared, some left out: compared, and ok
    assert cdc.sync() == 0
    cdc.execute("UPDATE t SET v = 0 WHERE id = 1")
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 2 and result.in_flight_keys == 1, result.describe()


@pytest.mark.parametrize("key", ["DECIMAL(12,3)", "DATETIME(6)", "VARBINARY(16)", "DATE"])
def test_a_check_that_finds_a_difference_names_the_table_whatever_its_key(cdc: CdcEnv, key: str) -> None:
    """A differing table whose key is DECIMAL, DATETIME or binary failed the check after an apply with `TypeError:
    Object of type Decimal is not JSON serializable`, naming no table."""
    value = {"DECIMAL(12,3)": "1.5", "DATETIME(6)": "'2024-01-02 03:04:05.6'", "VARBINARY(16)": "x'00ff'", "DATE": "'2024-01-02'"}[key]
    other = {"DECIMAL(12,3)": "2.5", "DATETIME(6)": "'2025-01-02 03:04:05'", "VARBINARY(16)": "x'01'", "DATE": "'2025-01-02'"}[key]
    cdc.execute(f"CREATE TABLE k (id {key} PRIMARY KEY, v VARCHAR(10))", f"INSERT INTO k VALUES ({value}, 'a')")
    assert run_sync(settings_now()).success
    DeltaTable(str(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "k")))).update(updates={"v": "'tampered'"})
    cdc.execute(f"INSERT INTO k VALUES ({other}, 'b')")  # an apply, whose check sees a commit not the pipeline's
    outcome = run_sync(settings_now())
    assert not outcome.success
    table = f"{cdc.database}.k"
    assert f"current/{cdc.database}/k:{EQUALITY_CHECK}" in outcome.failed_checks, outcome.failed_checks
    check = _latest_check(table, EQUALITY_CHECK)
    assert not check.passed and check.severity == AssetCheckSeverity.ERROR and check.description.startswith(table)
    assert len(check.metadata["different_keys"].value) == 1
