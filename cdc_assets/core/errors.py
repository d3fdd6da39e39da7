"""Errors a user can cause and fix: they end the CLI with one sentence and exit code 2."""

from __future__ import annotations

import errno
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class CdcUserError(Exception):
    """Bad configuration, credentials, server set-up or lakehouse: the message names cause and fix."""


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")


def _disk_full(exc: BaseException | None) -> bool:
    """Whether an error, or one it was raised from, is a full disk (Python, pyarrow and delta-rs word it alike)."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(exc) for text in _DISK_FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


@contextmanager
def disk_full_is_user_error(lakehouse: str) -> Iterator[None]:
    """A full disk ends the work with one sentence: the lakehouse (objects replaced atomically, Delta commits)
    and the local spool never show what was half-written, so the same command can simply run again."""
    try:
        yield
    except CdcUserError:
        raise
    except Exception as exc:
        if not _disk_full(exc):
            raise
        raise CdcUserError(
            f"No space left on a disk the pipeline writes to (the lakehouse at {lakehouse}, or the local spool in "
            f"{tempfile.gettempdir()}): free space there, or point CDC_LAKEHOUSE or TMPDIR at a larger disk, and run "
            "it again (nothing half-written was kept)."
        ) from exc
