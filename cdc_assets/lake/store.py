"""The lakehouse location: objects under `raw/` and `_state/`, Delta tables under `changes/` and `current/`.

A local directory and `s3://bucket/prefix` behave the same: every object is written whole and
made visible atomically (rename locally, a single PUT on S3), so a reader never sees half a file.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from deltalake import DeltaTable

from cdc_assets.core import failpoints, work_tally
from cdc_assets.core.errors import CdcUserError, storage_faults_are_user_errors, unreachable_message, unreachable_reason
from cdc_assets.core.names import TableRef, name_of_segment
from cdc_assets.core.settings import (
    DEFAULT_CURRENT_FILE_KB,
    DEFAULT_LOCK_TTL_SECONDS,
    DEFAULT_LOCK_WAIT_SECONDS,
    LakehouseSettings,
    S3Retries,
    TableSelection,
)
from cdc_assets.lake.delta import open_table
from cdc_assets.lake.files import FileAccess
from cdc_assets.lake.layout import CURRENT, DELTA_LOG, STATE, file_digests_folder


class MissingObject(KeyError):
    """An object the pipeline expected is not in the lakehouse."""


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]: ...
    def list_dirs(self, prefix: str) -> list[str]: ...
    def has_prefix(self, prefix: str) -> bool: ...
    def remove_partial_writes(self, prefix: str) -> int: ...
    def delete_table(self, prefix: str) -> None: ...
    def delete(self, key: str) -> None: ...
    def move(self, key: str, to: str) -> None: ...


class LocalStore:
    """Objects as files under a directory; puts are write-to-temp, fsync, rename."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key

    def _write_atomically(self, key: str, write: Callable[[BinaryIO], None]) -> None:
        """Write to a temporary file, fsync it, rename it into place and fsync the directory: a reader sees
        the old object or the whole new one, and a crash after return loses neither."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @work_tally.tallied(work_tally.STATE_FILES)
    def put(self, key: str, data: bytes) -> None:
        self._write_atomically(key, lambda f: f.write(data))

    @work_tally.tallied(work_tally.STATE_FILES)
    def put_file(self, key: str, path: Path) -> None:
        """A local file's content under `key`, atomically (copied in blocks, never whole in memory)."""
        with path.open("rb") as source:
            self._write_atomically(key, lambda f: shutil.copyfileobj(source, f, 1 << 20))

    @work_tally.tallied(work_tally.STATE_FILES)
    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise MissingObject(key) from exc

    @work_tally.tallied(work_tally.STATE_FILES)
    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    @work_tally.tallied(work_tally.STATE_FILES)
    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        keys = sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )
        return keys if start_after is None else [k for k in keys if k > start_after]

    @work_tally.tallied(work_tally.STATE_FILES)
    def list_dirs(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))

    def remove_partial_writes(self, prefix: str) -> int:
        """Remove the temporary files of writes a killed process never finished under `prefix/` (only the
        holder of the lock over that prefix may call this); returns how many."""
        base = self._path(prefix)
        partial = [p for p in base.rglob(".*.tmp") if p.is_file()] if base.is_dir() else []
        for path in partial:
            path.unlink(missing_ok=True)
        return len(partial)

    @work_tally.tallied(work_tally.STATE_FILES)
    def has_prefix(self, prefix: str) -> bool:
        """Whether any object lies under `prefix/`."""
        base = self._path(prefix)
        return base.is_dir() and any(p.is_file() for p in base.rglob("*"))

    @work_tally.tallied(work_tally.STATE_FILES)
    def delete(self, key: str) -> None:
        """Remove one object (none there: nothing to do)."""
        self._path(key).unlink(missing_ok=True)

    @work_tally.tallied(work_tally.STATE_FILES)
    def move(self, key: str, to: str) -> None:
        """Put an object under another key (a rename: never copied, never in both places)."""
        target = self._path(to)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(key), target)
        for directory in {target.parent, self._path(key).parent}:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def delete_table(self, prefix: str) -> None:
        """Remove a Delta table: its log first, so a crash midway leaves no table pointing at lost files."""
        base = self._path(prefix)
        shutil.rmtree(base / DELTA_LOG, ignore_errors=True)
        failpoints.hit("current.drop_log_removed")
        shutil.rmtree(base, ignore_errors=True)


