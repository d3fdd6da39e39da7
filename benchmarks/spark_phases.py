"""Where a `cdc-lakehouse sync` on Spark spends its seconds, phase by phase, from records rather than estimates.

Two records of one sync process: Spark's event log (`spark.eventLog.enabled`, written by Spark's own listener in the
driver: the application's start, each executor's registration, each job's submission, end and description) and the
run's Dagster event log (its start, the capture's materialization, each Spark stage's own log line with its wall time,
the checks' evaluations). Each stage's Spark jobs carry the description `cdc-lakehouse: <stage>`
(spark_resources.engine.spark_phase); a job without one (submitted from a per-table thread) is counted in the stage
whose wall window it started in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = ("change logs", "current state")
_WALL = re.compile(
    r"^(change logs|current state) on spark: ([0-9.]+) s, ([0-9.]+) s of them to get the session"
    r"(?: \(its start begun ([0-9.]+) s before the stage\))?$"
)


@dataclass(frozen=True)
class Phase:
    name: str
    wall: float  # seconds
    jobs: int | None = None  # Spark jobs begun in it (None: no Spark there)
    job_seconds: float | None = None  # the sum of their durations
    busy: float | None = None  # the time at least one of them ran (the union of their intervals)
    detail: str = ""  # printed in place of the wall time, or beside the jobs' figures


def event_log_conf(directory: Path) -> dict[str, str]:
    """The settings (CDC_SPARK_CONF) that make the driver write its event log under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.compress": "false",  # JSON lines, read here
    }


def _spark_events(directory: Path, known: set[str]) -> tuple[list[dict[str, Any]], str]:
    """The events of the one application in `directory` not among `known` (file names)."""
    new = sorted(p for p in directory.iterdir() if p.name not in known)
    if len(new) != 1:
        raise RuntimeError(f"expected one new Spark event log in {directory}, found {[p.name for p in new]}")
    # Spark 4 writes a folder of rolled files (eventlog_v2_<app>/events_<n>_<app>), older ones one file
    parts = [new[0]] if new[0].is_file() else sorted(new[0].glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
    events = []
    for part in parts:
        for line in part.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a last line cut short by the driver's end
                break
    return events, new[0].name


def _dagster_marks(dagster_home: Path) -> dict[str, float]:
    """Epoch seconds of the sync run's milestones, from its Dagster event log."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    instance = DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        run = instance.get_runs(limit=1)[0]
        marks: dict[str, float] = {}
        for entry in instance.all_logs(run.run_id):
            kind = entry.dagster_event.event_type_value if entry.dagster_event else None
            if kind == "PIPELINE_START" or kind == "RUN_START":
                marks["run start"] = entry.timestamp
            elif kind == "ASSET_MATERIALIZATION":
                marks.setdefault("capture recorded", entry.timestamp)
            elif kind == "ASSET_CHECK_EVALUATION":
                marks["checks recorded"] = entry.timestamp
            elif kind in ("PIPELINE_SUCCESS", "RUN_SUCCESS"):
                marks["run end"] = entry.timestamp
            elif entry.user_message and (found := _WALL.match(entry.user_message)):
                marks[f"{found[1]} end"] = entry.timestamp
                marks[f"{found[1]} begin"] = entry.timestamp - float(found[2])
                marks[f"{found[1]} session"] = float(found[3])
                marks[f"{found[1]} session begun ahead"] = float(found[4] or 0)
        return marks
    finally:
        instance.dispose()


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def phases(
    began: float, seconds: float, dagster_home: Path, event_dir: Path, known: set[str]
) -> tuple[list[Phase], str]:
    """The phases of the sync process that began at epoch `began` and took `seconds`, and its event log's name."""
    events, name = _spark_events(event_dir, known)
    marks = _dagster_marks(dagster_home)
    app_start = next(e["Timestamp"] / 1000 for e in events if e["Event"] == "SparkListenerApplicationStart")
    executors = [e["Timestamp"] / 1000 for e in events if e["Event"] == "SparkListenerExecutorAdded"]
    starts = {e["Job ID"]: e for e in events if e["Event"] == "SparkListenerJobStart"}
    ends = {e["Job ID"]: e["Completion Time"] / 1000 for e in events if e["Event"] == "SparkListenerJobEnd"}
    jobs: dict[str, list[tuple[float, float]]] = {stage: [] for stage in STAGES}
    for job_id, start in starts.items():
        submitted = start["Submission Time"] / 1000
        described = (start.get("Properties") or {}).get("spark.job.description", "")
        stage = next((s for s in STAGES if described == f"cdc-lakehouse: {s}"), None)
        if stage is None:  # from a per-table thread: the stage whose window it began in
            stage = next((s for s in STAGES if marks[f"{s} begin"] <= submitted <= marks[f"{s} end"]), None)
        if stage is not None:
            jobs[stage].append((submitted, ends.get(job_id, submitted)))
    found = [
        Phase("process start, Dagster's import, the run's start", marks["run start"] - began),
        Phase("capture (forked at process start) and its recording", marks["change logs begin"] - marks["run start"]),
        Phase("  of the change logs: getting the session (the driver JVM's start)", marks["change logs session"]),
        Phase(
            "  the session's start begun before the change logs (spark_resources.session.start_session_early)",
            marks["change logs session begun ahead"],
        ),
        Phase(
            "  of the change logs: the application's start to its first and last executor's registration (s)",
            min(executors, default=app_start) - app_start,
            detail=f"{min(executors, default=app_start) - app_start:.1f} / {max(executors, default=app_start) - app_start:.1f}",
        ),
    ]
    first_job = min((a for spans in jobs.values() for a, _ in spans), default=None)
    if first_job is not None:
        waited = max(0.0, min(executors, default=first_job) - first_job)
        found.append(Phase("  of the change logs: its first job waiting for the first executor", waited))
    for stage in STAGES:
        spans = jobs[stage]
        durations = ", ".join(f"{b - a:.1f}" for a, b in sorted(spans))
        found.append(
            Phase(
                f"{stage} (Spark)", marks[f"{stage} end"] - marks[f"{stage} begin"], len(spans),
                sum(b - a for a, b in spans), _union(spans), detail=f"jobs of {durations} s",
            )
        )  # fmt: skip
    found.append(
        Phase(
            "checks (equality with the source, schema, lag) and the tables' events",
            marks["checks recorded"] - marks["current state end"],
        )
    )
    found.append(Phase("the run's end and the process's exit", began + seconds - marks["checks recorded"]))
    return found, name


def print_table(title: str, found: list[Phase], seconds: float) -> None:
    """The phases as a table: the run process's own time in a Spark stage is its wall time less the time a job of
    it ran (planning, opening each table's Delta log, the per-table commits), and less getting the session."""
    print(f"\n{title}: sync {seconds:.1f} s")
    print("| phase | Spark jobs | Spark job seconds (sum) | Spark busy (s) | wall (s) | run process's own (s) |")
    print("|---|---|---|---|---|---|")
    for phase in found:
        if phase.jobs is None:
            print(f"| {phase.name} | | | | {phase.detail or f'{phase.wall:.1f}'} | |")
            continue
        assert phase.job_seconds is not None and phase.busy is not None
        own = phase.wall - phase.busy
        if phase.name.startswith("change logs"):  # the session is started inside it
            own -= next(p.wall for p in found if "getting the session" in p.name)
        figures = f"{phase.jobs} | {phase.job_seconds:.1f} ({phase.detail})"
        print(f"| {phase.name} | {figures} | {phase.busy:.1f} | {phase.wall:.1f} | {own:.1f} |")
