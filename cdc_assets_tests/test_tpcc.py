"""A TPC-C-shaped workload end to end (cdc_assets/local_source/tpcc.py): its nine tables loaded, the foreign keys added
after the load by `ALTER TABLE … ADD CONSTRAINT … FOREIGN KEY … REFERENCES …` as sysbench's TPC-C scripts do (the
tables named as sysbench names them, `stock1`), then its five transactions, through `cdc-lakehouse sync` and through
the continuous mode, on MariaDB and MySQL. At the end every table equals its source, the checks pass (none "not
compared"), `verify` exits 0, and TPC-C's consistency conditions hold on the lakehouse's current-state tables. Issue
42: every table a foreign key's ALTER named, on either side, was reported "not compared: a ddl of the table is in
flight" until a row change of its own was applied after it, and a table no later change touched (item1) for ever.

TPC-C's consistency conditions themselves are tested here without a server."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, DagsterEventType
from deltalake import DeltaTable

from cdc_assets.cli import main
from cdc_assets.commands.runs import instance, run_sync
from cdc_assets.core.names import TableRef
from cdc_assets.defs.keys import table_asset_key
from cdc_assets.lake.layout import CURRENT
from cdc_assets.local_source.tpcc import (
    CONDITION_COLUMNS,
    TABLES,
    Scale,
    Tpcc,
    Violation,
    consistency_violations,
    foreign_key_statements,
)
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import settings_now
from cdc_assets_tests.test_continuous import _continuous_runs, _start, _stopped, _wait_for

SUFFIX = "1"  # sysbench's table names: stock1, item1
SCALE = Scale(warehouses=2)  # remote payments and remote supply need a second warehouse
WORKLOAD_SECONDS = 3.0
TPS = 40.0


# -- the consistency conditions, without a server ------------------------------------------------------------------


def _consistent() -> dict[str, list[dict[str, Any]]]:
    """One warehouse of two districts: district 1 has orders 1-3 (3 undelivered), district 2 orders 1-2 (none)."""
    return {
        "warehouse": [{"w_id": 1, "w_ytd": Decimal("60010.00")}],
        "district": [
            {"d_w_id": 1, "d_id": 1, "d_ytd": Decimal("30010.00"), "d_next_o_id": 4},
            {"d_w_id": 1, "d_id": 2, "d_ytd": Decimal("30000.00"), "d_next_o_id": 3},
        ],
        "orders": [
            {"o_w_id": 1, "o_d_id": 1, "o_id": 1, "o_ol_cnt": 2},
            {"o_w_id": 1, "o_d_id": 1, "o_id": 2, "o_ol_cnt": 1},
            {"o_w_id": 1, "o_d_id": 1, "o_id": 3, "o_ol_cnt": 1},
            {"o_w_id": 1, "o_d_id": 2, "o_id": 1, "o_ol_cnt": 1},
            {"o_w_id": 1, "o_d_id": 2, "o_id": 2, "o_ol_cnt": 1},
        ],
        "new_orders": [{"no_w_id": 1, "no_d_id": 1, "no_o_id": 2}, {"no_w_id": 1, "no_d_id": 1, "no_o_id": 3}],
        "order_line": [
            {"ol_w_id": 1, "ol_d_id": 1, "ol_o_id": o} for o in (1, 1, 2, 3)
        ] + [{"ol_w_id": 1, "ol_d_id": 2, "ol_o_id": o} for o in (1, 2)],
    }  # fmt: skip


def _conditions(state: dict[str, list[dict[str, Any]]]) -> list[tuple[int, str]]:
    return [(v.condition, v.where) for v in consistency_violations(state)]


def test_a_consistent_state_holds_every_condition_as_dicts_and_as_arrow() -> None:
    state = _consistent()
    assert consistency_violations(state) == []
    # as pyarrow tables read from Delta hold them: decimals as decimal128, other columns beside the ones read
    as_arrow = {name: pa.Table.from_pylist(rows) for name, rows in state.items()}
    as_arrow["warehouse"] = as_arrow["warehouse"].append_column("_cdc_seq", pa.array([7], pa.int64()))
    assert consistency_violations(as_arrow) == []
    # a district whose every order was delivered has no NEW-ORDER rows: conditions 2 (for NO_O_ID) and 3 do not apply
    state["new_orders"] = []
    assert consistency_violations(state) == []


def test_a_payment_applied_to_its_warehouse_but_not_its_district_breaks_condition_1() -> None:
    state = _consistent()
    state["warehouse"][0]["w_ytd"] += Decimal("12.34")
    [violation] = consistency_violations(state)
    assert violation == Violation(1, "warehouse 1", "W_YTD 60022.34 != sum(D_YTD) 60010.00")


def test_a_new_order_without_its_district_or_new_order_row_breaks_condition_2() -> None:
    state = _consistent()
    state["orders"].append({"o_w_id": 1, "o_d_id": 1, "o_id": 4, "o_ol_cnt": 1})
    state["order_line"].append({"ol_w_id": 1, "ol_d_id": 1, "ol_o_id": 4})
    assert _conditions(state) == [(2, "district 1 of warehouse 1")]  # D_NEXT_O_ID not moved on
    state["district"][0]["d_next_o_id"] = 5
    assert _conditions(state) == [(2, "district 1 of warehouse 1")]  # max(NO_O_ID) is 3, not 4
    state["new_orders"].append({"no_w_id": 1, "no_d_id": 1, "no_o_id": 4})
    assert _conditions(state) == []


def test_a_delivery_out_of_order_breaks_condition_3_and_lost_order_lines_break_condition_4() -> None:
    state = _consistent()
    state["orders"].append({"o_w_id": 1, "o_d_id": 1, "o_id": 4, "o_ol_cnt": 1})
    state["order_line"].append({"ol_w_id": 1, "ol_d_id": 1, "ol_o_id": 4})
    state["new_orders"].append({"no_w_id": 1, "no_d_id": 1, "no_o_id": 4})
    state["district"][0]["d_next_o_id"] = 5
    del state["new_orders"][1]  # order 3 delivered before order 2
    assert _conditions(state) == [(3, "district 1 of warehouse 1")]
    state = _consistent()
    state["order_line"].pop()  # district 2's last line lost
    assert [str(v) for v in consistency_violations(state)] == [
        "condition 4, district 2 of warehouse 1: sum(O_OL_CNT) = 2, 1 ORDER-LINE rows"
    ]


def test_the_load_is_the_same_for_a_seed_and_holds_every_condition() -> None:
    def loaded(seed: int) -> dict[str, list[dict[str, Any]]]:
        tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
        for table, rows in Tpcc(None, "db", seed=seed, scale=SCALE).initial_rows():  # type: ignore[arg-type]
            tables[table] += rows
        return tables

    first = loaded(7)
    assert first == loaded(7) and first != loaded(8)
    assert consistency_violations(first) == []
    assert {name: len(rows) for name, rows in first.items() if name != "order_line"} == {
        "warehouse": 2, "district": 20, "customer": 600, "history": 600, "orders": 600, "new_orders": 180,
        "item": 100, "stock": 200,
    }  # fmt: skip


def test_the_foreign_keys_are_added_as_sysbench_adds_them() -> None:
    statements = foreign_key_statements("db", SUFFIX)
    assert len(statements) == 10
    assert (
        "ALTER TABLE `db`.stock1 ADD CONSTRAINT fkey_stock_2_1 FOREIGN KEY(s_i_id) REFERENCES `db`.item1(i_id)"
        in statements
    )


# -- end to end ---------------------------------------------------------------------------------------------------


def _lakehouse_tables(cdc: CdcEnv) -> dict[str, pa.Table]:
    """The current-state tables conditions 1-4 read, as pyarrow reads them from Delta."""
    return {
        name: DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, f"{name}{SUFFIX}"))).to_pyarrow_table()
        for name in CONDITION_COLUMNS
    }


def _assert_lakehouse_equals_source(cdc: CdcEnv, tpcc: Tpcc, capsys: pytest.CaptureFixture[str]) -> None:
    """TPC-C's conditions hold on both sides; every table compared and equal, row for row; `verify` exits 0."""
    assert consistency_violations(tpcc.condition_rows()) == []  # the workload's own source
    assert [str(v) for v in consistency_violations(_lakehouse_tables(cdc))] == []
    capsys.readouterr()
    code = main(["verify"])
    shown = capsys.readouterr().out
    assert code == 0, shown  # 3: a table not compared
    compared = cdc.verify()
    assert sorted(str(c.table) for c in compared) == sorted(f"{cdc.database}.{t}{SUFFIX}" for t in TABLES)
    assert [c.describe() for c in compared if not c.ok or c.in_flight_keys] == []
    assert all(c.compared_rows == c.source_rows == c.lakehouse_rows > 0 for c in compared)


