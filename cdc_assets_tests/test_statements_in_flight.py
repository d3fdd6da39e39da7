"""A statement holds a table's comparison off only while it may change that table's rows or columns and the lakehouse
has not applied it (issue 42). A foreign key on another table, a routine, trigger, view or event whose body names
the table, REPAIR / OPTIMIZE / ANALYZE / CHECK TABLE, GRANT / REVOKE and comments change none of its rows: the table
is compared at once, and a row changed behind the pipeline's back is found. An ALTER that adds a column holds it off
until the next sync applies it, and says which `_cdc_seq` that is. Once that table is compared again, a check
evaluation restated by later runs says once which run evaluated it."""

from __future__ import annotations

import pytest

from cdc_assets.capture.run import capture
from cdc_assets.cli import main
from cdc_assets.commands.runs import instance
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.defs.code_location import build_definitions
from cdc_assets.defs.keys import EQUALITY_JOB
from cdc_assets.defs.resources import BinlogResource, CadenceResource
from cdc_assets.defs.table_checks import EQUALITY_CHECK
from cdc_assets.lake.raw_batches import BatchManifest, list_batches, read_manifest
from cdc_assets.verification.consistency import _Target
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_table_checks import _latest_check

pytestmark = pytest.mark.both_sources


def _batch(offset: int, first_seq: int, next_seq: int, statements: list[dict]) -> BatchManifest:
    start, end = BinlogPosition("mysql-bin.000001", offset), BinlogPosition("mysql-bin.000001", offset + 100)
    return BatchManifest(
        start.batch_name(), start, end, None, first_seq, next_seq, 0, 0, 0, None, {}, "", 0, {"statements": statements}
    )


def test_a_statement_is_released_once_the_stage_has_taken_in_all_its_table_had_up_to_it() -> None:
    """The current-state stage's progress for the table, or batches that hold no change of it: never a statement
    after a batch with a change of the table the stage has not taken in, nor one after the snapshot's point."""
    item = TableRef("shop", "item")
    repair = {"seq": "25", "kind": "ddl", "schema": "shop", "query": "REPAIR TABLE item"}
    alter = {"seq": "35", "kind": "ddl", "schema": "shop", "query": "ALTER TABLE item ADD COLUMN c INT",
             "changes": [{"table": "shop.item", "action": "alter", "seq": "35"}]}  # fmt: skip
    batches = [_batch(100, 11, 21, [alter | {"seq": "15"}]), _batch(200, 21, 31, [repair]),
               _batch(300, 31, 41, [alter]), _batch(400, 41, 51, [repair | {"seq": "45"}])]  # fmt: skip
    for progress, cap, released in ((batches[0].name, None, 30), (None, None, 10), (batches[2].name, 43, 43), (batches[0].name, 25, 25)):
        target = _Target(item, None, 10, None, after_seq=10, progress_batch=progress, release_cap=cap)
        for batch in batches:
            target.take_in(batch, set(batch.tables()))
        assert target.statements_after == released, (progress, cap)


def _naming_item(user: str) -> list[str]:
    """Every kind of statement that names `item` and changes none of its rows or columns."""
    return [
        "ALTER TABLE stock ADD CONSTRAINT stock_item FOREIGN KEY (item_id) REFERENCES item (id)",
        "CREATE DEFINER=`root`@`localhost` PROCEDURE promote(IN i INT) BEGIN UPDATE item SET price = price + 1 "
        "WHERE id = i; END",
        "CREATE FUNCTION item_price(i INT) RETURNS DECIMAL(6,2) DETERMINISTIC READS SQL DATA "
        "RETURN (SELECT price FROM item WHERE id = i)",
        "CREATE TRIGGER stock_sold AFTER UPDATE ON stock FOR EACH ROW UPDATE item SET price = price WHERE id = NEW.item_id",
        "CREATE VIEW cheap_items AS SELECT id, name FROM item WHERE price < 3",
        "CREATE EVENT item_sweep ON SCHEDULE EVERY 1 DAY DISABLE DO DELETE FROM item WHERE price < 0",
        "REPAIR TABLE item",
        "OPTIMIZE TABLE item",
        "ANALYZE TABLE item",
        "CHECK TABLE item",
        f"CREATE USER {user}",
        f"GRANT SELECT ON item TO {user}",
        f"REVOKE SELECT ON item FROM {user}",
        f"DROP USER {user}",
        "ALTER TABLE item COMMENT = 'what is sold'",
        "CREATE INDEX stock_qty ON stock (qty) /* how much of each item is left */",
    ]