class S3Store:
    """Objects in a bucket under a prefix, through a boto3 client (the S3Resource of defs/resources.py)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @work_tally.tallied(work_tally.STATE_FILES)
    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    @work_tally.tallied(work_tally.STATE_FILES)
    def put_file(self, key: str, path: Path) -> None:
        """A local file's content under `key`, streamed (multipart when large); visible only when complete."""
        progress = (lambda _sent: failpoints.hit("capture.upload_part")) if failpoints.is_armed("capture.upload_part") else None
        self.client.upload_file(str(path), self.bucket, self._key(key), Callback=progress)

    @work_tally.tallied(work_tally.STATE_FILES)
    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey as exc:
            raise MissingObject(key) from exc

    @work_tally.tallied(work_tally.STATE_FILES)
    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata (one HEAD request: ETag, LastModified, ...), or None when there is none. Not
        tallied here: `exists` counts it as a state file's, a kept Delta table's identity as part of its update."""
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def _list(self, prefix: str, delimiter: str | None, start_after: str | None = None) -> tuple[list[str], list[str]]:
        full = self._key(prefix).rstrip("/") + "/"
        keys: list[str] = []
        dirs: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
            keys.extend(o["Key"] for o in page.get("Contents", []))
            dirs.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
        strip = len(self._key("")) if self.prefix else 0
        return sorted(k[strip:] for k in keys), sorted(d[len(full) :].rstrip("/") for d in dirs)

    @work_tally.tallied(work_tally.STATE_FILES)
    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]:
        return self._list(prefix, None, start_after)[0]

    @work_tally.tallied(work_tally.STATE_FILES)
    def list_dirs(self, prefix: str) -> list[str]:
        return self._list(prefix, "/")[1]

    def remove_partial_writes(self, prefix: str) -> int:
        """Abort multipart uploads a killed process left under `prefix/` (their parts cost storage and are never
        visible); only the holder of the lock over that prefix may call this. Returns how many."""
        full = self._key(prefix).rstrip("/") + "/"
        aborted = 0
        for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=full):
            for upload in page.get("Uploads", []):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
        return aborted

    @work_tally.tallied(work_tally.STATE_FILES)
    def has_prefix(self, prefix: str) -> bool:
        """Whether any object lies under `prefix/` (one listing of at most one key)."""
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(prefix).rstrip("/") + "/", MaxKeys=1)
        return bool(page.get("KeyCount") or page.get("Contents"))

    @work_tally.tallied(work_tally.STATE_FILES)
    def delete(self, key: str) -> None:
        """Remove one object (none there: nothing to do, as S3 answers)."""
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    @work_tally.tallied(work_tally.STATE_FILES)
    def move(self, key: str, to: str) -> None:
        """Put an object under another key: a copy on the server (multipart when large), then the delete. A crash
        between the two leaves it under both keys, never under neither."""
        self.client.copy({"Bucket": self.bucket, "Key": self._key(key)}, self.bucket, self._key(to))
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_table(self, prefix: str) -> None:
        """Remove a Delta table: its log first, so a crash midway leaves no table pointing at lost files."""
        keys = sorted(self.list_keys(prefix), key=lambda k: f"/{DELTA_LOG}/" not in k)
        for n, key in enumerate(keys):
            if n and f"/{DELTA_LOG}/" in keys[n - 1] and f"/{DELTA_LOG}/" not in key:
                failpoints.hit("current.drop_log_removed")
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


@dataclass(frozen=True)
class S3Access:
    """One S3 seen three ways, from one set of settings: a boto3 client for objects (raw batches, state, locks),
    delta-rs's object-store options for Delta tables, and (through `lake.files.FileAccess`) pyarrow's S3
    filesystem in Spark tasks; all three retry and time out as `retries` says."""

    client: Any
    storage_options: dict[str, str]
    retries: S3Retries = S3Retries()

    @staticmethod
    def of(
        client: Any,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        retries: S3Retries | None = None,
    ) -> S3Access:
        """Options that mirror the client's settings; what is not given, both take from the standard AWS
        environment and credential chain."""
        retries = retries or S3Retries()
        options = {"conditional_put": "etag", **retries.delta_options()}  # conditional puts: safe concurrent writers
        for key, value in (
            ("AWS_ENDPOINT_URL", endpoint_url),
            ("AWS_REGION", region),
            ("AWS_ACCESS_KEY_ID", access_key_id),
            ("AWS_SECRET_ACCESS_KEY", secret_access_key),
            ("AWS_SESSION_TOKEN", session_token),
        ):
            if value:
                options[key] = value
        if (endpoint_url or "").startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        return S3Access(client, options, retries)

    @property
    def endpoint(self) -> str:
        """The endpoint the clients reach, for messages."""
        return self.storage_options.get("AWS_ENDPOINT_URL") or str(getattr(self.client.meta, "endpoint_url", "S3"))

    def __repr__(self) -> str:  # never print a secret
        return f"S3Access(endpoint={self.storage_options.get('AWS_ENDPOINT_URL')!r})"


def s3_client(
    retries: S3Retries,
    endpoint_url: str | None = None,
    region: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    session_token: str | None = None,
    profile_name: str | None = None,
    use_ssl: bool = True,
    verify: str | bool | None = None,
) -> Any:
    """A boto3 S3 client that retries and times out as `retries` says."""
    import boto3  # only a lakehouse on S3 pays for it
    from botocore.config import Config

    session = boto3.session.Session(profile_name=profile_name)
    return session.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        aws_session_token=session_token,
        use_ssl=use_ssl,
        verify=verify,
        config=Config(**retries.boto_config()),  # type: ignore[arg-type]
    )


FIRST_COMMIT = f"{0:020d}.json"  # a Delta table's first log entry: another one means the table was made again


def _local_identity(uri: str) -> tuple[int, int] | None:
    """A local table's first commit file (inode, mtime), or None when there is none."""
    try:
        stat = os.stat(Path(uri) / DELTA_LOG / FIRST_COMMIT)
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _local_has_version(uri: str, version: int) -> bool:
    """Whether a local table has a commit of `version`: its log entry exists (a Delta version is made by writing
    that entry, never replaced), so a table loaded at the version before it is at its newest without one."""
    return (Path(uri) / DELTA_LOG / f"{version:020d}.json").exists()


