"""Dagster as a user runs it, for the tests that drive the UI's daemon and webserver: a user's `dg` project with
MySQLSource components, `dagster dev` on this repository's workspace (as `make dev` runs it) or `dg dev` in such a
project, and the webserver's GraphQL API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from cdc_assets.local_source.server import free_port

REPO = Path(__file__).resolve().parent.parent
DAGSTER = str(Path(sys.executable).parent / "dagster")
DG = str(Path(sys.executable).parent / "dg")


def write_project(
    root: Path, lakehouses: dict[str, Path], tables: dict[str, str], package: str = "shop_project", attributes: str = ""
) -> Path:
    """A user's `dg` project, `package`, with one MySQLSource folder per source (its URL from the environment
    variable `<NAME>_URL`, a server id of its own) and `attributes` (YAML lines) added to each; its root."""
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "{package}"\n'
    )
    (root / package / "defs").mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "definitions.py").write_text(  # as create-dagster writes it
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    (root / package / "defs" / "__init__.py").write_text("")
    for i, (name, lakehouse) in enumerate(lakehouses.items()):
        folder = root / package / "defs" / name
        folder.mkdir()
        (folder / "defs.yaml").write_text(
            "type: cdc_assets.components.MySQLSource\n"
            "attributes:\n"
            f"  name: {name}\n"
            f'  mysql_url: "{{{{ env.{name.upper()}_URL }}}}"\n'
            f"  lakehouse: {lakehouse}\n"
            f"  tables: [{tables[name]}]\n"
            f"  server_id: {4200100 + i}\n" + attributes
        )
    return root


@contextmanager
def dev_server(command: list[str], cwd: Path, env: Mapping[str, str], log: Path) -> Iterator[int]:
    """Start a `dagster dev`-like command (its arguments before the host and port) in `cwd`, yield its webserver's
    port, and kill its whole process group at the end."""
    port = free_port()
    dev = subprocess.Popen(
        [*command, "-h", "127.0.0.1", "-p", str(port)],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        start_new_session=True,
        # started from a script, it ignores SIGINT/SIGTERM unless they are reset to the default
        preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)],
    )
    try:
        yield port
    finally:
        os.killpg(dev.pid, signal.SIGKILL)
        dev.wait(timeout=30)


def dagster_dev(log: Path) -> AbstractContextManager[int]:
    """`dagster dev` on this repository's workspace with the current environment (DAGSTER_HOME and the CDC_*
    settings)."""
    return dev_server([DAGSTER, "dev", "-w", "workspace.yaml"], REPO, os.environ, log)


def dg_dev(project: Path, env: Mapping[str, str], log: Path) -> AbstractContextManager[int]:
    """`dg dev` in a user's project folder, served from this virtualenv, as a user runs it."""
    return dev_server(
        [DG, "dev", "--use-active-venv"], project, {**env, "VIRTUAL_ENV": str(Path(sys.executable).parents[1])}, log
    )


def graphql(port: int, query: str, variables: Mapping[str, object] | None = None) -> dict:
    """The `data` of a GraphQL request to the webserver; an answer with errors fails the test."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": dict(variables or {})}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        body = json.load(answer)
    assert "errors" not in body, body
    return body["data"]


def graphql_if_answering(port: int, query: str) -> dict | None:
    """`graphql`, or None while the webserver does not answer yet (or answers with errors: its code location is
    still loading)."""
    try:
        return graphql(port, query)
    except (urllib.error.URLError, ConnectionError, TimeoutError, AssertionError):
        return None


ASSET_KEYS = "{ assetNodes { assetKey { path } } }"


def listed_asset_keys(port: int) -> set[str]:
    """The asset keys the webserver lists (`a/b/c`), none while it does not answer yet."""
    data = graphql_if_answering(port, ASSET_KEYS)
    return {"/".join(node["assetKey"]["path"]) for node in (data or {}).get("assetNodes") or []}


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float, every_s: float = 0.5) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        time.sleep(every_s)