def _verify(cdc: CdcEnv, capsys: pytest.CaptureFixture[str], *tables: str) -> tuple[int, str]:
    code = main(["verify", *(f"{cdc.database}.{t}" for t in tables)])
    return code, capsys.readouterr().out


def test_a_table_named_by_statements_that_change_none_of_its_rows_is_compared(
    cdc: CdcEnv, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = cdc.database
    cdc.execute(
        "CREATE TABLE item (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(6,2))",
        "CREATE TABLE stock (id INT PRIMARY KEY, item_id INT, qty INT)",
        "INSERT INTO item VALUES (1, 'pen', 1.50), (2, 'ink', 2.50), (3, 'pad', 3.50)",
        "INSERT INTO stock VALUES (1, 1, 10), (2, 2, 20)",
    )
    assert cdc.sync() == 0

    # in the binlog, not captured yet: `item` is compared, and equal
    cdc.execute(*_naming_item(f"'cdc_{db[-6:]}'@'localhost'"))
    code, out = _verify(cdc, capsys, "item")
    assert code == 0 and f"{db}.item: 3 rows match" in out, out

    # captured, not applied: an ALTER that adds a column holds `stock` off, naming the seq the next sync applies
    cdc.execute(
        "ALTER TABLE item MODIFY price DECIMAL(6,2) COMMENT 'in euros'",
        "ALTER TABLE stock ADD COLUMN note VARCHAR(10)",
    )
    capture(BinlogResource(mysql_url=cdc.server.reader_url(), tables=f"{db}.*").settings(), cdc.lakehouse)
    [batch] = [read_manifest(cdc.lakehouse.store, n) for n in list_batches(cdc.lakehouse.store)][-1:]
    [alter] = [s for s in batch.raw["statements"] if "ADD COLUMN note" in s["query"]]
    code, out = _verify(cdc, capsys, "stock")
    assert code == 3, out
    assert (
        f"{db}.stock: not compared at " in out
        and f"a ddl of the table at _cdc_seq {alter['seq']} (`ALTER TABLE stock ADD COLUMN note VARCHAR(10)`) is not "
        "applied yet; the next sync applies it" in out
    ), out

    # applied: every table is compared again, by the check of every row and by verify
    assert cdc.sync() == 0
    result = build_definitions().resolve_job_def(EQUALITY_JOB).execute_in_process(instance=instance(), raise_on_error=False)
    assert result.success
    for table, rows in (("item", 3), ("stock", 2)):
        check = _latest_check(f"{db}.{table}", EQUALITY_CHECK)
        assert check.passed and f"{rows} rows match" in check.description, check.description
    code, out = _verify(cdc, capsys)
    assert code == 0 and "2 of 2 tables match the source" in out, out

    # a row changed behind the pipeline's back is found
    cdc.execute("SET sql_log_bin = 0", "UPDATE item SET price = 9.99 WHERE id = 2", "SET sql_log_bin = 1")
    code, out = _verify(cdc, capsys, "item")
    assert code == 1 and f"{db}.item" in out and "1 different: 2" in out, out
    result = build_definitions().resolve_job_def(EQUALITY_JOB).execute_in_process(instance=instance(), raise_on_error=False)
    assert not result.success
    evaluated = _latest_check(f"{db}.item", EQUALITY_CHECK)
    assert not evaluated.passed and "1 different: 2" in evaluated.description
    said = f"unchanged since evaluated in run {result.run_id[:8]}: {evaluated.description}"

    # restated by each later run's confirmation of the quiet table: the cause once, the run that evaluated it once
    monkeypatch.setattr(CadenceResource, "confirm_every_seconds", property(lambda self: 0.0))
    descriptions = []
    for _ in range(3):
        cdc.sync()
        restated = _latest_check(f"{db}.item", EQUALITY_CHECK)
        assert not restated.passed
        descriptions.append(restated.description)
    assert descriptions == [said, said, said], descriptions
