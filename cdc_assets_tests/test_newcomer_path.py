"""The newcomer's path (issue 30): the workload helper on a source it seeded before, and each lakehouse's runs in a
Dagster home of its own, so `status` shows a lakehouse's own freshness and the UI of one never shows another's runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from cdc_assets.cli import main
from cdc_assets.local_source import server
from cdc_assets.runtime.instance import HOME_MARK, home_for
from cdc_assets_tests.conftest import CdcEnv, run_cli


@pytest.mark.parametrize("flavour", server.FLAVOURS)
def test_the_workload_helper_runs_again_on_a_seeded_source(flavour: str, tmp_path: Path) -> None:
    """`python -m cdc_assets.local_source workload 200` failed with a duplicate key (1062) on a source it had seeded:
    the same seed wrote the same SKUs again."""
    env = {**os.environ, "CDC_DEMO_SOURCE": flavour}
    try:
        for _ in range(3):
            done = subprocess.run(
                [sys.executable, "-m", "cdc_assets.local_source", "workload", "200"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert done.returncode == 0 and "ran 201 transactions" in done.stdout, done.stdout + done.stderr
        local = server.running(tmp_path / ".local" / flavour)
        assert local is not None
        with local.admin_connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT COUNT(*), COUNT(DISTINCT sku) FROM shop.products")
            products, distinct = cur.fetchone()
        assert products == distinct and products >= 3 * 30  # every run seeded its own products too
    finally:
        server.stop(tmp_path / ".local" / flavour)


@pytest.mark.both_sources
def test_each_lakehouse_keeps_its_runs_in_its_own_dagster_home(
    cdc: CdcEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DAGSTER_HOME")  # as a user runs it: the home comes from the lakehouse
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    assert main(["sync"]) == 0
    other = tmp_path / "other-lakehouse"
    capsys.readouterr()

    assert main(["--lakehouse", str(other), "status", "--json"]) == 0
    theirs = json.loads(capsys.readouterr().out)
    assert theirs["seconds_since_materialized"] and all(v is None for v in theirs["seconds_since_materialized"].values())
    monkeypatch.setenv("CDC_LAKEHOUSE", str(cdc.lakehouse_dir))  # in this process a flag stays in the environment
    assert main(["status", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert ours["seconds_since_materialized"]["raw_binlog_batches"] is not None  # the sync's own

    home, other_home = (tmp_path / home_for(str(cdc.lakehouse_dir))).resolve(), (tmp_path / home_for(str(other))).resolve()
    assert home != other_home and home.parent == other_home.parent == (tmp_path / ".local").resolve()
    assert (home / HOME_MARK).read_text().strip() == str(cdc.lakehouse_dir)
    assert (other_home / HOME_MARK).read_text().strip() == str(other)
    for where, runs in ((home, 1), (other_home, 0)):
        instance = DagsterInstance.from_config(str(where))
        try:
            assert len(instance.get_runs()) == runs  # `make dev` on the other lakehouse shows none of the sync's
        finally:
            instance.dispose()

    # a DAGSTER_HOME the user sets holds one lakehouse's runs: another lakehouse's command is refused, nothing run
    done = run_cli("--lakehouse", str(other), "sync", env={"DAGSTER_HOME": str(home)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"DAGSTER_HOME={home} holds the runs of the lakehouse at {cdc.lakehouse_dir}" in done.stderr
    assert "unset DAGSTER_HOME" in done.stderr and not (other / "raw").exists()


def test_make_demo_on_mysql_is_the_projects_second_source(tmp_path: Path) -> None:
    """`make demo SOURCE=mysql` runs `cdc-lakehouse --source demo_mysql demo`: the project's second component instance
    (cdc_assets/sources/demo_mysql, copied here as written) on the local demo MySQL server, into its own lakehouse
    under its own name, every table verified equal; the `demo` source's lakehouse is not touched."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "pyproject.toml").write_text(
        '[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "cdc_assets"\ndefs_module = "cdc_assets.sources"\n'
    )
    folder = tmp_path / "cdc_assets" / "sources" / "demo_mysql"
    folder.mkdir(parents=True)
    (folder / "defs.yaml").write_text((root / "cdc_assets" / "sources" / "demo_mysql" / "defs.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "DAGSTER_HOME")) or k == "CDC_MYSQL_DIST"}
    try:
        demo = subprocess.run(
            [sys.executable, "-m", "cdc_assets.cli", "--source", "demo_mysql", "demo", "--seconds", "3"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert demo.returncode == 0 and demo.stderr == "", demo.stdout + demo.stderr
        assert "source: local MySQL" in demo.stdout and "(6 verified equal to the source)" in demo.stdout, demo.stdout
        assert "run `make dev SOURCE=mysql`" in demo.stdout
        assert (tmp_path / "lakehouse-mysql" / "current" / "shop" / "orders").is_dir()
        assert not (tmp_path / "lakehouse").exists() and not (tmp_path / ".local" / "mariadb").exists()
        runs = DagsterInstance.from_config(str(tmp_path / home_for(str(tmp_path / "lakehouse-mysql"))))
        try:
            jobs = {run.job_name for run in runs.get_runs()}
            assert jobs and all(job.startswith("demo_mysql__") for job in jobs), jobs  # under its own name
        finally:
            runs.dispose()
    finally:
        server.stop(tmp_path / ".local" / "mysql")
