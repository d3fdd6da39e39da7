"""Schemas written by other CDC projects' test suites and by hand (issue 27): each odd table is captured, applied and
verified like any other, on both flavours where the feature exists. And where one still cannot be handled, it is
quarantined and the others go on (test_quarantine.py)."""

from __future__ import annotations

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.quarantine import quarantined_tables
from cdc_assets.stages.current_state import read_current
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
def test_an_alter_naming_a_column_in_another_letter_case(cdc: CdcEnv) -> None:
    """`MODIFY COLUMN C …` for a column `c` (MariaDB then names it `C`), and a CHANGE that only changes its case, failed
    with "Duplicate field name (case-insensitive)" and stopped every later sync."""
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, c INT, d INT)", "INSERT INTO t VALUES (1, 1, 1)")
    _synced_and_verified(cdc)
    cdc.execute("ALTER TABLE t MODIFY COLUMN C BIGINT", "INSERT INTO t VALUES (2, 5000000000, 2)")
    _synced_and_verified(cdc)
    cdc.execute("ALTER TABLE t CHANGE COLUMN d D INT", "UPDATE t SET D = 3 WHERE id = 1")
    _synced_and_verified(cdc)
    cdc.execute("INSERT INTO t VALUES (3, 3, 3)")
    _synced_and_verified(cdc)
