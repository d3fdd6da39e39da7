"""The documents' examples run exactly as written: the `export` commands and the polars, DuckDB and pandas reading
examples of docs/history.md after `make demo`, in a checkout of their own, reading what the lakehouse holds; on a
history with an ALTER, the reading examples give the exact rows. The README's own blocks (the set-up, and pointing
it at a database of your own) are checked without a server: the command on PATH, the make targets, subcommands,
settings and grants they name."""

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

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
EXAMPLES = ROOT / "docs" / "history.md"  # the export commands and the reading examples


def reading_examples() -> list[str]:
    """The Python code blocks of docs/history.md's "Reading the lakehouse" section."""
    text = EXAMPLES.read_text()
    section = text[text.index("\n## Reading the lakehouse\n") + 1 :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def blocks(language: str, *paths: Path) -> list[str]:
    """Every code block in `language` of the documents `paths`, in order."""
    return [b for path in paths for b in re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)]


def test_every_doc_example_runs_as_written_after_make_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo`'s own command (`cdc-lakehouse demo`) in an empty directory with a newcomer's environment (no
    CDC_* setting, no DAGSTER_HOME, the virtualenv's bin on PATH as `source .venv/bin/activate` puts it), then every
    example block of the docs pages, unchanged: the shell blocks with bash, the Python blocks each in a fresh
    interpreter and, to look at what they read, here. The README's blocks set up or need a database of your own:
    `test_the_readme_blocks_name_what_exists` checks them."""
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
        shell = blocks("sh", *DOCS)
        assert "make demo" in blocks("sh", README)[0]
        assert len(shell) >= 1 and all("cdc-lakehouse" in block for block in shell)
        for block in shell:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert done.returncode == 0 and done.stderr == "", block + done.stdout + done.stderr
        python = blocks("python", README, *DOCS)
        assert python == reading_examples() and len(python) == 3
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
            exec(compile(block, "docs/history.md", "exec"), scope)  # noqa: S102 - the docs' own examples, as written
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


def test_the_readme_blocks_name_what_exists() -> None:
    """The README's blocks run as written once the database is yours: a block that calls `cdc-lakehouse` puts it on
    PATH first (`make install` leaves it in .venv/bin), every make target and subcommand it names exists, every
    setting it exports is in docs/configuration.md's table, the server settings are those the tests' own servers
    start with, and the grants those of the tests' own reader on each flavour."""
    from cdc_assets.cli import COMMANDS
    from cdc_assets.local_source import server

    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    documented = set(re.findall(r"^\| `(CDC_[A-Z0-9_]+)`", (ROOT / "docs" / "configuration.md").read_text(), re.M))
    shell = blocks("sh", README)
    assert len(shell) >= 3 and "make demo" in shell[0]
    for block in shell:
        assert set(re.findall(r"\bmake ([a-z][\w-]*)", block)) <= targets, block
        calls = [m.start() for m in re.finditer(r"^cdc-lakehouse\b", block, re.M)]
        if calls:
            assert 0 <= block.find("source .venv/bin/activate\n") < calls[0], block
        assert set(re.findall(r"^cdc-lakehouse (\w+)", block, re.M)) <= set(COMMANDS), block
        assert set(re.findall(r"^export (CDC_\w+)=", block, re.M)) <= documented, block
    (ini,) = blocks("ini", README)
    started_with = Path(server.__file__).read_text()
    settings = re.findall(r"^(\w+)(?:\s*=\s*(\S+))?$", ini, re.M)
    assert [name for name, _ in settings] == ["log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata"]
    for name, value in settings:  # log_bin has no value: the servers give it a path
        flag = f"--{name.replace('_', '-')}={value}"
        assert flag in started_with, flag
    (sql,) = blocks("sql", README)
    for grants in server.READER_GRANTS.values():
        assert f"GRANT {grants} ON *.* TO 'cdc'@'%';" in sql


def test_the_docs_have_one_reading_example_per_library() -> None:
    examples = reading_examples()
    assert [next(lib for lib in ("polars", "duckdb", "pandas") if lib in b or lib == "pandas") for b in examples] == [
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


def test_the_reading_examples_give_the_exact_rows(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
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

    for block in reading_examples():
        code = block.replace("./lakehouse", str(cdc.lakehouse_dir))
        code = code.replace("shop/orders", f"{cdc.database}/orders").replace("shop.orders", f"{cdc.database}.orders")
        scope: dict = {}
        exec(compile(code, "docs/history.md", "exec"), scope)  # noqa: S102 - the docs' own examples
        assert sorted(_frame_ids(scope["current"])) == want_current, block
        assert _frame_ids(scope["changes"]) == want_changes, block
        assert len(scope["history"]) == versions, block
        if "then" in scope:  # DuckDB's as of a seq: the versions valid then, one per live row
            assert _frame_ids(scope["then"]) == sorted(set(_frame_ids(scope["then"])))
        if "now" in scope:  # pandas: the as-of read now is the current state
            assert sorted(_frame_ids(scope["now"])) == want_current
            assert list(scope["now"].columns) == ["id", "amount", "note", "_cdc_seq", "_cdc_commit_ts"]
