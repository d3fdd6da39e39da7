"""The layout's import rules (docs/architecture.md) hold: read from every module's imports, no server needed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# what each part may import of the project; Dagster only where MAY_IMPORT_DAGSTER says
ALLOWED = {
    "cdc_assets": set(),  # the package itself: a docstring
    "spark_resources": set(),
    "cdc_assets.core": {"cdc_assets.core"},
    "cdc_assets.lake": {"cdc_assets.core", "cdc_assets.lake"},
    "cdc_assets.source": {"cdc_assets.core", "cdc_assets.source", "cdc_assets.local_source"},
    "cdc_assets.capture": {"cdc_assets.core", "cdc_assets.lake", "cdc_assets.source", "cdc_assets.capture"},
    # each stage's folder holds its run, its Arrow half and its Spark half (the driver side and its tasks' functions);
    # of spark_resources a stage uses the engine choice and the generic Spark helpers
    "cdc_assets.stages": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "spark_resources.engine",
        "spark_resources.files_job",
        "spark_resources.transforms",
    },
    "cdc_assets.verification": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
    },
    # a repair writes the rows that differ from the source as a raw batch: it finds them with verification's
    # comparisons, captures up to its point, and leaves the batch to the stages
    "cdc_assets.repair": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.repair",
    },
    # the one driver of the pipeline, free of Dagster: capture, both stages, the checks and the sinks in order, over
    # plain settings; the runs, the forked child, the continuous mode and the rewrites' catch-up all run it
    "cdc_assets.pipeline": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.repair",
        "cdc_assets.sinks",
        "cdc_assets.pipeline",
        "spark_resources.engine",
    },
    # (which demo flavours there are, and CDC_DEMO_SOURCE's sentence, are the settings' of core: one home)
    "cdc_assets.local_source": {"cdc_assets.local_source", "cdc_assets.core.settings", "cdc_assets.core.errors"},
    # the sinks follow the change logs in the lakehouse: they never read the source or run a stage; the change logs'
    # row shapes are the change-log layer's (stages/changes/rows), which a sink may take
    "cdc_assets.sinks": {"cdc_assets.core", "cdc_assets.lake", "cdc_assets.stages.changes.rows", "cdc_assets.sinks"},
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
        "cdc_assets.repair",
        "cdc_assets.pipeline",
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
        "cdc_assets.repair",
        "cdc_assets.pipeline",
        "cdc_assets.runtime",
        # the forked child takes a stage only when the run would take Arrow too: the engine choice and its defaults
        "spark_resources.engine",
        "spark_resources.session",
    },
    # a stage's log line says how far ahead of it the session's start was begun
    "spark_resources.engine": {"spark_resources.session"},
    "spark_resources.transforms": set(),
    # a driver is given the class archive `make install` built
    "spark_resources.session": {"spark_resources.class_archive"},
    "spark_resources.class_archive": set(),
    # generic Spark jobs over a table's files (rewrite, compact), run by every stage's Spark half
    "spark_resources.files_job": {"cdc_assets.core", "cdc_assets.lake", "spark_resources.transforms"},
    # the session a run takes is the one begun ahead of it, when one was (session.start_session_early)
    "spark_resources.resources": {"spark_resources.engine", "spark_resources.session"},
    # what the commands do, above the definitions: runs of their jobs on the instance, verify, status, the demo
    "cdc_assets.commands": {
        "cdc_assets.core",
        "cdc_assets.lake",
        "cdc_assets.source",
        "cdc_assets.capture",
        "cdc_assets.stages",
        "cdc_assets.verification",
        "cdc_assets.repair",
        "cdc_assets.pipeline",
        "cdc_assets.local_source",
        "cdc_assets.sinks",
        "cdc_assets.local_brokers",
        "cdc_assets.defs",
        "cdc_assets.runtime",
        "cdc_assets.commands",
    },
    # the code location: the component instances of the defs folder cdc_assets/sources/ (it holds YAML only)
    "cdc_assets.definitions": {"cdc_assets.runtime.instance"},
    "cdc_assets.sources": set(),
    # the MySQLSource component over build_definitions, and the project's defs.yaml files read for `--source`
    "cdc_assets.components": {"cdc_assets.components", "cdc_assets.core", "cdc_assets.defs.code_location"},
    "cdc_assets.cli": {
        "cdc_assets.components.project",
        "cdc_assets.commands",
        "cdc_assets.defs",
        "cdc_assets.runtime",
        "cdc_assets.core",
        "cdc_assets.lake.layout",
        "cdc_assets.verification",
        "cdc_assets.cli_display",
    },
    "cdc_assets.cli_display": {"cdc_assets.core"},  # the CLI's display of the work's progress updates
    # `make dev` / `make stop`: the local servers around the UI, and the lakehouse's Dagster home
    "cdc_assets.local_dev": {
        "cdc_assets.core.errors",
        "cdc_assets.local_source",
        "cdc_assets.local_brokers",
        "cdc_assets.local_spark",
        "cdc_assets.runtime.instance",
    },
}
DAGSTER = ("dagster", "dagster_pyspark")
# The Dagster layer and what must touch Dagster's own storage: in runtime/ the instance, its event log and the run
# queue's view; the CLI's runs. The rest of runtime/ (a sync's forked child, the checks' child) never imports it.
MAY_IMPORT_DAGSTER = (
    "cdc_assets.defs",
    "cdc_assets.components",
    "cdc_assets.definitions",
    "spark_resources.resources",
    "cdc_assets.runtime.instance",
    "cdc_assets.runtime.event_log",
    "cdc_assets.runtime.queue",
    "cdc_assets.commands.runs",
)
# What runtime/ is below: it never imports them (they import it).
ABOVE_RUNTIME = ("cdc_assets.defs", "cdc_assets.components", "cdc_assets.commands", "cdc_assets.definitions", "cdc_assets.cli")
# Who starts the local Spark servers: `make dev` / `make stop` (the tests and the benchmarks aside).
LOCAL_SPARK_STARTED_BY = ("cdc_assets.local_dev", "cdc_assets.local_spark")


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


SPARK = ("pyspark", "dagster_pyspark")
STAGES = ("changes", "current", "snapshot")
# stages without a Spark half: `history` (SCD2 versions, moved forward in the apply run), `rewrite` (one table's layers
# rewritten: a person forgotten, a policy applied late), rare or row-by-row work done on Arrow
ARROW_STAGES = ("history", "rewrite")
# what in spark_resources is Spark's without importing pyspark: the session's settings and the engine choice
SPARK_SETTINGS = ("spark_resources.session", "spark_resources.engine", "spark_resources")


def test_spark_resources_holds_the_spark_side_only() -> None:
    """Every module there uses Spark (or is its settings), and imports nothing of cdc_assets beyond core and lake:
    the Arrow engine and the stages' Spark halves live in the stages' folders."""
    modules = _modules()
    found = []
    for module, imports in modules.items():
        if module.split(".")[0] != "spark_resources":
            continue
        if module not in SPARK_SETTINGS and not any(i.split(".")[0] in SPARK for i in imports):
            found.append(f"{module} does not use Spark")
        found += [
            f"{module} imports {i}"
            for i in imports
            if i.startswith("cdc_assets") and not i.startswith(("cdc_assets.core", "cdc_assets.lake"))
        ]
    assert found == []


def test_lake_keeps_storage_only() -> None:
    """lake/ is the storage every layer shares (Delta I/O, the object store, locks, state files, raw batch files,
    digests); a layer's row shapes and rules live in its own folder (capture/ for the raw layer, stages/changes/,
    stages/current/, stages/history/), so lake/ holds no module of a layer's rows."""
    lake = ROOT / "cdc_assets" / "lake"
    rows = sorted(str(p.relative_to(lake)) for p in lake.rglob("*.py") if p.stem.endswith("_rows") or p.stem == "rows")
    assert rows == [], f"a layer's rows live in its folder (stages/<layer>/rows.py), not in lake/: {rows}"


