"""The README's examples (the `export` commands, and the polars, DuckDB and pandas reading examples) run exactly as
written after `make demo`, in a checkout of their own, and read what the lakehouse holds; and on a history with an
ALTER, the examples give the exact rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES, HISTORY
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_examples() -> list[str]:
    """The Python code blocks of the README's "Reading the lakehouse" section."""
    text = README.read_text()
    section = text[text.index("### Reading the lakehouse") :]
    section = section[: section.index("\n### ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def readme_blocks(language: str) -> list[str]:
    """Every code block of the README in `language`."""
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def test_every_readme_example_runs_as_written_after_make_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo`'s own command (`cdc-lakehouse demo`) in an empty directory with a newcomer's environment (no
    CDC_* setting, no DAGSTER_HOME), then every example block of the README but the set-up one (`make demo`, `make
    test`), unchanged: the shell blocks with bash, the Python blocks each in a fresh interpreter and, to look at what
    they read, here."""
    from cdc_assets.lake.store import Lakehouse
    from cdc_assets.local_source import server

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "DAGSTER_HOME")) or k == "CDC_MYSQL_DIST"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # cdc-lakehouse, as the venv has it
    demo = subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", "demo", "--seconds", "6"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    try:
        assert demo.returncode == 0 and demo.stderr == "", demo.stdout + demo.stderr
        shell = readme_blocks("sh")
        assert "make demo" in shell[0]
        assert len(shell) >= 2 and all("cdc-lakehouse" in block for block in shell[1:])
        for block in shell[1:]:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert done.returncode == 0 and done.stderr == "", block + done.stdout + done.stderr
        python = readme_blocks("python")
        assert python == readme_examples() and len(python) == 3
        for block in python:
            done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert done.returncode == 0, block + done.stderr

        # what they read is the lakehouse's: the source's orders, their changes and versions
        local = server.running(tmp_path / ".local" / "mariadb")
        assert local is not None
        with local.admin_connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT id FROM shop.orders ORDER BY id")
            orders = [int(row[0]) for row in cur.fetchall()]
        assert orders
        exported = pq.read_table(tmp_path / "orders.parquet")
        assert sorted(exported.column("id").to_pylist()) == orders  # as of now: the source's rows
        assert pq.read_table(tmp_path / "orders-at-seq-1000.parquet").num_rows >= 0
        monkeypatch.chdir(tmp_path)
        for name in ("CDC_LAKEHOUSE", "CDC_HISTORY_TABLES"):
            monkeypatch.delenv(name, raising=False)
        for block in python:
            scope: dict = {}
            exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own examples, as written
            assert _same_ids(scope["current"], orders), block
            seqs = [int(v) for v in scope["changes"]["_cdc_seq"]]
            assert seqs == sorted(seqs) and len(seqs) >= len(orders), block
            assert len(scope["history"]) >= len(orders), block  # a version per live row at least
            if "then" in scope:  # one version per row live at that seq
                assert len(scope["then"]) == len(set(scope["then"]["_cdc_key"].to_list())) > 0
            if "now" in scope:
                assert _same_ids(scope["now"], orders)
        assert Lakehouse(str(tmp_path / "lakehouse")).has_table(HISTORY, TableRef("shop", "orders"))
    finally:
        server.stop(tmp_path / ".local" / "mariadb")


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


def _same_ids(frame, ids: list[int]) -> bool:
    """The frame's ids are `ids`: exactly, or as floats where the reader gives a DECIMAL(20,0) (BIGINT UNSIGNED) as a
    float (DuckDB's `.df()`)."""
    values = frame["id"]
    values = values.to_list() if hasattr(values, "to_list") else list(values)
    if any(isinstance(v, float) for v in values):
        return sorted(values) == sorted(float(i) for i in ids)
    return sorted(int(v) for v in values) == sorted(ids)


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
