"""The Dagster instance the CLI and `make dev` share: DAGSTER_HOME and its dagster.yaml.

Two kinds of instance. A user's own (DAGSTER_HOME with a dagster.yaml they wrote, e.g. PostgreSQL run, event-log and
schedule storage; docs/operating.md) is used as it is, by any number of lakehouses and sources: a source's asset
keys, jobs and run-queue lane carry its name (defs/keys.py). With none, the embedded default: each lakehouse keeps
its runs in a home of its own with our SQLite dagster.yaml, so `status` reads only its own runs' materializations
and the UI of one lakehouse never shows another's runs: `.local/dagster_home` for the default `./lakehouse` (the
demo's, which `make dev` shows), `.local/dagster_home-<name>-<digest>` for any other (`home_for`). A DAGSTER_HOME the
user sets without a dagster.yaml of their own gets ours and holds one lakehouse's runs too: the first lakehouse to
use it marks it as its own, and a command for another is refused with one sentence (`claim`).

Our dagster.yaml names our batching event log (runtime/event_log.py, over the files of Dagster's own SQLite storage;
Dagster's private APIs); CDC_EVENT_BATCHES=0 leaves it out (Dagster's own SQLite event log), and no other instance
loads it (`enable_event_batches`). An instance Dagster cannot open for a reason the user can fix (its storage's
package not installed, its database unreachable) is one sentence (`open_instance`).

The run queue lets one capture, one apply and one sync run of each source go at a time, and one publish run per sink
(tag `cdc/queue`, one value per source and lane; a `sync` run launched from the UI queues too): the lakehouse locks
would keep them apart anyway, but queued runs wait without holding a run slot or timing out on a lock.

A new DAGSTER_HOME starts from copies of empty databases Dagster built once (`seed_home`): creating runs.db,
schedules.db and the event log's index.db with their tables, indexes and data migrations took ~0.5 s of a first
`sync` on a small machine, and a run's own event database its tables. The empty databases are kept in
`$XDG_CACHE_HOME/cdc-lakehouse/` (default `~/.cache`), under a name with the Dagster, SQLAlchemy and alembic
versions that built them; `make install` builds them, and so does the first instance opened on an empty home
without them (a consistent copy of what Dagster just created, before anything is written). The cache is written
to a temporary directory and renamed into place, never overwritten; where it cannot be written, homes are created
as Dagster creates them. This module imports nothing of Dagster unless it opens an instance or builds the cache.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import DEFAULT_LAKEHOUSE, lakehouse_identity
from cdc_assets.runtime.empty_home import DATABASES, RUN_DATABASE, cache_complete, cache_dir, place

DEFAULT_DAGSTER_HOME = Path(".local") / "dagster_home"
HOME_MARK = "cdc_lakehouse"  # in a Dagster home: the lakehouse whose runs it holds
_chosen_here: set[str] = set()  # homes this process chose itself (from the lakehouse), not the user's DAGSTER_HOME
LEGACY_YAML = "telemetry:\n  enabled: false\n"  # what earlier versions wrote
EVENT_BATCH_SIZE = 1000  # events Dagster gathers before it hands them to store_event_batch (cdc_assets.runtime.event_log)
MANAGED_HEADER = "# Written by cdc-lakehouse; delete this line to keep your own edits to this file.\n"
# the tags runs carry (defs/keys.SourceKeys puts them on its jobs): the source a run serves, what it does, and the
# run-queue lane it takes, `<source>/<lane>`, of which any Dagster instance lets one run go at a time (QUEUE_LIMITS)
SOURCE_TAG = "cdc/source"  # the source's name (`-` for the unnamed source of the environment)
STAGE_TAG = "cdc/stage"  # capture, apply, sync, check, forget, repair, continuous, publish
SINK_TAG = "cdc/sink"  # the sink a publish run serves
QUEUE_TAG = "cdc/queue"  # `<source>/capture`, `<source>/apply`, `<source>/sync`, `<source>/sink-<sink>`: one run each
QUEUE_LIMITS = f"""    tag_concurrency_limits:
      - key: {QUEUE_TAG}
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""  # the snippet a user's own dagster.yaml takes under `concurrency: runs:` (docs/operating.md)
EVENT_BATCHES = "CDC_EVENT_BATCHES"  # `0`: our dagster.yaml names Dagster's own SQLite event log, not our batching one
BATCHING_STORAGE = "cdc_assets.runtime.event_log"  # the module of our batching event log, as a dagster.yaml names it


