"""Locks that live in the lakehouse, so two runs never write the same thing at once, whoever starts them.

A Dagster schedule, the CLI, the UI or another machine may each start a capture; they all share only the
lakehouse, so that is where the lock is kept:

- Local lakehouse: `fcntl.flock` on `_state/locks/<name>.lock`. The kernel drops the lock when its holder
  dies, so there is no expiry. flock belongs to an open file description, so two threads that each open the
  file exclude each other like two processes do. The file holds the holder's JSON while it is held and is
  emptied (never deleted: deleting a locked file lets a second locker lock a new file) on release. The
  descriptor is not inherited by child processes (Python opens files non-inheritable), so a Spark JVM or
  other child cannot keep a lock alive after its parent exits.
- S3 lakehouse: a lease object `_state/locks/<name>.json` written with conditional PUTs. It is created with
  `If-None-Match: *`, renewed every ttl/3 by a heartbeat thread with `If-Match: <own ETag>`, taken over
  after `expires_at` with `If-Match: <its ETag>` (only one taker can win) and deleted on release only while
  it is still ours. A holder that cannot renew in time loses the lease, and `Lease.check()` says so.
  `expires_at` comes from the writer's clock, so machines' clocks must agree to well within the TTL, and
  the TTL must outlast any call that keeps the heartbeat thread from running (one holding the GIL).

What moto 5.2.5's `moto_server` does with these conditions (checked over HTTP): it enforces all of them.
put_object with `IfNoneMatch="*"` on an existing key, with `IfMatch` and a stale ETag, and delete_object
with `IfMatch` and a stale ETag each answer 412 PreconditionFailed (and leave the object alone); `IfMatch`
on a missing key answers 404 NoSuchKey. But it checks the condition and stores the object in two separate
steps on a threaded server, so two writers racing for the same key can both succeed. Every write that
takes the lease is therefore read back: the writer whose ETag is not the one stored treats the lease as
held by the other. Real S3 evaluates the condition atomically, so there the read-back only confirms.
Its ETag is the MD5 of the body, so every write carries a fresh nonce to keep ETags distinct.

A lock is re-entrant per thread and owner: a thread that holds a lock and takes it again for the same owner (the
continuous mode holds the capture, change-log and current-state locks for its whole life and calls the same stage
functions the batch runs call, each of which takes its lock) gets the lease it already holds; the outermost block
releases it. Another owner in the same thread waits as another process would.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from cdc_assets.core import work_tally
from cdc_assets.core.errors import CdcUserError, unreachable_cause, unreachable_message
from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import Lakehouse, S3Store

LOCKS = f"{STATE}/locks"
POLL_SECONDS = 0.2  # between attempts while waiting; a lock changes hands this quickly at worst
RETRY_SECONDS = 0.05  # a second look even when not waiting: a read_holder probe can block one attempt
UNKNOWN = "an unknown holder"
_held_here: dict[tuple[str, str], tuple[int, Lease]] = {}  # (lakehouse, lock) -> (thread id, lease) held now
_held_mutex = threading.Lock()
RACED = "the lock changed hands while this run tried to take it"


class LockHeld(CdcUserError):
    """Another run holds the lock and did not let go within wait_seconds."""


class LockLost(CdcUserError):
    """This run's S3 lease expired and someone else may write now, so this run must stop writing."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock, written into the lock so others can tell the user whom they wait for (no secrets)."""

    owner: str
    host: str
    pid: int
    acquired_at: float

    def describe(self) -> str:
        """For messages: who, where and since when."""
        since = datetime.fromtimestamp(self.acquired_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        if self.pid <= 0:
            return f"{self.owner}, since {since} UTC"
        return f"{self.owner} on host {self.host}, pid {self.pid}, since {since} UTC"

    @staticmethod
    def now(owner: str) -> LockHolder:
        return LockHolder(owner=owner, host=socket.gethostname(), pid=os.getpid(), acquired_at=time.time())

    def to_json(self, **extra: Any) -> bytes:
        return json.dumps({**asdict(self), **extra}, sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> LockHolder | None:
        """The holder in a lock's body, or None when the body is empty or not ours to read."""
        try:
            doc = json.loads(data)
            return LockHolder(str(doc["owner"]), str(doc["host"]), int(doc["pid"]), float(doc["acquired_at"]))
        except (ValueError, TypeError, KeyError):
            return None


def run_owner(run_id: str) -> str:
    """How a lock names the Dagster run holding it."""
    return f"dagster run {run_id[:8]}"


def _unknown_holder(since: float) -> LockHolder:
    return LockHolder(owner=UNKNOWN, host="unknown", pid=0, acquired_at=since)


class Lease:
    """A held lock. Writers call check() before each commit so a run that lost its lease stops writing."""

    def __init__(self, name: str, purpose: str, holder: LockHolder) -> None:
        self.name = name
        self.purpose = purpose
        self._holder = holder
        self._lost: str | None = None

    def check(self) -> None:
        """Raise LockLost if this process no longer holds the lock (a local flock cannot be lost)."""
        if self._lost is not None:
            raise LockLost(self._lost)

    def holder(self) -> LockHolder:
        return self._holder


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts) or any(c in name for c in "\\\0\n\r"):
        raise ValueError(f"{name!r} is not a lock name: use words joined by '/', like 'capture' or 'table/s.t'.")


def _unwritable(lakehouse: Lakehouse, name: str, exc: BaseException) -> CdcUserError:
    down = unreachable_cause(exc)
    if down:  # not the bucket's permissions: the endpoint itself stayed down through every retry
        return CdcUserError(unreachable_message(str(lakehouse), lakehouse.endpoint, down))
    if isinstance(exc, ClientError):
        reason = _code(exc) or type(exc).__name__
    else:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
    return CdcUserError(
        f"Cannot write the {name} lock in the lakehouse at {lakehouse} ({reason}): fix its permissions or point "
        "CDC_LAKEHOUSE at a writable directory or bucket."
    )


def _held_message(purpose: str, blocker: LockHolder | str) -> str:
    who = blocker.describe() if isinstance(blocker, LockHolder) else blocker
    return (
        f"Another {purpose} is running ({who}): wait for it to finish, or raise CDC_LOCK_WAIT_SECONDS to let "
        "this one wait longer."
    )


def _wait(
    attempt: Callable[[], LockHolder | str | None], purpose: str, name: str, wait_seconds: float, log: Any | None
) -> None:
    """Call attempt until it returns None (acquired) or wait_seconds run out; it returns who blocks it."""
    deadline = time.monotonic() + max(wait_seconds, 0.0)
    attempts = 0
    logged = False
    while True:
        blocker = attempt()
        attempts += 1
        if blocker is None:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 and attempts >= 2:
            raise LockHeld(_held_message(purpose, blocker))
        if log is not None and not logged and remaining > 0:
            who = blocker.describe() if isinstance(blocker, LockHolder) else blocker
            log.info(f"Waiting up to {wait_seconds:g} s for the {name} lock held by another {purpose} ({who}).")
            logged = True
        time.sleep(min(POLL_SECONDS, max(remaining, RETRY_SECONDS)))


# --- local: flock -------------------------------------------------------------------------------------------


def _local_path(lakehouse: Lakehouse, name: str) -> Path:
    return lakehouse.root / LOCKS / f"{name}.lock"


def _read_local(path: Path, tries: int = 1) -> LockHolder | None:
    """The holder written in a lock file; retried because a new holder empties the file before writing it."""
    for i in range(tries):
        try:
            holder = LockHolder.from_json(path.read_bytes())
        except OSError:
            holder = None
        if holder is not None or i == tries - 1:
            return holder
        time.sleep(RETRY_SECONDS)
    return None


@contextmanager
def _local_lock(
    lakehouse: Lakehouse, name: str, purpose: str, owner: str, wait_seconds: float, log: Any | None
) -> Iterator[Lease]:
    path = _local_path(lakehouse, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise _unwritable(lakehouse, name, exc) from exc
    try:

        def attempt() -> LockHolder | str | None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_local(path) or f"its lock file {path} does not say who holds it yet"
            except OSError as exc:
                raise CdcUserError(
                    f"Cannot lock {path} ({exc.strerror or type(exc).__name__}): keep a local lakehouse on a "
                    "filesystem with file locks, or use an s3:// lakehouse."
                ) from exc
            return None

        _wait(attempt, purpose, name, wait_seconds, log)
        try:
            holder = LockHolder.now(owner)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.to_json(purpose=purpose), 0)
        except OSError as exc:
            raise _unwritable(lakehouse, name, exc) from exc
        try:
            yield Lease(name, purpose, holder)
        finally:
            try:
                os.ftruncate(fd, 0)  # while still locked, so nobody reads us as holder afterwards
            except OSError:
                pass  # the next holder overwrites it; read_holder trusts the flock, not the content
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _local_holder(lakehouse: Lakehouse, name: str) -> LockHolder | None:
    path = _local_path(lakehouse, name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None  # no lock there, or no lakehouse at all (a file on its path): whoever writes next says so
    except OSError as exc:
        raise CdcUserError(
            f"Cannot read the lock {path} ({exc.strerror}): fix the permissions of the lakehouse at {lakehouse}."
        ) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held for microseconds; acquirers retry past it
        except BlockingIOError:
            return _read_local(path, tries=5) or _unknown_holder(path.stat().st_mtime)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# --- S3: a lease object with conditional writes -------------------------------------------------------------


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _precondition_failed(exc: ClientError) -> bool:
    return _status(exc) == 412 or _code(exc) == "PreconditionFailed"


def _conflict(exc: ClientError) -> bool:
    """Another conditional write to the same key was in flight (S3 answers 409): try again."""
    return _status(exc) == 409 or _code(exc) == "ConditionalRequestConflict"


def _missing(exc: ClientError) -> bool:
    return _status(exc) == 404 or _code(exc) in ("NoSuchKey", "NotFound", "404")


def _same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')


@dataclass(frozen=True)
class _LeaseObject:
    etag: str
    holder: LockHolder | None  # None when its body cannot be read
    expires_at: float  # from the body, or its last write plus the TTL when the body cannot be read
    body: bytes = b""


class _S3:
    """One lock's object in the bucket."""

    def __init__(self, lakehouse: Lakehouse, name: str) -> None:
        assert isinstance(lakehouse.store, S3Store)
        self.lakehouse = lakehouse
        self.name = name
        self.client = lakehouse.store.client
        self.bucket = lakehouse.store.bucket
        self.key = lakehouse.store._key(f"{LOCKS}/{name}.json")

    def body(self, holder: LockHolder, purpose: str, ttl_seconds: float, expires_at: float) -> bytes:
        return holder.to_json(purpose=purpose, ttl_seconds=ttl_seconds, expires_at=expires_at, nonce=uuid.uuid4().hex)

    def put(self, body: bytes, **condition: str) -> str:
        return self.client.put_object(
            Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json", **condition
        )["ETag"]

    def read(self, default_ttl: float) -> _LeaseObject | None:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _missing(exc):
                return None
            raise _unwritable(self.lakehouse, self.name, exc) from exc
        except BotoCoreError as exc:
            raise _unwritable(self.lakehouse, self.name, exc) from exc
        data = got["Body"].read()
        holder = LockHolder.from_json(data)
        try:
            expires_at = float(json.loads(data)["expires_at"])
        except (ValueError, TypeError, KeyError):
            expires_at = got["LastModified"].timestamp() + default_ttl  # unreadable: stale once nobody rewrites it
            holder = None
        return _LeaseObject(got["ETag"], holder, expires_at, data)

    def landed(self, body: bytes, default_ttl: float) -> str | None:
        """The ETag of `body` if it is what the object holds now: a conditional write answered 412 may be
        botocore's retry of an attempt that did land (its response was lost), and every body is unique (a nonce)."""
        try:
            current = self.read(default_ttl)
        except CdcUserError:
            return None
        return current.etag if current is not None and current.body == body else None


class _S3Lease(Lease):
    """A lease renewed by a daemon thread until released; lost when someone else wrote the object."""

    def __init__(
        self, s3: _S3, purpose: str, holder: LockHolder, etag: str, expires_at: float, ttl: float, log: Any | None
    ) -> None:
        super().__init__(s3.name, purpose, holder)
        self._s3 = s3
        self._etag = etag
        self._expires_at = expires_at
        self._ttl = ttl
        self._log = log
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"lock-heartbeat-{s3.name}", daemon=True)

    def check(self) -> None:
        """Raise LockLost if the lease was taken over, or expired because renewals kept failing."""
        super().check()
        with self._mutex:
            expires_at = self._expires_at
        if time.time() > expires_at:
            at = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
            raise LockLost(
                f"This {self.purpose} could not renew its {self.name} lock before it expired at {at} UTC, so "
                "another run may have taken it over: check the connection to the lakehouse and run this again."
            )

    def _warn(self, text: str) -> None:
        if self._log is not None:
            self._log.warning(text)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            expires_at = time.time() + self._ttl
            body = self._s3.body(self._holder, self.purpose, self._ttl, expires_at)
            try:
                etag = self._s3.put(body, IfMatch=self._etag)
            except ClientError as exc:
                landed = self._s3.landed(body, self._ttl) if _precondition_failed(exc) else None
                if landed is not None:
                    etag = landed
                elif _precondition_failed(exc) or _missing(exc):
                    self._mark_lost()
                    return
                else:
                    self._warn(f"Could not renew the {self.name} lock ({_code(exc) or exc}); trying again.")
                    continue
            except BotoCoreError as exc:
                self._warn(f"Could not renew the {self.name} lock ({exc}); trying again.")
                continue
            with self._mutex:
                self._etag = etag
                self._expires_at = expires_at

    def _mark_lost(self) -> None:
        try:
            current = self._s3.read(self._ttl)
        except CdcUserError:
            current = None
        if current is not None and current.holder is not None:
            by = f"taken over by {current.holder.describe()}"
        else:
            by = "taken over or removed by another process"
        self._lost = (
            f"This {self.purpose} lost its {self.name} lock: it was {by} after it expired because this process "
            f"did not renew it within {self._ttl:g} s, so this run must stop; run it again once the other finishes."
        )
        self._warn(self._lost)

    def release(self) -> None:
        """Stop renewing, then delete the lease only if it is still ours (never someone else's)."""
        self._stop.set()
        self._thread.join(timeout=max(self._ttl, 30.0))
        if self._lost is not None:
            return
        s3 = self._s3
        try:
            head = s3.client.head_object(Bucket=s3.bucket, Key=s3.key)
            if not _same_etag(head["ETag"], self._etag):
                return  # taken over after expiry: theirs now
            try:
                s3.client.delete_object(Bucket=s3.bucket, Key=s3.key, IfMatch=self._etag)
            except ClientError as exc:
                if _status(exc) not in (400, 501) and _code(exc) not in ("NotImplemented", "InvalidArgument"):
                    raise
                s3.client.delete_object(Bucket=s3.bucket, Key=s3.key)  # no If-Match on delete: head compared it
        except ClientError as exc:
            if not (_precondition_failed(exc) or _missing(exc)):
                self._warn(f"Could not remove the {self.name} lock ({_code(exc)}); it expires in {self._ttl:g} s.")
        except BotoCoreError as exc:
            self._warn(f"Could not remove the {self.name} lock ({exc}); it expires in {self._ttl:g} s.")


@contextmanager
def _s3_lock(
    lakehouse: Lakehouse, name: str, purpose: str, owner: str, wait_seconds: float, ttl: float, log: Any | None
) -> Iterator[Lease]:
    s3 = _S3(lakehouse, name)
    won: list[tuple[LockHolder, str, float]] = []

    def write(**condition: str) -> LockHolder | str | None:
        """One conditional write, then a read-back (see the module docstring); None if the lease is ours."""
        holder = LockHolder.now(owner)
        expires_at = holder.acquired_at + ttl
        body = s3.body(holder, purpose, ttl, expires_at)
        try:
            etag = s3.put(body, **condition)
        except ClientError as exc:
            landed = s3.landed(body, ttl) if _precondition_failed(exc) else None
            if landed is not None:  # a retried write whose first attempt landed
                won.append((holder, landed, expires_at))
                return None
            if _precondition_failed(exc) or _conflict(exc) or _missing(exc):
                return RACED
            raise _unwritable(lakehouse, name, exc) from exc
        except BotoCoreError as exc:
            raise _unwritable(lakehouse, name, exc) from exc
        stored = s3.read(ttl)
        if stored is not None and _same_etag(stored.etag, etag):
            won.append((holder, etag, expires_at))
            return None
        if stored is not None and stored.holder is not None:
            return stored.holder
        return RACED

    def attempt() -> LockHolder | str | None:
        blocker: LockHolder | str | None = f"the lock object s3://{s3.bucket}/{s3.key} could not be read"
        for _ in range(3):  # a lease released or taken between our steps deserves another immediate try
            if write(IfNoneMatch="*") is None:
                return None
            current = s3.read(ttl)
            if current is None:
                continue
            if current.expires_at > time.time():
                return current.holder or f"the lock object s3://{s3.bucket}/{s3.key} could not be read"
            blocker = write(IfMatch=current.etag)
            if blocker is None:
                if log is not None:
                    who = current.holder.describe() if current.holder else UNKNOWN
                    log.info(f"Took over the {name} lock from {who}: its lease had expired.")
                return None
        return blocker

    _wait(attempt, purpose, name, wait_seconds, log)
    holder, etag, expires_at = won[-1]
    lease = _S3Lease(s3, purpose, holder, etag, expires_at, ttl, log)
    lease._thread.start()
    try:
        yield lease
    finally:
        lease.release()


def _s3_holder(lakehouse: Lakehouse, name: str) -> LockHolder | None:
    current = _S3(lakehouse, name).read(60.0)
    if current is None or current.expires_at <= time.time():
        return None
    return current.holder or _unknown_holder(current.expires_at - 60.0)


# --- the API ------------------------------------------------------------------------------------------------


@contextmanager
def lakehouse_lock(
    lakehouse: Lakehouse,
    name: str,
    purpose: str,
    owner: str,
    wait_seconds: float = 0.0,
    ttl_seconds: float | None = None,
    log: Any | None = None,
) -> Iterator[Lease]:
    """Hold the lock `name` in the lakehouse for the block, across processes, Dagster instances and machines.

    purpose names the work for messages ("capture"); owner says who runs it ("dagster run 1a2b3c4d").
    Waits up to wait_seconds, then raises LockHeld naming the holder. ttl_seconds only applies on S3: a
    lease not renewed for that long may be taken over (by default the lakehouse's CDC_LOCK_TTL_SECONDS). log (a logger or Dagster's context.log) hears once
    whom this run waits for. A block that ends normally after losing its lease raises LockLost, because
    someone else may have written at the same time.
    """
    _check_name(name)
    ttl_seconds = lakehouse.lock_ttl_seconds if ttl_seconds is None else ttl_seconds
    if ttl_seconds <= 0:
        raise ValueError(f"ttl_seconds must be positive, not {ttl_seconds}.")
    key = (str(lakehouse), name)
    with _held_mutex:
        held = _held_here.get(key)
    if held is not None and held[0] == threading.get_ident() and held[1].holder().owner == owner:
        yield held[1]  # this thread holds it already, for the same owner: the outer block releases it
        held[1].check()
        return
    if lakehouse.is_s3:
        locked = _s3_lock(lakehouse, name, purpose, owner, wait_seconds, ttl_seconds, log)
    else:
        locked = _local_lock(lakehouse, name, purpose, owner, wait_seconds, log)
    with ExitStack() as taken:
        with work_tally.timed(work_tally.LOCKS):  # taking it, waits included
            lease = taken.enter_context(locked)
        with _held_mutex:
            _held_here[key] = (threading.get_ident(), lease)
        try:
            yield lease
        finally:
            with _held_mutex:
                _held_here.pop(key, None)
        lease.check()


def read_holder(lakehouse: Lakehouse, name: str) -> LockHolder | None:
    """Who holds the lock `name` now, or None if it is free (an expired S3 lease counts as free)."""
    _check_name(name)
    return _s3_holder(lakehouse, name) if lakehouse.is_s3 else _local_holder(lakehouse, name)
