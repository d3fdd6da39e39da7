"""Where the cached empty Dagster databases are kept, and how a copy is put in place (see runtime/instance.py)."""

import os
import shutil
from pathlib import Path

# The databases of an empty home (under DAGSTER_HOME) and the name each has in the cache, and a run's own.
DATABASES = {
    Path("history") / "runs.db": "runs.db",
    Path("schedules") / "schedules.db": "schedules.db",
    Path("history") / "runs" / "index.db": "index.db",
}
RUN_DATABASE = "run.db"
_cache: list[Path] = []


def cache_dir() -> Path:
    """Where this installation's empty databases are kept: one directory per Dagster, SQLAlchemy, alembic version."""
    if not _cache:
        from importlib.metadata import version

        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        versions = "-".join(f"{name}{version(name)}" for name in ("dagster", "sqlalchemy", "alembic"))
        _cache.append(base / "cdc-lakehouse" / f"empty-dagster-home-{versions}")
    return _cache[0]


def cache_complete() -> bool:
    cache = cache_dir()
    return all((cache / name).is_file() for name in [*DATABASES.values(), RUN_DATABASE])


def place(source: Path, target: Path) -> bool:
    """A copy of `source` at `target`, made whole before it appears there (a hard link of a finished copy) and never
    over a file already there; False when it is not placed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(source, partial)
        os.link(partial, target)
        return True
    except OSError:  # already there (another process created it), or not copyable: Dagster creates it
        return False
    finally:
        partial.unlink(missing_ok=True)
