"""The continuous mode's equality comparisons, in a child process of their own.

Comparing a table row for row hashes every row in Python and Arrow: for a 10M-row table tens of seconds of work
that, in the follower's process, holds the GIL against the follower's thread, so every table's capture and apply
waits behind it. The continuous mode hands each comparison (`compare_changed` or `compare_every_row`, the very
functions the batch runs call) to one child process instead, started once (a fresh interpreter running this module,
`python -m cdc_assets.runtime.check_process`, deaf to the run's signals: the op ends it) and kept for the next check. The child reads
the source and the Delta tables itself and sends back the comparisons (verdicts, row counts, the keys that differ);
the op turns them into the same asset check evaluations as before. Requests and answers are pickled over the
child's stdin and stdout; its own output goes to stderr.

An S3 lakehouse's comparisons stay in the op's process (its Lakehouse holds a boto3 client, which is not sent to
a child): `InProcessChecks` has the same interface and runs the comparison when it is submitted.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import SourceSettings
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.changed_keys import compare_changed, compare_every_row
from cdc_assets.verification.consistency import ConsistentComparison


def compare(kind: str, settings: SourceSettings, lakehouse: Lakehouse, tables: list[str]) -> list[ConsistentComparison]:
    """The comparison of a check: 'changed' (the keys changed since each table was last found equal) or 'full'."""
    compare = compare_changed if kind == "changed" else compare_every_row
    return compare(settings, lakehouse, [TableRef.parse(t) for t in tables])


@dataclass
class Request:
    kind: str  # 'changed' or 'full'
    tables: list[str]  # the tables' names (schema.table), resolved by the parent


@dataclass
class Answer:
    comparisons: list[ConsistentComparison] | None
    error: BaseException | None = None


class CheckProcessDied(RuntimeError):
    """The child process ended without an answer (killed, out of memory)."""


class ChildChecks:
    """One child process running comparisons one at a time; `submit` hands one over, `result` polls for it."""

    def __init__(self, settings: SourceSettings, lakehouse: Lakehouse) -> None:
        if lakehouse.is_s3:
            raise ValueError("an S3 lakehouse's checks run in process (InProcessChecks)")
        self.settings, self.lakehouse = settings, lakehouse
        self.process: subprocess.Popen[bytes] | None = None
        self.sender: Connection | None = None
        self.receiver: Connection | None = None
        self.pending: Request | None = None

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.runtime.check_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.sender = Connection(os.dup(self.process.stdin.fileno()), readable=False)
        self.receiver = Connection(os.dup(self.process.stdout.fileno()), writable=False)
        self.process.stdin.close()
        self.process.stdout.close()
        self.sender.send((self.settings, self.lakehouse))

    def submit(self, request: Request) -> None:
        if self.pending is not None:
            raise RuntimeError("a check is in progress already")
        if self.process is None or self.process.poll() is not None:
            self.close()
            self._start()
        assert self.sender is not None
        try:
            self.sender.send(request)
        except OSError:  # the child is gone: the next poll says so
            pass
        self.pending = request

    def result(self, timeout: float = 0.0) -> tuple[Request, Answer] | None:
        """The pending check's answer once it is there (waiting up to `timeout` seconds), else None."""
        if self.pending is None or self.receiver is None:
            return None
        try:
            if not self.receiver.poll(timeout):
                return None
            answer = self.receiver.recv()
        except (EOFError, OSError):
            code = self.process.poll() if self.process is not None else None
            answer = Answer(None, CheckProcessDied(f"the check process ended without an answer (exit code {code})"))
            self.close()
        request, self.pending = self.pending, None
        return request, answer

    def close(self) -> None:
        """End the child: at once when a check is in progress (it is abandoned), else as its input closes."""
        for conn in (self.sender, self.receiver):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self.sender = self.receiver = None
        if self.process is not None:
            if self.pending is not None:
                self.process.kill()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        self.pending = None


class InProcessChecks:
    """The same interface, comparing in the caller's thread when a check is submitted (an S3 lakehouse)."""

    def __init__(self, settings: SourceSettings, lakehouse: Lakehouse) -> None:
        self.settings, self.lakehouse = settings, lakehouse
        self.done: tuple[Request, Answer] | None = None

    @property
    def pending(self) -> Request | None:
        return self.done[0] if self.done is not None else None

    def submit(self, request: Request) -> None:
        try:
            answer = Answer(compare(request.kind, self.settings, self.lakehouse, request.tables))
        except Exception as exc:  # noqa: BLE001 (handed to the caller as a child's failure would be)
            answer = Answer(None, exc)
        self.done = (request, answer)

    def result(self, timeout: float = 0.0) -> tuple[Request, Answer] | None:
        done, self.done = self.done, None
        return done

    def close(self) -> None:
        self.done = None


def checks_for(settings: SourceSettings, lakehouse: Lakehouse) -> ChildChecks | InProcessChecks:
    """A child process's checks for a local lakehouse, in-process ones for an S3 lakehouse."""
    return InProcessChecks(settings, lakehouse) if lakehouse.is_s3 else ChildChecks(settings, lakehouse)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve() -> None:
    """The child: read (settings, lakehouse), then answer requests until stdin closes."""
    channel = os.dup(1)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    sys.stdout = sys.stderr
    # Not niced: on a busy machine a niced check can starve, which delays the check's cadence and a stop (it waits
    # for the check in progress); the child uses one core at most, the follower's GIL-bound thread the other.
    # A terminal's Ctrl-C or a signal to the run's process group is for the run: the parent decides when the child
    # ends (its input closes between checks; killed when a check is abandoned).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    receiver, sender = Connection(os.dup(0), writable=False), Connection(channel, readable=False)
    try:
        settings, lakehouse = receiver.recv()
        while True:
            request: Request = receiver.recv()
            try:
                answer = Answer(compare(request.kind, settings, lakehouse, request.tables))
            except Exception as exc:  # noqa: BLE001 (the parent fails the check with it)
                traceback.print_exc()
                answer = Answer(None, _picklable(exc))
            sender.send(answer)
    except (EOFError, BrokenPipeError):
        return


if __name__ == "__main__":
    from cdc_assets.runtime import check_process  # the module by its name: what is pickled names its classes so

    check_process._serve()