class _KeptTables:
    """Delta tables kept open by uri: see Lakehouse.keeping_tables_open. `identity(uri)` tells the table's first
    commit apart from any other (None: no first commit, because there is no table or because a log clean-up removed
    it: such a table is not kept); `has_version(uri, v)`, where a look is cheaper than following the
    log (a local file's stat against a listing of the log), whether the table has a commit of version v."""

    def __init__(
        self,
        storage_options: dict[str, str] | None,
        identity: Callable[[str], object | None],
        has_version: Callable[[str, int], bool] | None = None,
    ) -> None:
        self.storage_options = storage_options
        self._identity = identity
        self._has_version = has_version
        self.tables: dict[str, tuple[DeltaTable, object | None]] = {}
        self.locks: dict[str, threading.Lock] = {}  # one per table: tables open in parallel, one table at a time
        self.mutex = threading.Lock()

    def forget(self, uri: str) -> None:
        with self.mutex:
            self.tables.pop(uri, None)

    def open(self, uri: str) -> DeltaTable | None:
        with self.mutex:
            lock = self.locks.setdefault(uri, threading.Lock())
        with lock:
            kept = self.tables.get(uri)
            if kept is not None:
                table, identity = kept
                began = time.perf_counter()
                try:
                    if self._identity(uri) == identity:
                        if self._has_version is None or self._has_version(uri, table.version() + 1):
                            table.update_incremental()  # else nothing was committed since: it is at its newest
                        work_tally.count(work_tally.DELTA_UPDATES, time.perf_counter() - began)
                        return table
                except Exception:  # noqa: BLE001 (the log changed under it: opened afresh below)
                    pass
                self.tables.pop(uri, None)
            identity = self._identity(uri)
            table = open_table(uri, self.storage_options)
            if table is not None and identity is not None:  # a log cleaned of its first entry: nothing to tell a
                self.tables[uri] = (table, identity)  # table made again (or removed) by, so it is opened afresh
            return table


