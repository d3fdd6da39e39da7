"""A `cdc-lakehouse sync`'s run of the pipeline's driver (its capture, then its stages), started in a child process
before Dagster is imported.

Importing Dagster and opening the instance take a small sync about as long as its capture (benchmarks/README.md,
"Fixed costs"), on one core while the other waits. So the command line's `sync` forks before it imports Dagster:
the child captures while the parent imports Dagster, opens the instance and starts the run, and the run's op
(`cdc_assets.defs.sync`) then takes the child's report and records the batches as the raw asset's
materialization, as if it had captured them itself. This module imports nothing of Dagster.

What keeps it as safe as a capture inside the run:
- The run's id is chosen before the fork and given to the run (`execute_in_process(run_id=…)`), so the capture
  lock names the sync run that holds it, as when the op captures: a scheduled capture, another sync or the
  continuous mode waits for it or refuses, as before.
- The child dies with its parent (Linux's parent-death signal, SIGKILL) and checks its parent is still there
  after setting it: a killed `sync` leaves no capture behind that would hold the lock.
- The capture lists each batch in the run's journal before the checkpoint passes it (capture/journal.py), naming
  the parent as the process that records it: if the parent dies before recording them, the next sync's capture
  takes them over and records them, once.
- A child that fails, or is killed, leaves what any killed capture leaves (the checkpoint at the last complete
  batch); the op then captures in the run itself, from the checkpoint, which says what the user can fix as a
  capture in a run always did. A child that ended at a failpoint ends the parent there too, as the single
  process it stands for would have.

The child runs the pipeline's one driver (cdc_assets/pipeline/driver.py, through cdc_assets.runtime.forked_stages):
once its capture is durable it goes on with the change logs, current state and the checks' comparisons of the tables
pending, sending each step's report as the driver yields it; the op records them as they come instead of running
those steps (`ForkedCapture.reports`), and runs the driver itself for the steps the child did not report
(`pipeline.driver.remaining`). `CDC_SYNC_FORK=capture` keeps the child to the capture.

Only a local lakehouse on Linux is captured this way; on S3 (its client and lease heartbeat are built by the
resources) and where `CDC_SYNC_FORK=0`, the op captures as before. The child takes the command's settings (a fork
inherits the value the CLI built: its flags included) and reads no environment.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_assets.core import progress

if TYPE_CHECKING:
    from cdc_assets.core.settings import EngineSettings, Settings

PR_SET_PDEATHSIG = 1
_started: dict[str, ForkedCapture] = {}


def _owner(run_id: str) -> str:
    from cdc_assets.lake.locks import run_owner

    return run_owner(run_id)


@dataclass
class ForkedCapture:
    """The driver running in a child for the run `run_id`: its capture, and the stages it goes on with."""

    run_id: str
    pid: int
    read_fd: int
    engine: EngineSettings  # the Spark session a stage left to the run is begun with (`listen`)
    user_error: str | None = None  # the sentence a stage of the child ended with (the run ends with it there)
    _received: queue.SimpleQueue[tuple[str, Any, list[str]] | None] = field(default_factory=queue.SimpleQueue)
    _reader: threading.Thread | None = None
    _over: bool = False

    def listen(self) -> None:
        """Read the child's messages as they come, in a thread: the op asks for them only once Dagster is imported
        and the run started, and a stage the child leaves to Spark (message `spark`, before `left`) starts the run's
        session here before that (spark_resources.session.start_session_early)."""
        self._reader = threading.Thread(target=self._read, name="forked-capture-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with os.fdopen(self.read_fd, "rb") as pipe:
            while True:
                try:
                    message = pickle.load(pipe)
                except Exception:  # ended (EOF), or killed in the middle of a message
                    break
                if message[0] == "spark":  # a head start only: the run starts what it needs when it needs it
                    from spark_resources.session import spark_config, start_session_early

                    start_session_early(spark_config(self.engine.spark_master, dict(self.engine.spark_conf)))
                self._received.put(message)
        self._received.put(None)

    def _next(self, log: Any) -> tuple[str, Any] | None:
        """The child's next message (its log lines replayed to `log`), or None once it has said all it will."""
        if self._over:
            return None
        if self._reader is None:
            self.listen()
        received = self._received.get()
        if received is None:
            self._end(log)
            return None
        kind, value, messages = received
        for message in messages:
            log.info(message)
        return kind, value

    def _end(self, log: Any) -> None:
        """Wait for the child; one that ended at a failpoint ends this process there too."""
        from cdc_assets.core import failpoints

        self._over = True
        _, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == failpoints.EXIT_CODE:
            os._exit(failpoints.EXIT_CODE)  # the sync stood for one process: it ends where its child ended
        if code != 0:
            log.warning(f"the process begun before the run ended with exit code {code}: the run does what it left")

    def reports(self, log: Any) -> Iterator[Any]:
        """The child's step reports (pipeline.driver's) as they come, until it has said all it will. A capture that
        ended with a sentence for the user raises it (CdcUserError) at once, as the op's own capture would; one that
        failed, or a child killed before its capture's report, yields nothing (the op captures from the checkpoint).
        A later step's sentence is kept in `user_error` (the op says it where its own call would); a later step that
        failed, or was left to the run's Spark, ends the reports: the op runs the driver for the steps left."""
        from cdc_assets.core import work_tally
        from cdc_assets.core.errors import CdcUserError

        captured = False
        while (message := self._next(log)) is not None:
            kind, value = message
            if kind == "step":
                captured = True
                yield value
            elif kind == "work":  # what the step took in the child: counted as this process's (core.work_tally)
                work_tally.add(value)
            elif kind in ("left", "failed", "user_error"):
                self._end(log)
                if kind == "user_error" and not captured:
                    raise CdcUserError(value)
                if kind == "user_error":
                    self.user_error = value
                elif captured:
                    log.info(f"the process begun before the run left the rest to the run: {value}")
                else:
                    log.warning(f"the capture begun before the run failed ({value}): capturing here")
                return
            # `spark`: said during the capture, the session is starting (`listen`)
        if not captured:  # killed before it said anything: the op captures from the checkpoint
            log.warning("the capture begun before the run ended without a report: capturing here")