def event_batches_wanted() -> bool:
    """Whether our dagster.yaml names our batching event log (CDC_EVENT_BATCHES, default on)."""
    return os.environ.get(EVENT_BATCHES, "1").strip() != "0"


def instance_yaml(home: Path, batches: bool | None = None) -> str:
    """Our dagster.yaml: the run queue's limits (looked at every second, not every five: queued runs start
    sooner), and, unless `batches` is off (default: `event_batches_wanted`), the event log that writes batches of
    events at once (cdc_assets.runtime.event_log), over the same files as Dagster's default SQLite storage; without
    it, Dagster's default SQLite storage, which reads the same files."""
    batches = event_batches_wanted() if batches is None else batches
    event_log = f"""event_log_storage:
  module: {BATCHING_STORAGE}
  class: BatchingSqliteEventLogStorage
  config:
    base_dir: {json.dumps(str(home / "history" / "runs"))}
"""
    return (
        MANAGED_HEADER
        + f"""telemetry:
  enabled: false
concurrency:
  runs:
    max_concurrent_runs: 4
{QUEUE_LIMITS}run_queue:
  dequeue_interval_seconds: 1
  dequeue_use_threads: true
"""
        + (event_log if batches else "")
    )


def writes_event_batches(home: Path) -> bool:
    """Whether the dagster.yaml of `home` names our batching event log (ours does unless CDC_EVENT_BATCHES=0)."""
    try:
        return f"module: {BATCHING_STORAGE}\n" in (home / "dagster.yaml").read_text()
    except OSError:
        return False


def enable_event_batches(home: Path | None = None) -> None:
    """On an instance whose event log is ours (`home`, default DAGSTER_HOME): Dagster gathers the events of a
    partition range into batches only when DAGSTER_EVENT_BATCH_SIZE is set (in every process that runs or starts
    runs: the CLI, `make dev`, the runs it launches), and alembic loads Dagster's migration scripts once
    (`event_log.share_alembic_scripts`, before the run storage opens). Any other instance: nothing of it."""
    if home is None:
        given = os.environ.get("DAGSTER_HOME")
        if not given:
            return
        home = Path(given)
    if not writes_event_batches(home):
        return
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", str(EVENT_BATCH_SIZE))
    from cdc_assets.runtime.event_log import share_alembic_scripts

    share_alembic_scripts()


def home_for(location: str) -> Path:
    """The Dagster home of a lakehouse, so the runs of two lakehouses never mix (status, freshness, the UI):
    `.local/dagster_home` for the default `./lakehouse` (the demo's, which `make dev` shows), else
    `.local/dagster_home-<its name>-<digest of where it is>`."""
    identity = lakehouse_identity(location)
    if identity == lakehouse_identity(DEFAULT_LAKEHOUSE):
        return DEFAULT_DAGSTER_HOME
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", identity.rsplit("/", 1)[-1]).strip("-.")[:40] or "lakehouse"
    return DEFAULT_DAGSTER_HOME.with_name(f"{DEFAULT_DAGSTER_HOME.name}-{name}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}")


def claim(home: Path, location: str, chosen_by: str) -> None:
    """Mark `home` as the lakehouse's (the first lakehouse to use an unmarked home takes it); a home marked for
    another lakehouse is refused with the fix. `chosen_by` says where the home came from, for the sentence."""
    mark = home / HOME_MARK
    identity = lakehouse_identity(location)
    if not mark.exists():
        # written whole, then linked into place: of two commands taking a new home at once for two lakehouses,
        # one makes the mark and the other reads it (a plain write would let both believe the home theirs)
        home.mkdir(parents=True, exist_ok=True)
        partial = mark.with_name(f".{mark.name}.{os.getpid()}.{threading.get_ident()}.partial")
        partial.write_text(identity + "\n")
        try:
            os.link(partial, mark)
            return
        except FileExistsError:
            pass
        finally:
            partial.unlink(missing_ok=True)
    owner = mark.read_text().strip()
    if owner != identity:
        raise CdcUserError(
            f"{chosen_by} holds the runs of the lakehouse at {owner}, not of {identity}: the runs of two lakehouses "
            "never share one Dagster home, so unset DAGSTER_HOME (each lakehouse then keeps its runs in a home of its "
            "own under .local/) or point it at another directory."
        )


