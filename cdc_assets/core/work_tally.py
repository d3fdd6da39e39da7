"""How many of each kind of per-table work a process did, and the seconds it took (issue 45: where a sync's time
goes, by kind of work rather than by step): Delta commits per layer, Delta tables opened, lakehouse state-file
operations, lock acquisitions, and Python's cyclic garbage collections (counted by a `gc` callback as they happen).

One tally per process, safe across threads (a stage commits tables from a pool: its seconds are work-seconds, which
can exceed the wall-clock time they overlapped in). A sync reads the difference between two snapshots; the forked
child of a command line sends its own (`runtime.forked_stages`) and the op adds it (`add`)."""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# The kinds of work, in the order a sentence lists them.
CHANGE_LOG_COMMITS = "change-log commits"
CURRENT_STATE_COMMITS = "current-state commits"
HISTORY_COMMITS = "history commits"
OTHER_COMMITS = "other Delta commits"
DELTA_OPENS = "Delta tables opened"  # read from their log's start (or last checkpoint)
DELTA_UPDATES = "Delta tables kept open and brought up to date"  # only the commits since (Lakehouse.keeping_tables_open)
STATE_FILES = "state and batch file operations"  # the lakehouse's object store: state files, raw batches
LOCKS = "locks taken"
GC_PAUSES = "cyclic garbage collections"  # Python's: every thread waits on the GIL while one runs (runtime/collector.py)
KINDS = (
    CHANGE_LOG_COMMITS, CURRENT_STATE_COMMITS, HISTORY_COMMITS, OTHER_COMMITS, DELTA_OPENS, DELTA_UPDATES, STATE_FILES,
    LOCKS, GC_PAUSES,
)  # fmt: skip


@dataclass(frozen=True)
class Tally:
    """Counts and work-seconds by kind of work."""

    counts: Mapping[str, int] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)

    def __sub__(self, earlier: Tally) -> Tally:
        return Tally(
            {k: n - earlier.counts.get(k, 0) for k, n in self.counts.items() if n != earlier.counts.get(k, 0)},
            {k: s - earlier.seconds.get(k, 0.0) for k, s in self.seconds.items() if k in self.counts},
        )

    def __add__(self, other: Tally) -> Tally:
        kinds = set(self.counts) | set(other.counts)
        return Tally(
            {k: self.counts.get(k, 0) + other.counts.get(k, 0) for k in kinds},
            {k: self.seconds.get(k, 0.0) + other.seconds.get(k, 0.0) for k in kinds},
        )

    def sentence(self) -> str:
        """`change-log commits 1,000 (9.8 s), state and batch file operations 6,012 (3.1 s), …`, in `KINDS`' order."""
        order = [k for k in KINDS if self.counts.get(k)] + sorted(k for k in self.counts if k not in KINDS and self.counts[k])
        return ", ".join(f"{k} {self.counts[k]:,} ({self.seconds.get(k, 0.0):.1f} s)" for k in order) or "none"


_lock = threading.Lock()
_counts: dict[str, int] = {}
_seconds: dict[str, float] = {}


def count(kind: str, seconds: float, times: int = 1) -> None:
    with _lock:
        _counts[kind] = _counts.get(kind, 0) + times
        _seconds[kind] = _seconds.get(kind, 0.0) + seconds


@contextmanager
def timed(kind: str) -> Iterator[None]:
    """Count one `kind` of work and the seconds of the block (also when it raises: the attempt was work)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        count(kind, time.perf_counter() - began)


def tallied(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A function each call of which is one `kind` of work."""

    def wrap(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            with timed(kind):
                return function(*args, **kwargs)

        return counted

    return wrap


def snapshot() -> Tally:
    """The process's tally so far."""
    with _lock:
        counts, seconds = dict(_counts), dict(_seconds)
    collections, paused = _collections.count, _collections.seconds
    if collections:
        counts[GC_PAUSES] = counts.get(GC_PAUSES, 0) + collections
        seconds[GC_PAUSES] = seconds.get(GC_PAUSES, 0.0) + paused
    return Tally(counts, seconds)


class _Collections:
    """The collector's own count, kept apart from `_counts` and its lock: a callback runs inside a collection, which
    may begin while this thread holds `_lock`; collections never overlap, so none needs one."""

    def __init__(self) -> None:
        self.count, self.seconds, self.began = 0, 0.0, 0.0

    def __call__(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self.began


_collections = _Collections()
gc.callbacks.append(_collections)


def add(other: Tally) -> None:
    """Count another process's work here (the forked child's)."""
    for kind, times in other.counts.items():
        count(kind, other.seconds.get(kind, 0.0), times)
