"""The README's "Reading the lakehouse" examples (polars, DuckDB, pandas) run as written against a real sync and
read what the lakehouse holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, HISTORY
from cdc_assets.stages.current_state import read_current
from cdc_assets_tests.conftest import CdcEnv

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_examples() -> list[str]:
    """The Python code blocks of the README's "Reading the lakehouse" section."""
    text = README.read_text()
    section = text[text.index("### Reading the lakehouse") :]
    section = section[: section.index("\n### ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_has_one_example_per_library() -> None:
    blocks = readme_examples()
    assert [next(lib for lib in ("polars", "duckdb", "pandas") if lib in b or lib == "pandas") for b in blocks] == [
        "polars",
        "duckdb",
        "pandas",
    ]


def _frame_ids(frame, column: str = "id") -> list:
    values = frame[column]
    return [int(v) for v in (values.to_list() if hasattr(values, "to_list") else list(values))]


def test_readme_reading_examples_run(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.orders")
    cdc.execute(
        "CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(8,2))",
        "INSERT INTO orders VALUES (1, 10.5), (2, 20), (3, 30)",
        "UPDATE orders SET amount = 11 WHERE id = 1",
        "DELETE FROM orders WHERE id = 2",
    )
    assert cdc.sync() == 0
    cdc.execute("ALTER TABLE orders ADD COLUMN note VARCHAR(20)", "INSERT INTO orders VALUES (4, 40, 'new')")
    assert cdc.sync() == 0

    table = TableRef(cdc.database, "orders")
    lake = cdc.lakehouse
    want_current = sorted(read_current(lake, table, ["id"]).column("id").to_pylist())
    log = read_query(lake.open(CHANGES, table), "SELECT id, _cdc_op FROM changes WHERE id IS NOT NULL ORDER BY _cdc_seq", "changes")
    want_changes = log.column("id").to_pylist()
    versions = read_query(lake.open(HISTORY, table), "SELECT id FROM history", "history").num_rows
    assert want_current == [1, 3, 4] and len(want_changes) == 6 and versions == 7  # 4 written, 2 reopened by the ALTER, 1 after it

    for block in readme_examples():
        code = block.replace("./lakehouse", str(cdc.lakehouse_dir))
        code = code.replace("shop/orders", f"{cdc.database}/orders").replace("shop.orders", f"{cdc.database}.orders")
        scope: dict = {}
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own examples
        assert sorted(_frame_ids(scope["current"])) == want_current, block
        assert _frame_ids(scope["changes"]) == want_changes, block
        assert len(scope["history"]) == versions, block
        if "then" in scope:  # DuckDB's as of a seq: the versions valid then, one per live row
            assert _frame_ids(scope["then"]) == sorted(set(_frame_ids(scope["then"])))
        if "now" in scope:  # pandas: the as-of read now is the current state
            assert sorted(_frame_ids(scope["now"])) == want_current
            assert list(scope["now"].columns) == ["id", "amount", "note", "_cdc_seq", "_cdc_commit_ts"]