def ensure_dagster_home(location: str | None = None) -> Path:
    """The Dagster home of the lakehouse at `location` (the settings' CDC_LAKEHOUSE): DAGSTER_HOME when the user set
    it, else `home_for` the lakehouse. A dagster.yaml the user wrote is used as it is, by any number of lakehouses.
    Else ours is written there, the home holds one lakehouse's runs (`claim`), and a new one gets the cached empty
    databases (`seed_home`). No `location`: the home DAGSTER_HOME names as it is (the one a command chose for its
    lakehouse before, Dagster's own variable), claimed by nobody."""
    given = os.environ.get("DAGSTER_HOME")
    if location is None:
        home, chosen_by = (Path(given) if given else home_for(DEFAULT_LAKEHOUSE)).resolve(), ""
    elif given and given not in _chosen_here:
        home, chosen_by = Path(given).resolve(), f"DAGSTER_HOME={given}"
    else:
        home = home_for(location).resolve()
        chosen_by = f"The Dagster home {home}"
        _chosen_here.add(str(home))
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    existing = config.read_text() if config.exists() else None
    if is_ours(home):  # the embedded default: one lakehouse's runs, in our SQLite storage
        if location is not None:
            claim(home, location, chosen_by)
        wanted = instance_yaml(home)
        if existing != wanted:
            config.write_text(wanted)
        seed_home(home)
    os.environ["DAGSTER_HOME"] = str(home)  # for Dagster, which reads it, and for processes started from here
    enable_event_batches(home)
    return home


def open_instance(home: Path) -> Any:
    """The Dagster instance of `home` (the DAGSTER_HOME `ensure_dagster_home` chose), opened. What the user can fix
    is one sentence (CdcUserError): a storage whose package is not installed (dagster-postgres), a PostgreSQL that
    does not answer or refuses the connection. A new home of ours that Dagster created itself becomes the cache."""
    from dagster import DagsterInstance

    ours = is_ours(home)
    problem = None if ours else driver_problem(home)
    if problem:
        raise CdcUserError(problem)
    new = ours and is_new(home)
    try:
        with _retries_unsaid():
            dagster = DagsterInstance.get()
    except Exception as exc:  # what is not the user's to fix is raised as it is
        sentence = instance_error(home, exc)
        if sentence is None:
            raise
        raise CdcUserError(sentence) from exc
    if new and not is_new(home):
        remember_new_home(dagster, home)
    return dagster


class _RetryNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Retrying failed database connection")


@contextmanager
def _retries_unsaid() -> Iterator[None]:
    """dagster-postgres logs each retry of a connection on the root logger (a stack of warnings on stderr before the
    command's one sentence): while the instance opens, those notices are dropped; the root logger is left as it was."""
    root = logging.getLogger()
    notice = _RetryNotice()
    placeholder = None if root.handlers else logging.NullHandler()  # else logging.warning() would set one up
    root.addFilter(notice)
    if placeholder:
        root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeFilter(notice)
        if placeholder:
            root.removeHandler(placeholder)


def is_ours(home: Path) -> bool:
    """Whether the dagster.yaml of `home` is ours (or there is none yet): the embedded default's SQLite instance."""
    config = home / "dagster.yaml"
    existing = config.read_text() if config.exists() else None
    return existing is None or existing.startswith(MANAGED_HEADER) or existing == LEGACY_YAML


def _postgres_configs(config: Any) -> list[dict]:
    """The PostgreSQL settings a dagster.yaml gives its storage: `storage: postgres:`, or per storage."""
    if not isinstance(config, dict):
        return []
    found = []
    storage = config.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("postgres"), dict):
        found.append(storage["postgres"])
    for key in ("run_storage", "event_log_storage", "schedule_storage"):
        part = config.get(key)
        if isinstance(part, dict) and str(part.get("module", "")).startswith("dagster_postgres"):
            found.append(part.get("config") if isinstance(part.get("config"), dict) else {})
    return found


def _value(value: Any, default: str) -> str:
    """A dagster.yaml value as Dagster reads it: as written, or `{env: NAME}` from the environment."""
    if isinstance(value, dict):
        return os.environ.get(str(value.get("env", "")), default)
    return default if value is None else str(value)