@pytest.mark.both_sources
def test_tpcc_through_sync(cdc: CdcEnv, capsys: pytest.CaptureFixture[str]) -> None:
    """A sync after the load and the foreign keys' ALTERs, then one after the workload: each sync's checks pass, none
    says "not compared"."""
    with cdc.server.admin_connection(autocommit=False) as conn:
        tpcc = Tpcc(conn, cdc.database, seed=42, scale=SCALE, suffix=SUFFIX)
        tpcc.load()
        loaded = run_sync(settings_now())
        assert loaded.success and loaded.failed_checks == [] and loaded.warnings == [], "\n".join(loaded.warnings)
        tpcc.run(seconds=WORKLOAD_SECONDS, tps=TPS)
        assert tpcc.stats.transactions["new_order"] and tpcc.stats.transactions["delivery"], tpcc.stats
        after = run_sync(settings_now())
        assert after.success and after.failed_checks == [] and after.warnings == [], "\n".join(
            after.failed_checks + after.warnings
        )
        _assert_lakehouse_equals_source(cdc, tpcc, capsys)


def _equality_evaluations(earlier: set[str], database: str, after: float = 0.0) -> list[Any]:
    """The current_matches_source evaluations of the continuous runs since `earlier`, recorded after the time `after`,
    oldest first."""
    keys = {table_asset_key(f"{database}.{t}{SUFFIX}") for t in TABLES}
    found = [
        (entry.timestamp, entry.dagster_event.event_specific_data)
        for run in _continuous_runs(but=earlier)
        for entry in instance().all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if entry.timestamp > after
    ]
    return [
        e for _, e in sorted(found, key=lambda pair: pair[0])
        if e.asset_key in keys and e.check_name == "current_matches_source"
    ]  # fmt: skip


