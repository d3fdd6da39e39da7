"""`cdc-lakehouse` commands each in a process of its own, forked from one warm server instead of started afresh.

A test that crashes the CLI at a failpoint needs the crash in a process of its own (what it leaves: a lock's holder
dead, partial files, a sync's forked capture child killed with it), but a fresh `cdc-lakehouse` spends seconds of
CPU before it does any work: Python's start, and the imports of Dagster, the definitions, pyarrow and deltalake (a
sync's two processes each import much of them). `CliServer` pays that once: a server process imports what a command
imports, then forks a child per command, which runs it as `cdc-lakehouse` does (`cli.run()`, with the argv of a
command line, so a `sync` forks its capture child too; then `os._exit` with the command's exit code), with the
environment the test gives it and the failpoints that environment arms.

Not forked from the test process itself: deltalake's tokio runtime refuses to run in a forked child of a process
that has used it (it panics, "Forked process detected"), and a test has used it (its own syncs, its checks). The
server only imports: it opens no Delta table, no Dagster instance, no connection, takes no lock and starts no
Python thread (`_assert_forkable`), so each child starts from the state a fresh `cdc-lakehouse` has after its
imports, never from what a command before it left.

The server answers as `subprocess.run(capture_output=True)` does: once the child's stdout and stderr are closed by
every process holding them (a sync's capture child too, killed with its parent) and the child has been reaped.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

# What a `cdc-lakehouse` command imports before its run begins: the CLI, Dagster and the definitions (through
# commands.runs), and what a sync's forked child runs. A child imports whatever else it needs itself.
PRELOADED = (
    "cdc_assets.cli",
    "cdc_assets.commands.runs",
    "cdc_assets.runtime.forked_stages",
    "cdc_assets.capture.journal",
)
# What a command's run imports as it goes (opening the Dagster instance, its storages; pyarrow's pandas shim): a
# warm-up only, so one that a later Dagster no longer has is left to the child to import as it would.
WARMED = (
    "dagster._core.instance.factory",
    "dagster._core.storage.runs",
    "dagster._core.storage.event_log",
    "dagster._core.storage.schedules",
    "dagster._core.storage.local_compute_log_manager",
    "dagster._core.secrets.env_file",
    "dagster._core.execution.execute_in_process",
    "cdc_assets.runtime.event_log",
    "upath.implementations.local",
    "pandas",
    "pyarrow.pandas_compat",
)
# Armed in each child from the environment its request gives, never in the server (they are read at import).
FAILPOINT_VARIABLES = ("CDC_FAILPOINTS", "CDC_CHILD_FAILPOINTS")


class CliServer:
    """The test's side: `run(*argv, env=…)` like `subprocess.run([cdc-lakehouse, *argv], env=…, capture_output=True,
    text=True)`, each command in a child forked from the server. The server starts at the first command, with the
    test's environment then (less the failpoints); each command is given its whole environment anew."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[bytes] | None = None
        self._unread = b""  # the server's answers read but not yet taken
        self._log = tempfile.TemporaryFile(mode="w+")  # the server's own stderr, shown if it dies

    def _start(self) -> subprocess.Popen[bytes]:
        if self._server is None or self._server.poll() is not None:
            env = {k: v for k, v in os.environ.items() if k not in FAILPOINT_VARIABLES}
            self._server = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=env,
            )
            self._unread = b""
        return self._server

    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """`cdc-lakehouse *argv` with `env` (default this process's environment), in a forked child; its exit code
        is negative when a signal ended it, as subprocess's."""
        server = self._start()
        assert server.stdin is not None
        request = {"argv": list(argv), "env": dict(os.environ if env is None else env), "cwd": os.getcwd()}
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        deadline = time.monotonic() + timeout
        pid = self._answer(server, deadline)["pid"]
        try:
            done = self._answer(server, deadline)
        except TimeoutError:  # the command hangs: end it (the server then answers) and say so as subprocess.run would
            os.kill(pid, signal.SIGKILL)
            self._answer(server, time.monotonic() + 30)
            raise subprocess.TimeoutExpired(["cdc-lakehouse", *argv], timeout) from None
        return subprocess.CompletedProcess(["cdc-lakehouse", *argv], done["code"], done["stdout"], done["stderr"])

    def _answer(self, server: subprocess.Popen[bytes], deadline: float) -> dict[str, Any]:
        """The server's next answer line, read as it comes until `deadline` (TimeoutError past it)."""
        assert server.stdout is not None
        fd = server.stdout.fileno()
        while b"\n" not in self._unread:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._log.seek(0)
                raise RuntimeError(f"the CLI server ended (exit {server.wait(30)}): {self._log.read()[-3000:]}")
            self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()  # the server ends at the end of its requests
            self._server.wait(timeout=30)
            self._server = None
        self._log.close()

    def __enter__(self) -> CliServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(request: dict[str, Any], stdout_fd: int, stderr_fd: int, closed: list[int]) -> None:
    """In the forked child: the command's environment, working directory and output, then the command, ended as
    `cdc-lakehouse` ends (`cli.run()` exits the process itself)."""
    code = 1
    try:
        for fd in closed:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the requests' pipe no longer
        os.close(devnull)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        os.close(stdout_fd)
        os.close(stderr_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from cdc_assets.cli import run
        from cdc_assets.core import failpoints

        failpoints.arm_from(failpoints.ENV)  # as a fresh process arms them at import
        sys.argv = ["cdc-lakehouse", *request["argv"]]
        run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _read_until_closed(fds: list[int]) -> list[bytes]:
    """Everything written to each pipe, once every writer has closed it."""
    got = {fd: bytearray() for fd in fds}
    open_fds = list(fds)
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                got[fd] += chunk
            else:
                open_fds.remove(fd)
                os.close(fd)
    return [bytes(got[fd]) for fd in fds]


def _serve(requests: IO[str], answers: IO[str]) -> None:
    for line in requests:
        request = json.loads(line)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, out_write, err_write, [out_read, err_read, answers.fileno()])
        os.close(out_write)
        os.close(err_write)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        out, err = _read_until_closed([out_read, err_read])
        _, status = os.waitpid(pid, 0)
        answer = {
            "code": os.waitstatus_to_exitcode(status),
            "stdout": out.decode(errors="replace"),
            "stderr": err.decode(errors="replace"),
        }
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _native_threads() -> dict[str, str]:
    """This process's threads (Linux: /proc), id -> name."""
    tasks = Path("/proc/self/task")
    return {t.name: (t / "comm").read_text().strip() for t in tasks.iterdir()} if tasks.is_dir() else {}


def _assert_forkable(blas_threads: set[str]) -> None:
    """A child of a multi-threaded process has only the forking thread, and a lock another thread held stays held
    in it: the server forks with no Python thread but its own, and no native thread but those made for fork (the
    BLAS numpy loads, as a `cdc-lakehouse` has when its sync forks; jemalloc's background threads, of pyarrow and
    deltalake): each registers pthread_atfork handlers that leave the child consistent, and holds no lock of ours."""
    if threading.active_count() != 1:
        raise RuntimeError(f"the CLI server has Python threads after its imports: {threading.enumerate()}")
    others = {t: name for t, name in _native_threads().items() if t not in blas_threads and name != "jemalloc_bg_thd"}
    if others:
        raise RuntimeError(f"the CLI server has threads after its imports that a fork would not take: {others}")


def main() -> None:
    """The server: the imports once, then one forked child per request line on stdin, answered on stdout."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever an import prints goes to the server's log, never among the answers
    import importlib

    import numpy  # noqa: F401  (first: the threads its BLAS starts are told apart from any other)

    blas_threads = set(_native_threads())
    for module in PRELOADED:
        importlib.import_module(module)
    for module in WARMED:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            pass
    _assert_forkable(blas_threads)
    _serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
