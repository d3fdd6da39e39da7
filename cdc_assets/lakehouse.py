"""The lakehouse location: objects under `raw/` and `_state/`, Delta tables under `changes/` and `current/`.

A local directory and `s3://bucket/prefix` behave the same: every object is written whole and
made visible atomically (rename locally, a single PUT on S3), so a reader never sees half a file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from cdc_assets.errors import CdcUserError

CHANGES = "changes"
CURRENT = "current"
RAW = "raw"
DELTA_LOG = "_delta_log"
STATE = "_state"


class MissingObject(KeyError):
    """An object the pipeline expected is not in the lakehouse."""


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]: ...
    def list_dirs(self, prefix: str) -> list[str]: ...
    def delete_table(self, prefix: str) -> None: ...


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

    def put(self, key: str, data: bytes) -> None:
        self._write_atomically(key, lambda f: f.write(data))

    def put_file(self, key: str, path: Path) -> None:
        """A local file's content under `key`, atomically (copied in blocks, never whole in memory)."""
        with path.open("rb") as source:
            self._write_atomically(key, lambda f: shutil.copyfileobj(source, f, 1 << 20))

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise MissingObject(key) from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]:
        base = self._path(prefix)
        if not base.exists():
            return []
        keys = sorted(
            str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )
        return keys if start_after is None else [k for k in keys if k > start_after]

    def list_dirs(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))

    def delete_table(self, prefix: str) -> None:
        """Remove a Delta table: its log first, so a crash midway leaves no table pointing at lost files."""
        base = self._path(prefix)
        shutil.rmtree(base / DELTA_LOG, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)


class S3Store:
    """Objects in a bucket under a prefix, through a boto3 S3 client (dagster-aws's S3Resource)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        """A local file's content under `key`, streamed (multipart when large); visible only when complete."""
        self.client.upload_file(str(path), self.bucket, self._key(key))

    def get(self, key: str) -> bytes:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey as exc:
            raise MissingObject(key) from exc

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

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

    def list_keys(self, prefix: str, start_after: str | None = None) -> list[str]:
        return self._list(prefix, None, start_after)[0]

    def list_dirs(self, prefix: str) -> list[str]:
        return self._list(prefix, "/")[1]

    def delete_table(self, prefix: str) -> None:
        """Remove a Delta table: its log first, so a crash midway leaves no table pointing at lost files."""
        keys = self.list_keys(prefix)
        for key in sorted(keys, key=lambda k: f"/{DELTA_LOG}/" not in k):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


@dataclass(frozen=True)
class TableRef:
    """A source table, `schema.table`."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @staticmethod
    def parse(text: str) -> TableRef:
        schema, _, table = text.partition(".")
        if not schema or not table:
            raise CdcUserError(f"'{text}' is not a table name: write it as schema.table.")
        return TableRef(schema, table)


class Lakehouse:
    """Where everything lives; `location` is a local directory or `s3://bucket/prefix`."""

    def __init__(self, location: str, s3_client: Any | None = None, lock_wait_seconds: float = 120.0) -> None:
        self.lock_wait_seconds = lock_wait_seconds  # how long a stage waits for another run of itself
        self.location = location.rstrip("/") if location.startswith("s3://") else location
        if self.is_s3:
            bucket, _, prefix = self.location[len("s3://") :].partition("/")
            if s3_client is None:
                import boto3

                s3_client = boto3.client("s3")
            self.store: ObjectStore = S3Store(s3_client, bucket, prefix)
        else:
            self.root = Path(location).resolve()
            self.store = LocalStore(self.root)

    @property
    def is_s3(self) -> bool:
        return self.location.startswith("s3://")

    def __str__(self) -> str:
        return self.location if self.is_s3 else str(self.root)

    def table_uri(self, layer: str, table: TableRef) -> str:
        if self.is_s3:
            return f"{self.location}/{layer}/{table.schema}/{table.table}"
        return str(self.root / layer / table.schema / table.table)

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs object-store options for S3, from the standard AWS environment."""
        if not self.is_s3:
            return None
        options = {"conditional_put": "etag"}
        for env, key in (
            ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL"),
            ("AWS_REGION", "AWS_REGION"),
            ("AWS_DEFAULT_REGION", "AWS_REGION"),
            ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            ("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
        ):
            if os.environ.get(env) and key not in options:
                options[key] = os.environ[env]
        if options.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    def tables(self, layer: str) -> list[TableRef]:
        """Tables that exist in a Delta layer."""
        found = []
        for schema in self.store.list_dirs(layer):
            for table in self.store.list_dirs(f"{layer}/{schema}"):
                found.append(TableRef(schema, table))
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
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise CdcUserError(
                f"Cannot write to the lakehouse at {self} ({reason}): fix its permissions or point "
                "CDC_LAKEHOUSE at a writable directory or bucket."
            ) from exc
