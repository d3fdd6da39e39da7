"""How far long work has come (capture, the change logs, current state, comparisons, a snapshot), for the CLI's display.

The work reports plain updates where it passes a milestone (a raw batch written, a chunk of batches appended, a table
merged); whoever listens shows them: the `cdc-lakehouse` command's progress display (cdc_assets/cli_display.py).
Nobody listens in runs the UI or the daemon launch (their run logs say the same), and there a report costs one look
at an empty list. A `sync`'s child, forked before Dagster is imported (runtime/forked_capture.py), passes its updates to
the parent through a pipe (`Relay`), where they reach the same display.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from cdc_assets.core.positions import BinlogPosition

CAPTURE = "capture"
CHANGE_LOGS = "change logs"
CURRENT_STATE = "current state"
COMPARE = "compare with source"  # the checks' and verify's comparisons
SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class Update:
    """Where one stage of the work stands."""

    stage: str  # CAPTURE, CHANGE_LOGS, CURRENT_STATE, COMPARE, SNAPSHOT
    done: float  # work done, in `unit`
    total: float | None  # all the stage's work, in `unit`, when known: what the time left is reckoned from
    unit: str  # "bytes" (of binlog), "batches", "tables", "chunks"
    rows: int = 0  # row changes (or rows read) so far
    batches: int = 0  # raw batches written or taken in so far


Listener = Callable[[Update], None]
_listeners: list[Listener] = []


def listened() -> bool:
    """Whether anyone listens: work that must ask the source or the lakehouse for its totals does so only then."""
    return bool(_listeners)


def report(update: Update) -> None:
    """Tell every listener; a listener that fails never stops the work."""
    for listener in tuple(_listeners):
        try:
            listener(update)
        except Exception:  # noqa: BLE001 - a display's failure is not the work's
            pass


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        if listener in _listeners:
            _listeners.remove(listener)


def binlog_bytes(files: list[tuple[str, int]], start: BinlogPosition, end: BinlogPosition) -> int:
    """Bytes of binlog from `start` to `end`, over the server's binlog files (name, size; oldest first): what a
    capture reads between two positions, across file rotations."""
    total = 0
    for name, size in files:
        number = BinlogPosition(name, size).sort_key[0]
        if number < start.sort_key[0] or number > end.sort_key[0]:
            continue
        low = start.log_pos if name == start.log_file else 4
        high = end.log_pos if name == end.log_file else size
        total += max(high - low, 0)
    return total


class Relay:
    """Updates reported in a forked child, passed to the parent's listeners: one JSON line each through a pipe. The
    child never waits on it: an update the pipe has no room for is dropped (the next one says more)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def in_child(self) -> None:
        """In the child, right after the fork: its updates go to the pipe, not to the parent's display (a copy)."""
        os.close(self.read_fd)
        os.set_blocking(self.write_fd, False)
        _listeners[:] = [self._send]

    def _send(self, update: Update) -> None:
        try:
            os.write(self.write_fd, (json.dumps(asdict(update)) + "\n").encode())
        except OSError:  # full (BlockingIOError) or closed: this update is dropped
            pass

    def in_parent(self) -> None:
        """In the parent: a thread hands the child's updates to this process's listeners until the child ends."""
        os.close(self.write_fd)
        threading.Thread(target=self._receive, name="progress-relay", daemon=True).start()

    def _receive(self) -> None:
        with os.fdopen(self.read_fd, "rb") as pipe:
            for line in pipe:
                try:
                    update = Update(**json.loads(line))
                except (ValueError, TypeError):  # a line cut short by a killed child
                    continue
                report(update)


def relay() -> Relay | None:
    """A relay for a child about to be forked, when anyone here listens."""
    return Relay() if listened() else None
