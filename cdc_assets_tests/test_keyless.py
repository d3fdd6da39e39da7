"""Tables without a primary key keep duplicate rows as the source does: a delete removes one matching row,
an update changes one."""

from __future__ import annotations

from collections import Counter

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import open_table
from cdc_assets.lake.layout import CURRENT
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

pytestmark = pytest.mark.both_sources


def _rows(cdc: CdcEnv) -> Counter:
    current = read_current(cdc.lakehouse, TableRef(cdc.database, "k"), ["a", "b"])
    return Counter(zip(current.column("a").to_pylist(), current.column("b").to_pylist(), strict=True))


def _source(cdc: CdcEnv) -> Counter:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT a, b FROM k")
        return Counter(cur.fetchall())


def test_duplicates_are_kept_and_changed_one_at_a_time(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE k (a INT, b VARCHAR(10))",
        "INSERT INTO k VALUES (1, 'x'), (1, 'x'), (1, 'x'), (2, 'y'), (NULL, 'n'), (NULL, 'n')",
    )
    assert cdc.sync() == 0
    assert _rows(cdc) == Counter({(1, "x"): 3, (2, "y"): 1, (None, "n"): 2})

    cdc.execute(
        "DELETE FROM k WHERE a = 1 LIMIT 1",  # one of three copies
        "UPDATE k SET b = 'z' WHERE a = 1 LIMIT 1",  # one of the two left
        "INSERT INTO k VALUES (2, 'y')",  # a second copy
        "DELETE FROM k WHERE a IS NULL LIMIT 1",
        "UPDATE k SET b = 'w' WHERE a = 2",  # both copies at once
    )
    assert cdc.sync() == 0
    assert _rows(cdc) == _source(cdc) == Counter({(1, "x"): 1, (1, "z"): 1, (2, "w"): 2, (None, "n"): 1})

    # Changes spread over several syncs, and an update back to an existing row's values.
    cdc.execute("UPDATE k SET b = 'x' WHERE b = 'z'", "INSERT INTO k VALUES (1, 'x')")
    assert cdc.sync() == 0
    cdc.execute("DELETE FROM k WHERE a = 1 LIMIT 2")
    assert cdc.sync() == 0
    assert _rows(cdc) == _source(cdc) == Counter({(1, "x"): 1, (2, "w"): 2, (None, "n"): 1})
    results = cdc.verify()
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert results[0].compared_rows == 4


def test_keyless_snapshot_then_changes(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE k (a INT, b VARCHAR(10))", "INSERT INTO k VALUES (5, 'e'), (5, 'e'), (6, 'f')")
    from cdc_assets.cli import main

    assert main(["snapshot", f"{cdc.database}.k"]) == 0
    assert _rows(cdc) == Counter({(5, "e"): 2, (6, "f"): 1})
    cdc.execute("DELETE FROM k WHERE a = 5 LIMIT 1", "INSERT INTO k VALUES (6, 'f')")
    assert cdc.sync() == 0
    assert _rows(cdc) == _source(cdc) == Counter({(5, "e"): 1, (6, "f"): 2})


def test_a_trailing_delete_is_applied_once_after_commits_that_are_not_the_pipelines(cdc: CdcEnv) -> None:
    """A keyless table's newest applied change is a DELETE of one of two copies, so no row holds its seq.
    Twenty-odd commits by someone else (property changes, an OPTIMIZE) once pushed the recorded seq out of
    the history the pipeline read: it fell back to the rows' highest seq and deleted the second copy too."""
    cdc.execute("CREATE TABLE k (a INT, b VARCHAR(10))", "INSERT INTO k VALUES (1, 'x'), (1, 'x'), (2, 'y')")
    assert cdc.sync() == 0
    cdc.execute("DELETE FROM k WHERE a = 1 LIMIT 1")
    assert cdc.sync() == 0
    current = open_table(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "k")), None)
    for i in range(25):
        current.alter.set_table_properties({"delta.checkpointInterval": str(10 + i % 2)})
    current.optimize.compact()
    cdc.execute("INSERT INTO k VALUES (3, 'z')")  # so the next sync applies to the table again
    assert cdc.sync() == 0
    assert _rows(cdc) == _source(cdc) == Counter({(1, "x"): 1, (2, "y"): 1, (3, "z"): 1})
