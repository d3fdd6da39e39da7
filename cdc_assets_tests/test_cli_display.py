"""Long CLI work shows its progress (issue 30): a live display on a terminal, plain lines otherwise, with raw batches,
rows, the rate and the time left, from the capture in the sync's forked child as from the stages in the run."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from cdc_assets.cli_display import ProgressDisplay, describe, seconds_left
from cdc_assets.core.progress import CAPTURE, CHANGE_LOGS, Update, report
from cdc_assets_tests.conftest import CdcEnv, run_cli

ROWS = 120_000


def _many_changes(cdc: CdcEnv) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, pad VARCHAR(100))")
    for start in range(0, ROWS, 10_000):
        cdc.execute(f"INSERT INTO t SELECT seq + {start}, REPEAT('p', 80) FROM {cdc.numbers(10_000)}")


def test_progress_in_words() -> None:
    half = Update(CAPTURE, 50 * 1024 * 1024, 100 * 1024 * 1024, "bytes", rows=60_000, batches=6)
    assert describe(half, 2.0) == (
        "capture: 50% of 100.0 MB of binlog, 6 raw batches, 60,000 rows, 30,000 rows/s, about 2 s left"
    )
    assert seconds_left(Update(CHANGE_LOGS, 0, 10, "batches"), 5.0) is None  # nothing done yet: no guess
    assert describe(Update(CHANGE_LOGS, 3, 12, "batches", rows=30_000, batches=3), 90.0).startswith(
        "change logs: 3 of 12 batches, 30,000 rows, 333 rows/s, about 4 min 30 s left"
    )


def test_plain_lines_come_for_a_stage_that_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short work prints nothing more than before: a line every CDC_PROGRESS_SECONDS for the stage the work is in,
    once that stage has gone on that long and until it is done; nothing after the display closed."""
    out = io.StringIO()
    with ProgressDisplay(out, terminal=False, every=0.3):
        report(Update(CHANGE_LOGS, 0, 3, "batches"))
        report(Update(CHANGE_LOGS, 3, 3, "batches", rows=10, batches=3))  # done at once: never printed
        report(Update(CAPTURE, 1, 10, "bytes", rows=5, batches=1))
        time.sleep(0.2)
        assert out.getvalue() == ""
        report(Update(CAPTURE, 5, 10, "bytes", rows=50, batches=2))
        time.sleep(0.75)  # two more ticks, in the capture
    report(Update(CAPTURE, 10, 10, "bytes", rows=99, batches=4))
    time.sleep(0.35)
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 3 and all(line.startswith("capture: 50% of 10 bytes of binlog, 2 raw batches, 50 rows") for line in lines), lines


@pytest.mark.both_sources
def test_a_long_sync_prints_plain_progress_lines_where_the_output_is_no_terminal(cdc: CdcEnv) -> None:
    _many_changes(cdc)
    done = run_cli("sync", env={"CDC_MAX_BATCH_ROWS": "10000", "CDC_PROGRESS_SECONDS": "0.2"})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    capture = [line for line in lines if line.startswith("capture: ")]
    # the capture runs in the child forked before Dagster's import: its updates reach the parent's display
    pattern = r"capture: \d+% of [\d.,]+ [KMG]?B(ytes)? of binlog, [\d,]+ raw batch(es)?, [\d,]+ rows, [\d,]+ rows/s, about \d+ s left"
    assert any(re.fullmatch(pattern, line) for line in capture), capture
    # the other stages print a line when they go on past the interval: then in the same words
    stages = ("capture: ", "change logs: ", "current state: ", "compare with source: ")
    summary = ("captured ", "change logs: 1", "current state: 1 ", "sync succeeded")
    assert all(line.startswith(stages + summary) for line in lines), lines
    assert f"{ROWS} rows inserted" in done.stdout and lines[-1].startswith("sync succeeded in ")
    assert all(d.ok for d in cdc.verify())


def test_a_long_sync_shows_a_live_display_on_a_terminal(cdc: CdcEnv) -> None:
    """Under a pseudo-terminal, as a user at a shell: rich's live lines (batches, rows, rate, time left) while it
    works, then only the sync's own summary."""
    _many_changes(cdc)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "sync"],
        env={**os.environ, "CDC_MAX_BATCH_ROWS": "10000", "TERM": "xterm-256color", "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    shown = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        elif child.poll() is not None:
            break
    os.close(leader)
    assert child.wait(timeout=60) == 0, shown.decode(errors="replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    assert "\x1b[" in shown.decode(errors="replace")  # drawn and redrawn in place
    assert re.search(r"capture .*raw batch(es)?, [\d,]+ rows, [\d,]+ rows/s", text), text
    assert re.search(r"change logs .*of \d+ batches", text), text
    assert "sync succeeded in" in text and f"{ROWS} rows inserted" in text
