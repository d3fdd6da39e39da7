"""The `MySQLSource` components of a `dg` project, read from their defs.yaml files without loading Dagster's
definitions: how `cdc-lakehouse --source NAME` finds a source's settings (the project of the working directory)."""

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cdc_assets.components.mysql_source import MySQLSource, variables_of
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import Settings

COMPONENT_TYPES = {"cdc_assets.components.MySQLSource", "cdc_assets.components.mysql_source.MySQLSource"}
# The variables of the process, not of a source: they stay the environment's when a source is named.
PROCESS_VARIABLES = ("CDC_PROGRESS_SECONDS", "CDC_SYNC_FORK")


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` whose pyproject.toml makes it a `dg` project."""
    for folder in [start, *start.parents]:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "dg" in _toml(pyproject).get("tool", {}):
            return folder
    return None


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as file:
        return tomllib.load(file)


def defs_folder(root: Path) -> Path:
    """The project's defs folder: [tool.dg.project] defs_module (default `<root_module>.defs`), in a src layout or not."""
    project = _toml(root / "pyproject.toml").get("tool", {}).get("dg", {}).get("project", {})
    module = project.get("defs_module") or f"{project.get('root_module', root.name)}.defs"
    relative = Path(*module.split("."))
    return next((base / relative for base in (root, root / "src") if (base / relative).is_dir()), root / relative)


def project_sources(root: Path) -> list[tuple[Path, MySQLSource]]:
    """Every MySQLSource component under the project's defs folder, with the defs.yaml that declares it."""
    found = []
    for path in sorted(defs_folder(root).rglob("defs.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, Mapping) and document.get("type") in COMPONENT_TYPES:
                attributes = document.get("attributes") or {}
                found.append((path, MySQLSource.resolve_from_yaml(yaml.safe_dump(dict(attributes)))))
    return found


def named_source(name: str, start: Path) -> MySQLSource:
    """The project's source called `name`; one sentence naming the sources there are when there is none."""
    root = project_root(start)
    if root is None:
        raise CdcUserError(
            f"--source {name} names a component of a Dagster project, but {start} is in none (no pyproject.toml with "
            "[tool.dg] here or above): run the command from your project's folder, or set the source's CDC_* "
            "variables and leave --source out."
        )
    sources = project_sources(root)
    for _, source in sources:
        if source.name == name:
            return source
    names = ", ".join(sorted(s.name for _, s in sources if s.name)) or "none"
    raise CdcUserError(f"The project at {root} has no MySQLSource named {name!r} (its sources: {names}): give one of those names to --source.")


def named_source_settings(name: str, start: Path, environment: Mapping[str, str], flags: Mapping[str, str]) -> Settings:
    """The settings of the project's source `name`: its attributes, the command's flags over them, and of the
    environment only the process's own variables (progress, fork) and the AWS_* credentials."""
    source = named_source(name, start)
    if source.from_environment:
        return Settings.from_env({**environment, **flags})
    own = {k: v for k, v in environment.items() if k in PROCESS_VARIABLES or k.startswith("AWS_")}
    return Settings.from_env({**own, **variables_of(source), **flags})
