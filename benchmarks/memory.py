"""Memory of a command and of the processes around it, sampled from /proc while it runs, process by process.

`ru_maxrss` of a child tells the largest single process it waited for; a run on Spark is several: the run's own
Python process, the driver JVM it starts (a child), and, on a cluster, the master's, the workers' and the
executors' JVMs and the executors' Python workers (no children of the run at all). This samples each group apart.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

SAMPLE_SECONDS = 0.2


def _status(pid: int, key: str) -> float:
    """A `VmRSS`/`VmHWM` line of /proc/<pid>/status, in MB (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0.0


def _parents() -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    found[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    return found


def descendants(roots: Iterable[int], parents: dict[int, int] | None = None) -> set[int]:
    """Every process below `roots` (not the roots themselves)."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@dataclass
class Watched:
    """What `watch` saw: the command's outcome, its own process's peak RSS, the peak of the sum of its
    descendants (a driver JVM), and the peak of the sum over the `beside` processes and theirs (a cluster)."""

    code: int
    seconds: float
    out: str
    err: str
    run_process_mb: float = 0.0
    children_mb: float = 0.0
    beside_mb: float = 0.0
    samples: int = field(default=0, repr=False)


def watch(command: list[str], env: dict[str, str], beside: Iterable[int] = (), timeout: float = 7200) -> Watched:
    """Run `command`, sampling memory every SAMPLE_SECONDS until it ends."""
    beside = list(beside)
    began = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result = Watched(0, 0.0, "", "")
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            parents = _parents()
            high_water = _status(process.pid, "VmHWM")
            result.run_process_mb = max(result.run_process_mb, high_water)
            below = sum(_status(p, "VmRSS") for p in descendants([process.pid], parents))
            result.children_mb = max(result.children_mb, below)
            if beside:
                around = set(beside) | descendants(beside, parents)
                result.beside_mb = max(result.beside_mb, sum(_status(p, "VmRSS") for p in around))
            result.samples += 1
            done.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
    result.code, result.seconds, result.out, result.err = process.returncode, time.monotonic() - began, out, err
    return result
