"""The dependencies are ranges a user's own Dagster project can share, not exact pins (issue 44), while our own
installs stay reproducible: constraints.txt pins every one of them to a version inside its range, and that is the
version installed here."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, sep, pinned = line.partition("==")
        if sep and not line.startswith("#"):
            pins[canonicalize_name(name)] = pinned.strip()
    return pins


def test_every_dependency_is_a_range_that_its_pinned_and_installed_version_satisfies() -> None:
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert not any(s.operator in ("==", "===") for s in requirement.specifier), f"{requirement} is an exact pin"
        assert name in pins, f"constraints.txt does not pin {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {requirement}"
        assert version(name) == pins[name], f"{name} installed {version(name)}, constraints.txt pins {pins[name]}"