class _Messages:
    """A logger for the child: its messages go back to the run's log with the report."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def info(self, message: str) -> None:
        self.messages.append(message)

    debug = warning = error = info


class _Sender:
    """Sends the child's messages to the op, each with the log lines said since the last, from a thread of its own:
    the op reads the capture's report only once Dagster is imported, and a stage must not wait for that on a full
    pipe."""

    def __init__(self, write_fd: int, messages: _Messages) -> None:
        self.pipe = os.fdopen(write_fd, "wb")
        self.messages = messages
        self.queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        while (body := self.queue.get()) is not None:
            self.pipe.write(body)
            self.pipe.flush()

    def __enter__(self) -> Callable[[str, Any], None]:
        self.thread.start()
        return self.send

    def send(self, kind: str, value: Any) -> None:
        said, self.messages.messages = self.messages.messages, []
        self.queue.put(pickle.dumps((kind, value, said)))

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()
        self.pipe.close()


def stages_wanted(settings: Settings) -> bool:
    """Whether the child goes on with the stages after its capture (CDC_SYNC_FORK=capture: the capture only)."""
    return settings.sync_fork != "capture"


def wanted(settings: Settings) -> bool:
    return (
        settings.sync_fork != "0"
        and sys.platform.startswith("linux")
        and hasattr(os, "fork")
        and not settings.lakehouse.location.startswith("s3://")
    )


def start(run_id: str, settings: Settings) -> ForkedCapture | None:
    """Fork a child that captures for the run `run_id` with `settings` (the sync's); None when this sync captures in
    its run instead."""
    if not wanted(settings):
        return None
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    relayed = progress.relay()  # the child's progress, to this process's display
    pid = os.fork()
    if pid == 0:  # the child
        if relayed is not None:
            relayed.in_child()
        os.close(read_fd)
        code = 1
        try:
            code = _child(run_id, settings, parent, write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    if relayed is not None:
        relayed.in_parent()
    forked = ForkedCapture(run_id, pid, read_fd, settings.engine)
    forked.listen()
    _started[run_id] = forked
    return forked


def take(run_id: str) -> ForkedCapture | None:
    """The capture forked for this run, if any (once: a retried op captures itself)."""
    return _started.pop(run_id, None)


def _die_with(parent: int) -> bool:
    """SIGKILL this process when its parent dies; False when the parent is already gone."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return os.getppid() == parent


def _once(said: Callable[[], None]) -> Callable[[str], None]:
    """A journal's `listed` hook that calls `said` at the first batch only."""
    pending = [said]

    def listed(_batch: str) -> None:
        if pending:
            pending.pop()()

    return listed


def _child(run_id: str, settings: Settings, parent: int, write_fd: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the whole group: the child just ends
    if not _die_with(parent):
        os.close(write_fd)
        return 1
    messages = _Messages()
    try:
        from cdc_assets.core import failpoints

        failpoints.arm_from(failpoints.CHILD_ENV)
        from cdc_assets.capture.journal import CaptureJournal, Recorder
        from cdc_assets.runtime.collector import freeze_imported
        from cdc_assets.runtime.forked_stages import run_driver

        with _Sender(write_fd, messages) as send:
            # the parent records the batches; with a run whose every stage takes Spark (CDC_SPARK_MIN_ROWS 0, a
            # cluster's default), the first batch also tells it to start the session, which then starts beside the
            # rest of the capture
            every_stage_spark = settings.engine.spark_min_rows == 0
            first_batch = _once(lambda: send("spark", "a batch captured")) if every_stage_spark else None
            journal = CaptureJournal(run_id, Recorder.of(parent), listed=first_batch)
            freeze_imported()
            run_driver(settings, _owner(run_id), journal, messages, send, stages=stages_wanted(settings))
        return 0
    except BaseException:
        return 1