def driver_problem(home: Path) -> str | None:
    """One sentence when the dagster.yaml of `home` opens PostgreSQL with a driver dagster-postgres cannot work
    with: a URL scheme without a driver (`postgresql://`) is psycopg 3's under SQLAlchemy 2.1, and dagster-postgres
    writes its event notifications in a form only psycopg2 sends (each run then fails at its first event)."""
    import yaml
    from sqlalchemy import __version__ as sqlalchemy_version
    from sqlalchemy.engine.url import make_url

    config_file = home / "dagster.yaml"
    try:
        config = yaml.safe_load(config_file.read_text())
    except (OSError, yaml.YAMLError):
        return None  # Dagster says what is wrong with it
    for postgres in _postgres_configs(config):
        url = _value(postgres.get("postgres_url"), "")
        database = postgres.get("postgres_db")
        scheme = url.split("://", 1)[0] if url else _value(database.get("scheme") if isinstance(database, dict) else None, "postgresql")
        if "+" in scheme:
            continue
        try:
            driver = make_url(f"{scheme}://").get_dialect().driver
        except Exception:  # not a scheme SQLAlchemy knows: Dagster says so
            continue
        if driver != "psycopg2":
            return (
                f"The Dagster instance in {config_file} opens PostgreSQL as {scheme}://, which SQLAlchemy "
                f"{sqlalchemy_version} drives with {driver}, and dagster-postgres works only with psycopg2: add "
                "`scheme: postgresql+psycopg2` under its postgres_db (or begin its postgres_url with "
                "postgresql+psycopg2://)."
            )
    return None


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return seen


# a module a dagster.yaml's storage needs -> what installs it
INSTALLS = {"dagster_postgres": "dagster-postgres", "psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary"}


def instance_error(home: Path, exc: BaseException) -> str | None:
    """One sentence for an instance that could not be opened for a reason the user can fix, else None."""
    config = home / "dagster.yaml"
    for cause in _causes(exc):
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            top = cause.name.split(".")[0]
            package = INSTALLS.get(top, top.replace("_", "-"))
            return (
                f"The Dagster instance in {config} needs the Python package {package}, which is not installed: "
                f"install it (`pip install {package}` in the environment of cdc-lakehouse), or set DAGSTER_HOME to "
                "another instance (unset, each lakehouse keeps its runs under .local/)."
            )
        if type(cause).__name__ == "OperationalError" and type(cause).__module__.split(".")[0] in ("psycopg", "psycopg2"):
            reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0].strip()
            return (
                f"The PostgreSQL database of the Dagster instance in {config} cannot be reached ({reason}): start "
                "that server, or fix the storage's hostname, port, user or database in that dagster.yaml."
            )
    return None


def is_new(home: Path) -> bool:
    return not any((home / path).exists() for path in DATABASES)


def seed_home(home: Path) -> bool:
    """Copies of the cached empty databases in a new home; False when the home has databases or there is no cache."""
    if not is_new(home) or not cache_complete():
        return False
    cache = cache_dir()
    return all([place(cache / name, home / path) for path, name in DATABASES.items()])


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (its WAL included), in WAL mode as Dagster keeps its databases."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode=WAL")
    src.close()
    dst.close()


def save_cache(databases: dict[str, Path]) -> bool:
    """Keep these just-created empty databases (cache name -> file) as the cache, unless it is there already;
    written whole under a temporary name and renamed into place. False when it could not be written."""
    cache = cache_dir()
    if cache_complete():
        return True
    staging = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
        for name, path in databases.items():
            if not path.is_file():  # not created yet: no cache from this home
                return False
            copy_database(path, staging / name)
            with sqlite3.connect(staging / name) as copied:
                if not copied.execute("SELECT version_num FROM alembic_version").fetchall():
                    return False
            copied.close()
        os.rename(staging, cache)  # fails when another process put a cache there first: its stays
        staging = None
        return True
    except (OSError, sqlite3.Error):
        return False
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def remember_new_home(dagster: object, home: Path) -> None:
    """After Dagster created the databases of a new home itself (no cache yet): keep them, still empty, as the cache."""
    if cache_complete():
        return
    from cdc_assets.runtime.event_log import empty_run_database

    with tempfile.TemporaryDirectory() as tmp:
        run = empty_run_database(dagster, Path(tmp) / RUN_DATABASE)
        save_cache({**{name: home / path for path, name in DATABASES.items()}, RUN_DATABASE: run})


def build_cache() -> Path:
    """The cache of empty databases, built by Dagster in a home of its own (`make install` runs this)."""
    if cache_complete():
        return cache_dir()
    from dagster import DagsterInstance

    from cdc_assets.runtime.event_log import share_alembic_scripts

    share_alembic_scripts()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "dagster.yaml").write_text(instance_yaml(home, batches=True))
        dagster = DagsterInstance.from_config(str(home))
        try:
            dagster.get_runs(limit=1)
            remember_new_home(dagster, home)
        finally:
            dagster.dispose()
    return cache_dir()


if __name__ == "__main__":
    print(ensure_dagster_home())
    build_cache()