def test_each_stage_is_one_folder_with_its_spark_half_apart() -> None:
    """A reader of one stage opens one folder: no stage module outside it, and within it only the Spark half
    (`on_spark`, `spark_tasks`) imports pyspark, so an Arrow run never loads Spark."""
    stages = ROOT / "cdc_assets" / "stages"
    loose = sorted(p.stem for p in stages.glob("*.py") if p.stem not in ("__init__", "follow"))
    assert loose == [], f"stage modules outside a stage's folder: {loose}"
    assert sorted(p.name for p in stages.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(STAGES + ARROW_STAGES)
    modules = _modules()
    spark_users = sorted(
        m for m, imports in modules.items()
        if m.startswith("cdc_assets.stages.") and any(i.split(".")[0] in SPARK for i in imports)
    )  # fmt: skip
    halves = {f"cdc_assets.stages.{s}.{half}" for s in STAGES for half in ("on_spark", "spark_tasks")}
    assert [m for m in spark_users if m not in halves] == []
    assert {f"cdc_assets.stages.{s}.spark_tasks" for s in STAGES} <= set(spark_users)


def _project(name: str, modules: dict[str, set[str]]) -> bool:
    return name in modules and "." in name  # a package's own name (`from cdc_assets import x`) says nothing


def _within(module: str, parts: tuple[str, ...]) -> bool:
    return any(module == part or module.startswith(part + ".") for part in parts)


def _imports_dagster_at_module_level(path: Path) -> bool:
    """Dagster's public API imported by the module's own body (not only inside a function, nor for type checking)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n.split(".")[0] in DAGSTER and not n.startswith("dagster._") for n in names):
            return True
    return False


def test_defs_holds_dagster_definitions_only() -> None:
    """A module of defs/ builds Dagster objects (assets, checks, jobs, schedules, sensors, resources, partitions,
    freshness, keys, the Definitions), so it imports Dagster; one that needs no Dagster is plumbing (runtime/) or
    belongs to a layer below. Dagster's storage is runtime/'s: defs/ neither opens an instance nor reaches past
    Dagster's public API."""
    plumbing, storage = [], []
    for path in sorted((ROOT / "cdc_assets" / "defs").rglob("*.py")):
        module = _module_name(path)
        # a package's __init__ that imports nothing, or only re-exports its own modules, defines nothing itself
        empty_package = path.name == "__init__.py" and all(i.startswith(module + ".") for i in _imports(path))
        if not empty_package and not _imports_dagster_at_module_level(path):
            plumbing.append(module)
        storage += [f"{module} imports {i}" for i in _imports(path) if i.startswith("dagster._") or i == "dagster.DagsterInstance"]
    assert plumbing == [], f"these modules of defs/ import no Dagster: move them to cdc_assets/runtime/ (or below): {plumbing}"
    assert storage == [], f"Dagster's instance and storage are runtime/'s, not the definitions': {storage}"


def test_runtime_is_below_the_definitions() -> None:
    """runtime/ is what the definitions run on: defs/, the commands, the code location and the CLI import it, never
    the reverse, and nothing below the definitions (core, lake, source, capture, stages, verification, sinks, the local
    servers, spark_resources) imports it."""
    modules = _modules()
    up = sorted(
        f"{m} imports {i}"
        for m, imports in modules.items()
        if _within(m, ("cdc_assets.runtime",))
        for i in imports
        if _project(i, modules) and _within(i, ABOVE_RUNTIME)
    )
    assert up == [], up
    may_use_runtime = ("cdc_assets.runtime", *ABOVE_RUNTIME, "cdc_assets.local_dev")
    below = sorted(
        f"{m} imports {i}"
        for m, imports in modules.items()
        if not _within(m, may_use_runtime)
        for i in imports
        if _project(i, modules) and _within(i, ("cdc_assets.runtime",))
    )
    assert below == [], below



def test_only_make_dev_starts_the_local_spark_servers() -> None:
    """The local Spark servers live in cdc_assets/local_spark/, beside the other local servers: `make dev` starts
    them (and the tests and the benchmarks), never the pipeline, the definitions or spark_resources/."""
    modules = _modules()
    starters = sorted(
        f"{m} imports {i}"
        for m, imports in modules.items()
        if not _within(m, LOCAL_SPARK_STARTED_BY)
        for i in imports
        if _project(i, modules) and _within(i, ("cdc_assets.local_spark",))
    )
    assert starters == [], f"only `make dev` (cdc_assets.local_dev) starts the local Spark servers: {starters}"


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
