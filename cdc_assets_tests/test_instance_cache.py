"""A new DAGSTER_HOME starts from copies of the empty databases Dagster built once (cdc_assets/runtime/instance.py):
the copies must be what Dagster itself builds, and a sync must run on such a home."""

from __future__ import annotations

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cdc_assets.core.errors import CdcUserError
from cdc_assets.defs.keys import RAW_ASSET
from cdc_assets.runtime import empty_home
from cdc_assets.runtime import instance as home_setup
from cdc_assets_tests.conftest import CdcEnv


def _shape(path: Path) -> dict:
    """What makes an empty Dagster database what it is: its schema, revision, data migrations, journal mode."""
    with sqlite3.connect(path) as db:
        shape = {
            "schema": sorted(db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(), key=str),
            "revision": db.execute("SELECT version_num FROM alembic_version").fetchall(),
            "migrations": sorted(r[0] for r in db.execute("SELECT name FROM secondary_indexes")),
            "journal": db.execute("PRAGMA journal_mode").fetchone(),
        }
    db.close()
    return shape


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(empty_home, "_cache", [])
    return tmp_path / "xdg"


def _open(home: Path, monkeypatch: pytest.MonkeyPatch):
    from cdc_assets.commands.runs import instance

    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return instance()


def test_a_new_home_gets_copies_of_what_dagster_builds_and_a_sync_runs_on_it(
    cdc: CdcEnv, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / "built"
    _open(built, monkeypatch)  # no cache yet: Dagster creates the databases, which become the cache
    assert home_setup.cache_complete()
    assert str(home_setup.cache_dir()).startswith(str(cache / "cdc-lakehouse"))
    cached = {name: (home_setup.cache_dir() / name).stat().st_mtime_ns for name in home_setup.DATABASES.values()}

    seeded = tmp_path / "seeded"
    seeded.mkdir()
    assert home_setup.seed_home(seeded)
    for path in home_setup.DATABASES:
        assert _shape(seeded / path) == _shape(built / path), path

    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    dagster = _open(tmp_path / "fresh", monkeypatch)  # seeded from the cache by ensure_dagster_home
    assert cdc.sync() == 0
    runs = dagster.get_runs()
    assert len(runs) == 1 and runs[0].is_success
    run_db = tmp_path / "fresh" / "history" / "runs" / f"{runs[0].run_id}.db"
    dagster_built_run_db = tmp_path / "built" / "history" / "runs" / "dagster-built.db"
    from cdc_assets.runtime.event_log import empty_run_database

    empty_run_database(dagster, dagster_built_run_db)
    assert _shape(run_db)["schema"] == _shape(dagster_built_run_db)["schema"]
    assert _shape(run_db)["revision"] == _shape(dagster_built_run_db)["revision"]
    assert len(dagster.fetch_materializations(RAW_ASSET, limit=5).records) == 1
    # the cache is never written again
    assert cached == {name: (home_setup.cache_dir() / name).stat().st_mtime_ns for name in home_setup.DATABASES.values()}


def test_an_unwritable_cache_leaves_homes_as_dagster_creates_them(
    cdc: CdcEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(empty_home, "_cache", [])
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    dagster = _open(tmp_path / "home", monkeypatch)
    assert not home_setup.cache_complete()
    assert cdc.sync() == 0
    assert [r.is_success for r in dagster.get_runs()] == [True]


def test_a_new_home_taken_at_once_for_two_lakehouses_goes_to_one_of_them(tmp_path: Path) -> None:
    """Commands for different lakehouses starting together on one new DAGSTER_HOME: exactly one takes it, every
    other is refused, and the mark names the one that took it (a plain write of the mark let several believe the
    home theirs, and their runs would have mixed)."""
    for attempt in range(20):
        home = tmp_path / f"home{attempt}"
        home.mkdir()
        lakehouses = [str(tmp_path / f"lake{attempt}-{n}") for n in range(6)]
        start = threading.Barrier(len(lakehouses))

        def take(location: str, home: Path = home, start: threading.Barrier = start) -> str | None:
            start.wait()
            try:
                home_setup.claim(home, location, "DAGSTER_HOME")
            except CdcUserError:
                return None
            return location

        with ThreadPoolExecutor(len(lakehouses)) as pool:
            took = [t for t in pool.map(take, lakehouses) if t is not None]
        assert len(took) == 1, took
        assert (home / home_setup.HOME_MARK).read_text().strip() == home_setup.lakehouse_identity(took[0])
        assert not [p for p in home.iterdir() if p.name.endswith(".partial")]
