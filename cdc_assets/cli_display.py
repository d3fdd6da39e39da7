"""The `cdc-lakehouse` command's progress display for long work (a `sync` of 650k changes was silent for 68 s).

It shows the updates the work reports (cdc_assets/core/progress.py): on a terminal, a live line per stage with a bar,
raw batches, row changes, the rate and the time left (rich), cleared when the command ends, so what stays is the
command's own summary; where the output is no terminal (a log file, a pipe, CI), a plain line per stage every
CDC_PROGRESS_SECONDS (5) for the stage the work is in, once that stage has gone on that long, so short work prints
nothing more.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from cdc_assets.core import progress
from cdc_assets.core.progress import Update
from cdc_assets.core.settings import DEFAULT_PROGRESS_SECONDS

LIVE_REFRESHES_PER_SECOND = 4


@dataclass
class _Stage:
    """What one stage has reported, and since when."""

    first: float  # monotonic time of its first update
    last: Update
    shown: Any = field(default=None)  # its rich task id, on a terminal


def describe(update: Update, seconds: float) -> str:
    """One stage's progress in words: how much of how much, batches, row changes, the rate and the time left."""
    parts = []
    if update.unit == "bytes":
        if update.total:
            parts.append(f"{update.done / update.total:.0%} of {_size(update.total)} of binlog")
    elif update.total is not None:
        parts.append(f"{update.done:,.0f} of {update.total:,.0f} {update.unit}")
    if update.batches and update.unit != "batches":
        parts.append(f"{update.batches:,} raw batch{'' if update.batches == 1 else 'es'}")
    if update.rows:
        parts.append(f"{update.rows:,} rows")
        if seconds > 0:
            parts.append(f"{update.rows / seconds:,.0f} rows/s")
    left = seconds_left(update, seconds)
    if left is not None:
        parts.append(f"about {_duration(left)} left")
    return f"{update.stage}: " + (", ".join(parts) if parts else "started")


def seconds_left(update: Update, seconds: float) -> float | None:
    """The time left at the rate so far, when the stage knows its total and has done some of it."""
    if not update.total or update.done <= 0 or seconds <= 0:
        return None
    return max(update.total - update.done, 0.0) * seconds / update.done


def _size(count: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "bytes" else f"{count:,.1f} {unit}"
        count /= 1024
    return f"{count:,.1f} GB"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class ProgressDisplay:
    """Listens to the work's updates for as long as a command runs (a context manager)."""

    def __init__(
        self, out: TextIO | None = None, terminal: bool | None = None, every: float = DEFAULT_PROGRESS_SECONDS
    ) -> None:
        self.out = out or sys.stdout
        self.terminal = self.out.isatty() if terminal is None else terminal
        self.every = every  # seconds between plain lines (CDC_PROGRESS_SECONDS: the settings' progress_seconds)
        self.stages: dict[str, _Stage] = {}
        self.current: str | None = None  # the stage updated last: the work goes on there
        self.lock = threading.Lock()
        self.live: Any = None  # rich's Progress, started at the first update on a terminal
        self.closed = threading.Event()
        self._listening = progress.listening(self.update)
        self._ticker = threading.Thread(target=self._tick, name="progress-lines", daemon=True)

    def __enter__(self) -> ProgressDisplay:
        self._listening.__enter__()
        if not self.terminal:
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listening.__exit__(*exc)
        with self.lock:
            self.closed.set()
            if self.live is not None:
                self.live.stop()

    def update(self, update: Update) -> None:
        now = time.monotonic()
        with self.lock:
            if self.closed.is_set():
                return
            stage = self.stages.get(update.stage)
            if stage is None:
                stage = self.stages[update.stage] = _Stage(now, update)
            stage.last = update
            self.current = update.stage
            if self.terminal:
                self._show(stage, now)

    def _tick(self) -> None:
        """Where the output is no terminal: every `every` seconds, a line for the stage the work is in, once that
        stage has gone on that long and while it is not done (a stage shorter than that prints nothing)."""
        while not self.closed.wait(self.every):
            with self.lock:
                stage = self.stages.get(self.current) if self.current else None
                now = time.monotonic()
                if stage is None or now - stage.first < self.every or self.closed.is_set():
                    continue
                update = stage.last
                if update.total is not None and update.done >= update.total:
                    continue
                print(describe(update, now - stage.first), file=self.out, flush=True)

    def _show(self, stage: _Stage, now: float) -> None:
        """The stage's line in the live display (rich computes the bar and the time left from done and total)."""
        if self.live is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.live = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=Console(file=self.out),
                transient=True,
                refresh_per_second=LIVE_REFRESHES_PER_SECOND,
                redirect_stdout=True,  # what the command prints meanwhile goes above the live lines
                redirect_stderr=False,
            )
            self.live.start()
        update = stage.last
        detail = describe(update, now - stage.first).split(": ", 1)[1]
        if stage.shown is None:
            stage.shown = self.live.add_task(update.stage, total=update.total, detail=detail)
        self.live.update(stage.shown, completed=update.done, total=update.total, detail=detail)
