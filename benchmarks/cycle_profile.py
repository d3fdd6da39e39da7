"""Where a continuous-mode cycle's seconds go, the follower as it was beside the follower as it is.

    .venv/bin/python -m benchmarks.cycle_profile [--big-table-rows 10000000] [--rate 1000] [--seconds 90]
        [--check-every 30]

Workload (c)'s tables and writer (`benchmarks/steady_load.py`) with the large table of `benchmarks/continuous.py`
among those written (`--big-table-rows`, made outside the binlog and loaded by `cdc-lakehouse snapshot`), at
`--rate` changes/s. The follower (`defs/continuous.follow`: the pipeline's driver run for ever, what `cdc-lakehouse run` runs) runs in
this process, in a thread, as in the continuous op; two phases of `--seconds` each, on the same lakehouse:

  before  every Delta table opened afresh at each use; file key ranges read from the statistics entry by entry;
          the equality check in a thread of the follower's process (as the op ran it), comparing every row of
          every table every `--check-every` seconds;
  after   the tables kept open (Lakehouse.keeping_tables_open); the ranges read column by column; the same check
          in its child process (runtime/check_process.py).

Per phase it prints the cycles' count, the median and p95 cycle, and per cycle (median) the seconds of its parts:
capture, change logs, current state; and, summed over the threads that did them, opening Delta tables and reading
file key ranges.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

import cdc_assets.pipeline.driver as driver_module
import cdc_assets.stages.current.apply as current_state
from benchmarks.large_table import make_table
from benchmarks.steady_load import SCHEMA, BigTable, _prepare, _write, pipeline_env
from benchmarks.workloads import CLI, fresh_server, remove_work
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter
from cdc_assets.defs.continuous import Cycle, follow
from cdc_assets.lake.layout import CURRENT
from cdc_assets.lake.store import Lakehouse
from cdc_assets.local_source import server as local_server
from cdc_assets.pipeline.driver import Forever
from cdc_assets.runtime.check_process import ChildChecks, Request
from cdc_assets.stages.follow import continuous_owner
from cdc_assets.verification.changed_keys import compare_every_row
from spark_resources.resources import LazySparkResource, TransformsResource
from spark_resources.session import spark_config

READER_SERVER_ID = 4246
BIG_TABLE = "big"
PARTS = ("capture", "change logs", "current state", "opening tables", "file ranges")
CHECK_THREAD = "equality-check"


def _file_ranges_entry_by_entry(actions: pa.Table, key: list[str]) -> list[dict[str, Any]]:
    """stages.current.rows.file_ranges as it was: each statistic read by indexing its column."""
    columns = set(actions.column_names)
    ranges = []
    for i, path in enumerate(actions.column("path").to_pylist()):
        bounds: dict[str, dict[str, Any]] = {"min": {}, "max": {}}
        for side, out in bounds.items():
            for name in key:
                column = f"{side}.{name}"
                out[name] = actions.column(column)[i].as_py() if column in columns else None
        ranges.append({"path": path, **bounds})
    return ranges


class Timings:
    """Seconds per part, summed since the last cycle ended (threads of the check left out)."""

    def __init__(self, ignored: object) -> None:
        self.mutex = threading.Lock()
        self.now: dict[str, float] = defaultdict(float)
        self.ignored = ignored  # the check's own lakehouse: its opens are not the follower's

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == CHECK_THREAD or (args and args[0] is self.ignored):
                return fn(*args, **kwargs)
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.mutex:
                    self.now[part] += time.perf_counter() - began

        return wrapper

    def take(self) -> dict[str, float]:
        with self.mutex:
            taken, self.now = dict(self.now), defaultdict(float)
        return taken


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _phase(
    before: bool,
    settings: SourceSettings,
    lakehouse: Lakehouse,
    server: local_server.LocalServer,
    big: BigTable,
    rate: int,
    seconds: float,
    check_every: float,
    seed: int,
) -> tuple[list[tuple[float, dict[str, float]]], int]:
    """One phase: the writer for `seconds`, the follower until it caught up; (each cycle's seconds and parts, checks)."""
    checked = Lakehouse(str(lakehouse))  # the check's own, so its opens are told apart
    timings = Timings(checked)
    cycles: list[tuple[float, dict[str, float]]] = []
    transforms = TransformsResource(pyspark=LazySparkResource(spark_config=spark_config("local[2]"))).for_changes
    stop = threading.Event()

    def on_cycle(cycle: Cycle) -> None:
        cycles.append((cycle.seconds, timings.take()))

    def keep_nothing_open(self: Lakehouse) -> Iterator[Lakehouse]:
        yield self

    tables = sorted(str(t) for t in lakehouse.tables(CURRENT))
    checks_done = 0
    with contextlib.ExitStack() as patches:
        for module, name, part in (
            (driver_module, "capture", "capture"),
            (driver_module, "process_new_batches", "change logs"),
            (driver_module, "apply_pending", "current state"),
        ):
            patches.enter_context(_patched(module, name, timings.timed(part, getattr(module, name))))
        ranges = _file_ranges_entry_by_entry if before else current_state.file_ranges
        patches.enter_context(_patched(current_state, "file_ranges", timings.timed("file ranges", ranges)))
        patches.enter_context(_patched(Lakehouse, "open", timings.timed("opening tables", Lakehouse.open)))
        if before:
            patches.enter_context(_patched(Lakehouse, "keeping_tables_open", contextlib.contextmanager(keep_nothing_open)))
        until = Forever(stop.is_set, poll_seconds=0.25, wake=stop)
        follower = threading.Thread(
            target=follow,
            args=(settings, lakehouse, transforms, until, on_cycle, lambda _position: None, continuous_owner("benchmk")),
        )
        follower.start()
        writer = threading.Thread(target=_write, args=(server, rate, seconds), kwargs={"seed": seed, "big": big})
        writer.start()
        child = None if before else ChildChecks(settings, checked)
        last_check = time.monotonic()
        checker: threading.Thread | None = None
        try:
            while writer.is_alive():
                time.sleep(0.2)
                if time.monotonic() - last_check < check_every:
                    continue
                if child is not None:
                    if child.result() is not None:
                        checks_done += 1
                    if child.pending is None:
                        child.submit(Request("full", tables))
                        last_check = time.monotonic()
                elif checker is None or not checker.is_alive():
                    refs = [TableRef.parse(t) for t in tables]
                    checker = threading.Thread(target=compare_every_row, args=(settings, checked, refs), name=CHECK_THREAD)
                    checker.start()
                    checks_done += 1
                    last_check = time.monotonic()
            writer.join()
            time.sleep(10)  # the last changes' cycles
        finally:
            stop.set()
            follower.join()
            if checker is not None:
                checker.join()
            if child is not None:
                if child.result(timeout=600) is not None:
                    checks_done += 1
                child.close()
    return cycles, checks_done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-table-rows", type=int, default=10_000_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--check-every", type=float, default=30, help="seconds between two equality checks")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cdc-bench-cycles-"))
    server = fresh_server(work / "mariadb")
    _prepare(server)
    big = BigTable(BIG_TABLE, args.big_table_rows)
    env = pipeline_env(server, work, READER_SERVER_ID, spark_master="local[2]")
    try:
        make_table(server, big.name, big.rows, schema=SCHEMA)
        subprocess.run([CLI, "snapshot", f"{SCHEMA}.{big.name}"], env=env, check=True, capture_output=True, timeout=3600)
        subprocess.run([CLI, "sync"], env=env, check=True, capture_output=True, timeout=3600)
        settings = SourceSettings(MySQLUrl.parse(server.reader_url()), READER_SERVER_ID, TableFilter.parse(f"{SCHEMA}.*", None))
        lakehouse = Lakehouse(str(work / "lakehouse"))
        results = {}
        for seed, (label, before) in enumerate((("before", True), ("after", False)), start=1):
            results[label] = _phase(before, settings, lakehouse, server, big, args.rate, args.seconds, args.check_every, seed)
            print(f"  {label}: {len(results[label][0])} cycles, {results[label][1]} checks, load {os.getloadavg()[0]:.1f}", flush=True)
        equal = compare_every_row(settings, lakehouse, [TableRef.parse(str(t)) for t in lakehouse.tables(CURRENT)])
    finally:
        local_server.stop(work / "mariadb")
    print(f"\n{sum(c.ok for c in equal)} of {len(equal)} tables equal to the source at the end")
    remove_work(work, None if all(c.ok for c in equal) else "a table differs from the source")
    print(
        f"{args.rate:,} changes/s for {args.seconds:.0f} s per phase, a {big.rows:,}-row table among those written; "
        f"an equality check of every row every {args.check_every:.0f} s"
    )
    print("| phase | cycles | median cycle (s) | p95 cycle (s) | " + " | ".join(f"{p} (s, median)" for p in PARTS) + " |")
    print("|---" * (4 + len(PARTS)) + "|")
    for label, (cycles, _) in results.items():
        seconds = sorted(s for s, _ in cycles)
        parts = [statistics.median(parts.get(p, 0.0) for _, parts in cycles) for p in PARTS]
        print(
            f"| {label} | {len(cycles)} | {statistics.median(seconds):.2f} | {seconds[int(0.95 * (len(seconds) - 1))]:.2f} | "
            + " | ".join(f"{p:.3f}" for p in parts)
            + " |"
        )


if __name__ == "__main__":
    main()