@pytest.mark.both_sources
def test_tpcc_through_the_continuous_mode(cdc: CdcEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cdc-lakehouse run` follows the load, the foreign keys' ALTERs and the workload as they happen; a full check
    after the workload finds every table equal, and no check on the way found a difference."""
    earlier = {r.run_id for r in _continuous_runs()}
    process = _start(
        {"CDC_CHECK_INTERVAL_SECONDS": "1", "CDC_FULL_CHECK_INTERVAL_SECONDS": "3"}, stderr_to=tmp_path / "run.log"
    )
    try:
        with cdc.server.admin_connection(autocommit=False) as conn:
            tpcc = Tpcc(conn, cdc.database, seed=42, scale=SCALE, suffix=SUFFIX)
            tpcc.load()
            tpcc.run(seconds=WORKLOAD_SECONDS, tps=TPS)

            def caught_up() -> bool:  # nothing in flight any more, nothing differs
                compared = cdc.verify()
                return len(compared) == len(TABLES) and all(not c.differs and not c.in_flight_keys for c in compared)

            _wait_for("the catch-up", caught_up, process, timeout_s=120)
            reached = time.time()

            def fully_checked() -> bool:  # every table's equality checked in full since
                since = _equality_evaluations(earlier, cdc.database, after=reached)
                return len({e.asset_key for e in since if e.metadata["cadence"].value == "full"}) == len(TABLES)

            _wait_for("a full check after the catch-up", fully_checked, process, timeout_s=60)
            out, err = _stopped(process)
            assert process.returncode == 0, out + err
            latest = {e.asset_key: e for e in _equality_evaluations(earlier, cdc.database, after=reached)}
            assert [e.description for e in latest.values() if not e.passed] == []
            evaluations = _equality_evaluations(earlier, cdc.database)
            differed = [e.description for e in evaluations if not e.passed and e.severity == AssetCheckSeverity.ERROR]
            assert differed == []  # found different at no point, in flight or not
            _assert_lakehouse_equals_source(cdc, tpcc, capsys)
    finally:
        if process.poll() is None:
            process.kill()