class Lakehouse:
    """Where everything lives; `location` is a local directory or `s3://bucket/prefix`. It carries the lakehouse's
    settings the stages use (core.settings.LakehouseSettings, through `lakehouse_from`): the stages take them from
    the lakehouse they are given, never from the environment."""

    def __init__(
        self,
        location: str,
        s3: S3Access | None = None,
        lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
        lock_ttl_seconds: float = DEFAULT_LOCK_TTL_SECONDS,
        history: TableSelection | None = None,
        soft_deletes: TableSelection | None = None,
        current_file_kb: float = DEFAULT_CURRENT_FILE_KB,
    ) -> None:
        self.lock_wait_seconds = lock_wait_seconds  # how long a stage waits for another run of itself
        self.lock_ttl_seconds = lock_ttl_seconds  # on S3: how long a killed run's lease blocks the next run
        self.history = history or TableSelection()  # CDC_HISTORY_TABLES: tables whose SCD2 history is kept
        self.soft_deletes = soft_deletes or TableSelection()  # CDC_SOFT_DELETES: deleted rows stay, flagged
        # CDC_CURRENT_FILE_KB: the size of current state's key-range files (stages/current/rows.py)
        self.current_piece_bytes = int(current_file_kb * 1024)
        self.location = location.rstrip("/") if location.startswith("s3://") else location
        if self.is_s3:
            if s3 is None:
                raise ValueError(f"{location} is on S3: give the lakehouse its S3Access (client and storage options)")
            bucket, _, prefix = self.location[len("s3://") :].partition("/")
            self.s3 = s3
            self.store: ObjectStore = S3Store(s3.client, bucket, prefix)
        else:
            self.root = Path(location).resolve()
            if self.root.exists() and not self.root.is_dir():
                raise CdcUserError(
                    f"CDC_LAKEHOUSE={location} is a file, not a directory: point it at a directory (it is created "
                    "if missing) or at s3://bucket/prefix."
                )
            self.store = LocalStore(self.root)

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    def __str__(self) -> str:
        return self.location if self.is_s3 else str(self.root)

    def table_key(self, layer: str, table: TableRef) -> str:
        """The table's directory under a Delta layer, relative to the lakehouse: `<layer>/<schema>/<table>`
        with each name as one safe path segment (see cdc_assets.core.names)."""
        key = f"{layer}/{table.path}"
        parts = key.split("/")
        if len(parts) != 3 or any(p in ("", ".", "..") for p in parts):  # names.path_segment rules this out
            raise ValueError(f"{table!r} does not map to a directory of its own under {layer}/")
        return key

    def table_uri(self, layer: str, table: TableRef) -> str:
        if self.is_s3:
            return f"{self.location}/{self.table_key(layer, table)}"
        return str(self.root / self.table_key(layer, table))

    def open(self, layer: str, table: TableRef) -> DeltaTable | None:
        """A table of a Delta layer at its newest version, or None when it does not exist."""
        uri = self.table_uri(layer, table)
        kept = getattr(self, "_kept", None)
        return open_table(uri, self.storage_options()) if kept is None else kept.open(uri)

    @property
    def keeps_tables_open(self) -> bool:
        """Whether this is a copy `keeping_tables_open` made (its opens keep each table open)."""
        return getattr(self, "_kept", None) is not None

    @contextmanager
    def keeping_tables_open(self) -> Iterator[Lakehouse]:
        """A copy of this lakehouse whose `open` keeps each Delta table open for the block and brings it to the
        newest version with `update_incremental` (only the commits since), instead of reading its log again each
        time: the continuous mode's follower (the pipeline's driver run for ever) opens the same tables every cycle,
        and a run's change-log and current-state steps open each table several times (pipeline.driver). A table made
        again since (its first commit's file is not the one seen, by inode and mtime, or on S3 by ETag and time: one
        HEAD request) or whose log cannot be followed is opened afresh. Other writers' commits are read like the
        pipeline's own. A local table whose next version's log entry does not exist is at its newest as it is: one
        stat instead of a listing of its log (a run's steps open each table about ten times, and mostly nothing was
        committed since, or only through the very object kept, which the commit moved).

        Only this copy keeps tables open (another thread's opens through `self` are unaffected). The DeltaTable a
        caller holds moves to the newest version when the same table is opened again through the copy: its writers
        hold the pipeline's write locks, so only a writer that ignores them commits in between, and its readers (a
        run's checks after its writes) are done with a table before they open it again."""
        yield self.with_tables_kept_open()

    def with_tables_kept_open(self) -> Lakehouse:
        """The copy `keeping_tables_open` yields, for a caller that keeps it as long as it lives (the continuous
        op's thread, recording each cycle's table metadata). One thread (and its pool) per copy."""
        kept = copy.copy(self)
        if self.is_s3:  # following the log is one listing, as a look at the next version's entry would be
            kept._kept = _KeptTables(self.storage_options(), self._s3_identity)
        else:
            kept._kept = _KeptTables(self.storage_options(), _local_identity, _local_has_version)
        return kept

    def _s3_identity(self, uri: str) -> tuple[str, str] | None:
        """An S3 table's first commit object (ETag, last modified: one HEAD request), or None when there is none."""
        assert isinstance(self.store, S3Store)
        head = self.store.head(f"{uri[len(self.location) + 1 :]}/{DELTA_LOG}/{FIRST_COMMIT}")
        return None if head is None else (str(head.get("ETag")), str(head.get("LastModified")))

    def file_access(self) -> FileAccess:
        """How a Spark task reaches this lakehouse's files (picklable; holds the S3 credentials)."""
        location = self.location if self.is_s3 else str(self.root)
        retries = self.s3.retries if self.is_s3 else S3Retries()
        return FileAccess(location, tuple(sorted((self.storage_options() or {}).items())), retries)

    def has_table(self, layer: str, table: TableRef) -> bool:
        """Whether the table's Delta log exists (without opening the table)."""
        return self.store.has_prefix(f"{self.table_key(layer, table)}/{DELTA_LOG}")

    def delete_table(self, layer: str, table: TableRef) -> None:
        """Remove one table's Delta table (its log first) and, of a current state, its kept file digests; never
        anything beside them."""
        kept = getattr(self, "_kept", None)
        if kept is not None:
            kept.forget(self.table_uri(layer, table))
        if layer == CURRENT:  # first the digest rows a repair kept of its files (lake/file_digests.py)
            for key in self.store.list_keys(file_digests_folder(table.path)):
                self.store.delete(key)  # objects, not a Delta table: delete_table's crash points are the table's
        self.store.delete_table(self.table_key(layer, table))

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs object-store options: those of the S3 the boto3 client reaches (None for a directory)."""
        return dict(self.s3.storage_options) if self.is_s3 else None

    @property
    def endpoint(self) -> str | None:
        """The S3 endpoint, for messages (None for a directory)."""
        return self.s3.endpoint if self.is_s3 else None

    def faults_are_user_errors(self) -> AbstractContextManager[None]:
        """Within it, a full disk or an S3 endpoint that stays down through every retry ends in one sentence."""
        return storage_faults_are_user_errors(str(self), self.endpoint)

    def tables(self, layer: str) -> list[TableRef]:
        """Tables that exist in a Delta layer."""
        found = []
        for schema in self.store.list_dirs(layer):
            for table in self.store.list_dirs(f"{layer}/{schema}"):
                found.append(TableRef(name_of_segment(schema), name_of_segment(table)))
        return found

    def check_writable(self) -> None:
        """Fail early, with the fix, when the lakehouse cannot be written."""
        key = f"{STATE}/.write-probe-{uuid.uuid4().hex}"
        try:
            self.store.put(key, b"ok")
            if isinstance(self.store, LocalStore):
                (self.store.root / key).unlink()
            else:
                assert isinstance(self.store, S3Store)
                self.store.client.delete_object(Bucket=self.store.bucket, Key=self.store._key(key))
        except CdcUserError:
            raise
        except Exception as exc:  # any storage failure is the user's to fix, with this sentence
            down = unreachable_reason({c.__name__ for c in type(exc).__mro__}, str(exc))
            if down:
                raise CdcUserError(unreachable_message(str(self), self.endpoint, down)) from exc
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise CdcUserError(
                f"Cannot write to the lakehouse at {self} ({reason}): fix its permissions or point "
                "CDC_LAKEHOUSE at a writable directory or bucket."
            ) from exc


def lakehouse_from(settings: LakehouseSettings, s3: S3Access | None = None) -> Lakehouse:
    """The lakehouse of its settings (`s3`: the client and storage options of an s3:// one, made by the resources)."""
    return Lakehouse(
        settings.location,
        s3,
        settings.lock_wait_seconds,
        settings.lock_ttl_seconds,
        settings.history,
        settings.soft_deletes,
        settings.current_file_kb,
    )
