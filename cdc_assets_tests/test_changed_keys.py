"""The equality check after an apply compares only the keys it changed (and the row counts), falls back to every
row when that cannot be trusted, and the comparison of every row (job check_equality) finds what it cannot see."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from dagster import AssetCheckKey, DagsterEventType

from cdc_assets.commands.runs import instance as _instance
from cdc_assets.core.names import TableRef
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import EQUALITY_JOB, table_asset_key
from cdc_assets.verification.changed_keys import compare_changed, compare_every_row, load_checked
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_consistency import _binlog, _busy, _table_t, _up_to_date

pytestmark = pytest.mark.both_sources


def _last_equality_check(table: str) -> tuple[bool, str, dict[str, Any]]:
    """The table's newest current_matches_source evaluation: passed, description, and its figures."""
    record = _instance().get_latest_asset_check_evaluation_record(AssetCheckKey(table_asset_key(table), "current_matches_source"))
    assert record is not None and record.event is not None
    evaluation = record.event.dagster_event.event_specific_data
    figures = {k: getattr(v, "value", v) for k, v in evaluation.metadata.items()}
    return evaluation.passed, evaluation.description or "", figures


def _full_check() -> tuple[bool, str]:
    """A run of the check_equality job: whether it passed, and the sentence naming what differs."""
    job = build_definitions().resolve_job_def(EQUALITY_JOB)
    result = job.execute_in_process(instance=_instance(), raise_on_error=False)
    failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    described = [e.step_failure_data.user_failure_data.description for e in failures if e.step_failure_data.user_failure_data]
    return result.success, "; ".join(described)


def test_the_check_after_an_apply_reads_the_changed_keys_and_the_full_check_the_rest(cdc: CdcEnv) -> None:
    table = f"{cdc.database}.t"
    cdc.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM " + cdc.numbers(400),
    )
    assert cdc.sync() == 0
    passed, _, first = _last_equality_check(table)
    assert passed and first["scope"].startswith("every row") and first["compared_rows"] == 400
    checked = load_checked(cdc.lakehouse.store, TableRef(cdc.database, "t"))
    assert checked is not None and checked.source_rows == checked.lakehouse_rows == 400

    # 6 keys change: two updates, a delete, an insert, and a key moved (both its keys count)
    cdc.execute(
        "UPDATE t SET v = 'new' WHERE id IN (5, 6)",
        "DELETE FROM t WHERE id = 8",
        "INSERT INTO t VALUES (1000, 'added')",
        "UPDATE t SET id = 2000 WHERE id = 9",
    )
    assert cdc.sync() == 0
    passed, _, second = _last_equality_check(table)
    assert passed and second["scope"] == "changed keys"
    assert second["changed_keys"] == 6  # 5, 6, 8, 1000, 9, 2000
    assert second["compared_rows"] == 4  # those still in the source: 5, 6, 1000, 2000
    assert second["source_rows"] == second["lakehouse_rows"] == 400
    # nothing changed since: said so, not "0 rows match"
    (quiet,) = compare_changed(_binlog(cdc).settings(), cdc.lakehouse, [TableRef(cdc.database, "t")])
    assert quiet.ok and quiet.describe().startswith(
        f"{table}: no key changed since it was last found equal, and the row counts agree (400 in the source)"
    )

    # A source row changed without a binlog event: not among any apply's keys, so only every row shows it.
    cdc.execute("SET sql_log_bin = 0", "UPDATE t SET v = 'drift' WHERE id = 50", "SET sql_log_bin = 1")
    cdc.execute("UPDATE t SET v = 'next' WHERE id = 7")
    assert cdc.sync() == 0  # the check after this apply compares key 7 and the counts only
    assert _last_equality_check(table)[2]["changed_keys"] == 1
    ok, described = _full_check()
    assert not ok and f"{table}: " in described and "1 different: 50" in described

    # A row gone without a binlog event changes the count: the check after the next apply compares every row.
    cdc.execute("SET sql_log_bin = 0", "DELETE FROM t WHERE id = 60", "SET sql_log_bin = 1")
    cdc.execute("UPDATE t SET v = 'again' WHERE id = 7")
    assert cdc.sync() == 1
    passed, description, third = _last_equality_check(table)
    assert not passed and "1 extra: 60" in description and "1 different: 50" in description
    assert third["scope"] == "every row: its changed keys or row counts differed"


def test_changed_keys_compared_while_the_source_writes_and_syncs_run(cdc: CdcEnv, spark) -> None:
    """Keys in flight (captured or not, applied or not) are left out of the changed keys and of the counts alike:
    no false difference, and no comparison of every row for lack of trust."""
    table = _table_t(cdc, spark)
    settings = _binlog(cdc).settings()
    assert all(c.ok for c in compare_every_row(settings, cdc.lakehouse, [table]))
    stop, writes, failures = threading.Event(), [0], []

    def sync() -> None:
        try:
            while not stop.is_set():
                _up_to_date(cdc, spark)
        except Exception as exc:  # reported below: a failing sync must fail the test, not hang it
            failures.append(exc)

    threads = [threading.Thread(target=_busy, args=(cdc, stop, writes)), threading.Thread(target=sync)]
    for thread in threads:
        thread.start()
    comparisons: list[ConsistentComparison] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not failures and len({c.applied_seq for c in comparisons}) < 3:
            comparisons += compare_changed(settings, cdc.lakehouse, [table])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures and len({c.applied_seq for c in comparisons}) >= 3, failures
    assert all(c.ok for c in comparisons), [c.describe() for c in comparisons if not c.ok]
    assert all(c.scope == "changed keys" for c in comparisons), [c.scope for c in comparisons if c.scope != "changed keys"]
    assert any(c.in_flight_keys for c in comparisons) and any(c.changed_keys for c in comparisons)
    _up_to_date(cdc, spark)  # quiet now: every change applied, and every row still equal
    assert all(c.ok for c in compare_every_row(settings, cdc.lakehouse, [table]))


def test_a_snapshot_since_the_last_check_makes_the_next_one_read_every_row(cdc: CdcEnv, capsys) -> None:
    """A snapshot's rows are not in the change log: the check after it compares every row, then changed keys again."""
    from cdc_assets.cli import main

    table = f"{cdc.database}.t"
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))", "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    assert cdc.sync() == 0
    assert main(["snapshot", table]) == 0
    cdc.execute("INSERT INTO t VALUES (3, 'c')")
    assert cdc.sync() == 0
    passed, _, figures = _last_equality_check(table)
    assert passed and figures["scope"].startswith("every row: version ") and "replaced every row" in figures["scope"]
    assert figures["compared_rows"] == 3
    cdc.execute("UPDATE t SET v = 'd' WHERE id = 3")
    assert cdc.sync() == 0
    passed, _, figures = _last_equality_check(table)
    assert passed and figures["scope"] == "changed keys" and figures["changed_keys"] == figures["compared_rows"] == 1
