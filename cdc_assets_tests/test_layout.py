"""The layout's import rules (docs/architecture.md) hold: read from every module's imports, no server needed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# what each part may import of the project; Dagster only in the Dagster layer (and spark_resources.resources)
ALLOWED = {
    "cdc_assets": set(),  # the package itself: a docstring
    "spark_resources": set(),
    "cdc_assets.core": {"cdc_assets.core"},
    "cdc_assets.lake": {"cdc_assets.core", "cdc_assets.lake"},
    "cdc_assets.source": {"cdc_assets.core", "cdc_assets.source", "cdc_assets.local_source"},
    "cdc_assets.capture": {"cdc_assets.core", "cdc_assets.lake", "cdc_assets.source", "cdc_assets.capture"},
    "cdc_assets.stages": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "spark_resources.engine",
        "spark_resources.arrow_transforms",
        # the Spark jobs the stages run on the executors (the stages plan and commit)
        "spark_resources.change_logs",
        "spark_resources.current_state",
        "spark_resources.files_job",
        "spark_resources.snapshots",
    },
    "cdc_assets.verification": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
    },
    "cdc_assets.local_source": {"cdc_assets.local_source"},
    # the sinks follow the change logs in the lakehouse: they never read the source or run a stage
    "cdc_assets.sinks": {"cdc_assets.core", "cdc_assets.lake", "cdc_assets.sinks"},
    # the local brokers share the local servers' process helpers (ports, pid files, a clean stop)
    "cdc_assets.local_brokers": {"cdc_assets.local_source", "cdc_assets.local_brokers"},
    # the local Spark servers (a standalone cluster, a Spark Connect server) for `make dev`, the tests and the
    # benchmarks share them too; nothing of the pipeline starts them
    "cdc_assets.local_spark": {"cdc_assets.local_source.processes", "cdc_assets.local_spark"},
    # the Dagster layer: everything below it but the local servers (the demo starts them, in commands/), never the
    # commands, the code location or the CLI above it
    "cdc_assets.defs": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.sinks",
        "cdc_assets.defs",
        "cdc_assets.runtime",
        "spark_resources",
    },
    # what the definitions run on, never a definition: the Dagster home and its event log, and the processes a run
    # starts (a sync's forked child runs capture, both stages and the checks before Dagster is imported)
    "cdc_assets.runtime": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.runtime",
        # the forked child takes a stage only when the run would take Arrow too: the engine choice and its defaults
        "spark_resources.engine",
        "spark_resources.session",
    },
    "spark_resources.engine": set(),
    "spark_resources.arrow_transforms": {"cdc_assets.core"},  # the change operations' vocabulary (core.ops)
    "spark_resources.transforms": set(),
    "spark_resources.session": set(),
    # the Spark jobs: they run the lakehouse's pure row functions (lake.change_rows, lake.current_rows) on the
    # executors, never a stage (the stages call them)
    "spark_resources.files_job": {"cdc_assets.core", "cdc_assets.lake", "spark_resources.transforms"},
    "spark_resources.change_logs": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "spark_resources.files_job",
        "spark_resources.transforms",
    },
    "spark_resources.current_state": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "spark_resources.files_job",
        "spark_resources.transforms",
    },
    "spark_resources.snapshots": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "spark_resources.files_job",
        "spark_resources.transforms",
    },
    "spark_resources.resources": {"spark_resources.engine"},
    # what the commands do, above the definitions: runs of their jobs on the instance, verify, status, the demo
    "cdc_assets.commands": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.local_source",
        "cdc_assets.sinks",
        "cdc_assets.local_brokers",
        "cdc_assets.defs",
        "cdc_assets.runtime",
        "cdc_assets.commands",
    },
    "cdc_assets.definitions": {"cdc_assets.defs", "cdc_assets.runtime.instance"},
    "cdc_assets.cli": {
        "cdc_assets.commands",
        "cdc_assets.defs",
        "cdc_assets.runtime",
        "cdc_assets.core",
        "cdc_assets.lake.layout",
        "cdc_assets.verification",
        "cdc_assets.cli_progress",
    },
    "cdc_assets.cli_progress": {"cdc_assets.core"},  # the CLI's display of the work's progress updates
    # `make dev` / `make stop`: the local servers around the UI, and the lakehouse's Dagster home
    "cdc_assets.local_dev": {
        "cdc_assets.local_source",
        "cdc_assets.local_brokers",
        "cdc_assets.local_spark",
        "cdc_assets.runtime.instance",
    },
}
DAGSTER = ("dagster", "dagster_pyspark")
MAY_IMPORT_DAGSTER = (
    "cdc_assets.defs",
    "cdc_assets.definitions",
    "spark_resources.resources",
    "cdc_assets.runtime.instance",
    "cdc_assets.runtime.event_log",
    "cdc_assets.runtime.queue",
    "cdc_assets.commands.runs",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return found


def _modules() -> dict[str, set[str]]:
    files = [p for package in ("cdc_assets", "spark_resources") for p in (ROOT / package).rglob("*.py")]
    return {_module_name(p): _imports(p) for p in files}


def _part(module: str) -> str | None:
    return next((part for part in sorted(ALLOWED, key=len, reverse=True) if module == part or module.startswith(part + ".")), None)


def test_each_part_imports_only_what_its_rule_allows() -> None:
    modules = _modules()
    broken = []
    for module, imports in modules.items():
        part = _part(module)
        assert part is not None, f"{module} is in no part of the layout: give it a rule here and in docs/architecture.md"
        for name in imports:
            if name.split(".")[0] in DAGSTER and not module.startswith(MAY_IMPORT_DAGSTER):
                broken.append(f"{module} imports {name}")
            project = [m for m in modules if name == m and "." in m]  # a package's own name says nothing
            if project and not any(name == a or name.startswith(a + ".") for a in ALLOWED[part]):
                broken.append(f"{module} imports {name}")
    assert broken == []


def test_no_import_cycle_and_no_private_dagster_api_but_the_event_log() -> None:
    modules = _modules()
    graph = {m: {i for i in imports if i in modules and i != m} for m, imports in modules.items()}
    # a package's __init__ importing its own modules is how a package is assembled, not a cycle of concerns
    graph = {m: {i for i in deps if not (m and i.startswith(m + "."))} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
    private = sorted(
        f"{m} imports {i}" for m, imports in modules.items() for i in imports if i.startswith("dagster._")
    )
    assert all(line.startswith("cdc_assets.runtime.event_log ") for line in private), private


def _package(module: str) -> str:
    """The folder a module belongs to in docs/architecture.md's layout: `cdc_assets.<folder>`, or spark_resources."""
    parts = module.split(".")
    return "spark_resources" if parts[0] == "spark_resources" else ".".join(parts[:2])


def test_no_cycle_between_folders() -> None:
    """Imports inside functions count too: a cycle between folders hidden in a function is still one."""
    modules = _modules()
    edges = {
        (_package(m), _package(i))
        for m, imports in modules.items()
        for i in imports
        if i in modules and _package(m) != _package(i)
    }
    back = sorted(f"{a} -> {b}" for a, b in edges if (b, a) in edges)
    assert back == []
    reach = {a: {b for x, b in edges if x == a} for a, _ in edges}
    for _ in range(len(reach)):
        for a in reach:
            reach[a] |= {c for b in list(reach[a]) for c in reach.get(b, set())}
    assert sorted(a for a in reach if a in reach[a]) == []
