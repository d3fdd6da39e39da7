"""Errors a user can cause and fix: they end the CLI with one sentence and exit code 2."""

from __future__ import annotations

import errno
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class CdcUserError(Exception):
    """Bad configuration, credentials, server set-up or lakehouse: the message names cause and fix."""


class TableUserError(CdcUserError):
    """A user error of one table alone (its rows or its shape, not the run's set-up): that table is quarantined with
    this sentence while the others go on, rather than ending the run (lake.quarantine.of_the_table)."""


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


# An object store that did not answer, after its client's retries: botocore's connection and timeout errors,
# S3's 5xx and throttling codes, and delta-rs's and pyarrow's wording of the same.
_UNREACHABLE_CLASSES = frozenset(
    {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError", "HTTPClientError"}
)
_UNREACHABLE_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"})
_UNREACHABLE_TEXT = re.compile(
    r"Generic S3 error.*(after \d+ retries|error sending request|status code: 5\d\d|timed? ?out)"
    r"|AWS Error (NETWORK_CONNECTION|SLOW_DOWN|SERVICE_UNAVAILABLE|INTERNAL_FAILURE|REQUEST_TIMEOUT)"
    r"|HTTP response code 5\d\d|curlCode: (7|28|52|56)\b",
    re.DOTALL,
)


def unreachable_reason(class_names: set[str], message: str) -> str | None:
    """Why an error means the object store did not answer (None when it means something else), from an error's
    class names (its own and its bases') and its message; so it works on live errors and Dagster's records of them."""
    if class_names & _UNREACHABLE_CLASSES:
        return (set(class_names) & _UNREACHABLE_CLASSES).pop()
    if "ClientError" in class_names:
        found = re.search(r"\((\w+)\)", message)
        if found and (found.group(1) in _UNREACHABLE_CODES or re.fullmatch(r"5\d\d", found.group(1))):
            return found.group(1)
    found = _UNREACHABLE_TEXT.search(message)
    return found.group(0).splitlines()[0][-60:] if found else None


def unreachable_cause(exc: BaseException | None) -> str | None:
    """`unreachable_reason` of an error or any error it was raised from."""
    seen = 0
    while exc is not None and seen < 20:
        reason = unreachable_reason({c.__name__ for c in type(exc).__mro__}, str(exc))
        if reason:
            return reason
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def storage_fault(exc: BaseException | None) -> bool:
    """Whether an error is a full disk or an object store that did not answer: the run's fault, never one table's."""
    return _disk_full(exc) or unreachable_cause(exc) is not None


def unreachable_message(lakehouse: str, endpoint: str | None, reason: str) -> str:
    """The one sentence for an object store that stayed down through every retry."""
    where = f"The S3 endpoint {endpoint}" if endpoint else "The object store"
    return (
        f"{where} of the lakehouse at {lakehouse} did not answer through every retry ({reason}): check that it is up "
        "and reachable from here (AWS_ENDPOINT_URL), or raise CDC_S3_MAX_ATTEMPTS or CDC_S3_TIMEOUT_SECONDS, and run "
        "it again (nothing past what was durably written was recorded)."
    )


@contextmanager
def storage_faults_are_user_errors(lakehouse: str, endpoint: str | None = None) -> Iterator[None]:
    """A full disk, or an object store that stays down through every retry, ends the work with one sentence: the
    lakehouse (objects replaced atomically, Delta commits) and the local spool never show what was half-written,
    and no checkpoint or progress moves before what it covers is written, so the same command can simply run
    again."""
    try:
        yield
    except CdcUserError:
        raise
    except Exception as exc:
        if _disk_full(exc):
            raise CdcUserError(
                f"No space left on a disk the pipeline writes to (the lakehouse at {lakehouse}, or the local spool "
                f"in {tempfile.gettempdir()}): free space there, or point CDC_LAKEHOUSE or TMPDIR at a larger disk, "
                "and run it again (nothing half-written was kept)."
            ) from exc
        reason = unreachable_cause(exc)
        if reason is None:
            raise
        raise CdcUserError(unreachable_message(lakehouse, endpoint, reason)) from exc
