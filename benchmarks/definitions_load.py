"""Issue 45, item 5: how long the code location takes to load as the table count grows.

    .venv/bin/python -m benchmarks.definitions_load [--tables 100,1000,10000]

For each table count N: a lakehouse whose table registry lists N tables (no rows are needed: the per-table assets are
built from the table list), and a module that builds one source's definitions from it, as the code location does.
Two whole processes are timed by a parent, interpreter start-up included:
- `dagster definitions validate -f <module>`: loads the code location and validates it, as a code server does before
  it serves the webserver;
- a Python process that builds the definitions and resolves the asset graph and every job (`build`), the part of it
  that is ours.
Each N's figures are set against the smallest N's, taken in this one invocation. Asset and check counts are printed
with them: a table has four assets (its source table, change log, current state and, where history is kept, its
history) and its checks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE = "from cdc_assets.defs.code_location import build_definitions\n\ndefs = build_definitions()\n"
BUILD = (
    "import json, time\n"
    "began = time.monotonic()\n"
    "from cdc_assets.defs.code_location import build_definitions\n"
    "built = build_definitions()\n"
    "graph = built.resolve_asset_graph()\n"
    "jobs = built.resolve_all_job_defs()\n"
    "print('RESULT ' + json.dumps({'assets': len(graph.get_all_asset_keys()), 'checks': len(graph.asset_check_keys), "
    "'jobs': len(jobs), 'inside': time.monotonic() - began}))\n"
)


def lakehouse_of(tables: int, where: Path) -> Path:
    """A lakehouse whose registry lists `tables` tables over 10 schemas."""
    from cdc_assets.lake.state import save_registry
    from cdc_assets.lake.store import Lakehouse

    house = Lakehouse(str(where))
    save_registry(house.store, {f"s{i % 10}.t{i:05}": {"first_batch": "b1", "last_batch": "b1"} for i in range(tables)})
    return where


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return seconds, done.stdout


def measure(tables: int, work: Path) -> dict[str, float]:
    lakehouse = lakehouse_of(tables, work / f"lake-{tables}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    env |= {"CDC_LAKEHOUSE": str(lakehouse), "DAGSTER_HOME": str(work / f"home-{tables}")}
    Path(env["DAGSTER_HOME"]).mkdir()
    module = work / f"defs_{tables}.py"
    module.write_text(MODULE)
    dagster = str(Path(sys.executable).with_name("dagster"))
    validate, _ = timed([dagster, "definitions", "validate", "-f", str(module)], env)
    build, out = timed([sys.executable, "-c", BUILD], env)
    figures = json.loads(out.rsplit("RESULT ", 1)[1])
    figures |= {"validate": validate, "build": build}
    print(
        f"  {tables} tables: {figures['assets']} assets, {figures['checks']} checks, {figures['jobs']} jobs; "
        f"dagster definitions validate {validate:.1f} s, build and resolve {build:.1f} s (of it {figures['inside']:.1f} s "
        "after the interpreter started)",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="100,1000,10000", help="comma-separated table counts, smallest first")
    args = parser.parse_args()
    counts = [int(n) for n in args.tables.split(",")]
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-defs-"))
    try:
        results = {n: measure(n, work) for n in counts}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = results[counts[0]]
    print()
    print("| tables | assets | asset checks | `dagster definitions validate` (s) | / smallest | build and resolve (s) | / smallest |")
    print("|---|---|---|---|---|---|---|")
    for n, r in results.items():
        print(
            f"| {n:,} | {r['assets']:,} | {r['checks']:,} | {r['validate']:.1f} | {r['validate'] / first['validate']:.2f}x "
            f"| {r['build']:.1f} | {r['build'] / first['build']:.2f}x |"
        )
    print(f"\nmachine: {os.cpu_count()} cores; each figure one run")


if __name__ == "__main__":
    main()
