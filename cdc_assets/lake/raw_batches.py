"""Raw binlog batches: immutable, self-describing, made visible by a manifest written last.

    raw/<start>/changes.parquet   one row per row change, images as canonical texts
    raw/<start>/manifest.json     positions, GTIDs, every table version's columns and key,
                                  DDL statements, counts and the data file's SHA-256

`<start>` is `BinlogPosition.batch_name()` of the batch's first position, so names sort in binlog
order and a re-run after a crash writes the same name. The content holds no wall-clock time:
re-capturing the same range yields the same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_assets.core import failpoints
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.ops import TRUNCATE
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.layout import ARCHIVE, RAW
from cdc_assets.lake.store import MissingObject, ObjectStore

FORMAT_VERSION = 1
DATA_FILE = "changes.parquet"
MANIFEST_FILE = "manifest.json"

RAW_ROWS_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("schema", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("table_version", pa.int32(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("gtid", pa.string()),
        pa.field("commit_ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("before", pa.list_(pa.string())),
        pa.field("after", pa.list_(pa.string())),
    ]
)


@dataclass
class RawBatch:
    """One batch: everything between two transaction boundaries of the binlog."""

    start: BinlogPosition
    end: BinlogPosition
    data_path: Path  # the batch's rows as a local Parquet file (capture spools them there, not in memory)
    row_count: int
    shapes: dict[int, TableShape]  # the batch's table versions: version id -> the table's shape
    statements: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    transactions: int = 0
    first_seq: int = 1  # `_cdc_seq` of the batch's first change; next_seq follows its last
    next_seq: int = 1
    start_gtid: str | None = None
    end_gtid: str | None = None
    first_commit_ts: int | None = None  # epoch seconds of the first and last commit in the batch
    last_commit_ts: int | None = None
    server: dict[str, Any] = field(default_factory=dict)
    schemas: dict[str, Any] = field(default_factory=dict)  # table -> shape at the batch's end, where it changed
    # the source's shapes of `schemas` where a column policy makes them differ (capture's own state: a DDL applies to
    # the source's shape), and the column-policy rules of the tables this batch records them for (core/column_policy)
    source_schemas: dict[str, Any] | None = None
    policies: dict[str, Any] = field(default_factory=dict)
    # table -> why capture left it out from this batch on (lake/quarantine): cause, fix, first_seq, position
    quarantined: dict[str, dict[str, Any]] = field(default_factory=dict)
    keepalive: Any = None  # what keeps `data_path` on disk while the batch is in use

    @property
    def name(self) -> str:
        return self.start.batch_name()

    @property
    def rows(self) -> pa.Table:
        """All rows in memory: for checks and tests; the pipeline streams `data_path`."""
        return pq.read_table(self.data_path)

    def manifest(self, data_sha256: str, data_bytes: int) -> dict[str, Any]:
        quarantined = {"quarantined": self.quarantined} if self.quarantined else {}
        policed = {"source_schemas": self.source_schemas} if self.source_schemas else {}
        policed |= {"policies": self.policies} if self.policies else {}
        return quarantined | policed | {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "start": self.start.to_json(),
            "end": self.end.to_json(),
            "first_seq": self.first_seq,
            "next_seq": self.next_seq,
            "start_gtid": self.start_gtid,
            "end_gtid": self.end_gtid,
            "events": self.events,
            "transactions": self.transactions,
            "rows": self.row_count,
            "first_commit_ts": self.first_commit_ts,
            "last_commit_ts": self.last_commit_ts,
            "server": self.server,
            "tables": [shape.versioned_json(i) for i, shape in sorted(self.shapes.items())],
            "statements": self.statements,
            "schemas": self.schemas,
            "data_file": DATA_FILE,
            "data_sha256": data_sha256,
            "data_bytes": data_bytes,
        }


@dataclass(frozen=True)
class BatchManifest:
    """The manifest of a visible batch, parsed."""

    name: str
    start: BinlogPosition
    end: BinlogPosition
    end_gtid: str | None
    first_seq: int
    next_seq: int
    rows: int
    events: int
    transactions: int
    last_commit_ts: int | None
    shapes: dict[int, TableShape]  # version id -> shape, as RawBatch.shapes
    data_sha256: str
    data_bytes: int
    raw: dict[str, Any]

    @property
    def data_file(self) -> str:
        """The name of the batch's data file in its folder: `changes.parquet` as capture writes it; a batch
        rewritten in place (`rewrite_batch_data`: a person forgotten) names its new file, so the manifest, replaced
        atomically, switches readers from the old data to the new in one step."""
        return str(self.raw.get("data_file") or DATA_FILE)

    def truncates(self) -> list[dict[str, Any]]:
        """The batch's TRUNCATE statements, each with the `table` it empties and its `seq`."""
        return [s for s in self.raw.get("statements", []) if s.get("kind") == TRUNCATE and s.get("table")]

    def schema_changes(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(statement, change) for every table change a DDL of the batch makes (ddl.SchemaChange as JSON)."""
        return [(s, c) for s in self.raw.get("statements", []) if s.get("kind") == "ddl" for c in s.get("changes", [])]

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """The tables capture left out from this batch on, as they could not be decoded (lake/quarantine)."""
        return dict(self.raw.get("quarantined", {}))

    def tables(self) -> list[str]:
        """Every table the batch changes: row changes, TRUNCATEs and schema changes (and the tables quarantined in
        it, so the registry knows them)."""
        changed = {c["table"] for _, c in self.schema_changes()} | set(self.quarantined())
        return sorted({str(v.table) for v in self.shapes.values()} | {s["table"] for s in self.truncates()} | changed)

    @staticmethod
    def from_json(d: dict[str, Any]) -> BatchManifest:
        return BatchManifest(
            name=d["name"],
            start=BinlogPosition.from_json(d["start"]),
            end=BinlogPosition.from_json(d["end"]),
            end_gtid=d.get("end_gtid"),
            first_seq=int(d["first_seq"]),
            next_seq=int(d["next_seq"]),
            rows=int(d["rows"]),
            events=int(d["events"]),
            transactions=int(d["transactions"]),
            last_commit_ts=d.get("last_commit_ts"),
            shapes=dict(TableShape.from_versioned_json(t) for t in d["tables"]),
            data_sha256=d["data_sha256"],
            data_bytes=int(d["data_bytes"]),
            raw=d,
        )


def chain_break(previous: BatchManifest, batch: BatchManifest) -> str | None:
    """Why `batch` does not follow `previous` exactly (a gap or an overlap), or None when it does."""
    if batch.start == previous.end and batch.start.epoch == previous.end.epoch and batch.first_seq == previous.next_seq:
        return None
    if (  # a failover: the next server's first batch starts at the same GTID state, where that server has it
        batch.start.epoch == previous.end.epoch + 1
        and batch.first_seq == previous.next_seq
        and batch.raw.get("start_gtid") is not None
        and batch.raw.get("start_gtid") == previous.end_gtid
    ):
        return None
    return (
        f"{batch.name} starts at {batch.start} (seq {batch.first_seq}) but {previous.name} ends at "
        f"{previous.end} (next seq {previous.next_seq})"
    )


def chain_breaks(manifests: list[BatchManifest], previous: BatchManifest | None = None) -> list[str]:
    """Every place in consecutive batches (after `previous`, if given) where one does not follow the other."""
    breaks = []
    for manifest in manifests:
        problem = chain_break(previous, manifest) if previous is not None else None
        if problem:
            breaks.append(problem)
        previous = manifest
    return breaks


def _key(name: str, file: str) -> str:
    return f"{RAW}/{name}/{file}"


def _file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def write_batch(store: ObjectStore, batch: RawBatch) -> BatchManifest:
    """Write data, then the manifest: the batch becomes visible only when both are durable."""
    digest, size = _file_digest(batch.data_path)
    manifest = batch.manifest(digest, size)
    store.put_file(_key(batch.name, DATA_FILE), batch.data_path)
    failpoints.hit("capture.batch_data_written")
    store.put(_key(batch.name, MANIFEST_FILE), json.dumps(manifest, indent=1, sort_keys=True).encode())
    return BatchManifest.from_json(manifest)


def archive_earlier_batches(store: ObjectStore, first: str, when: float) -> list[str]:
    """Move the raw batches of an earlier lakehouse out of raw/, to archive/raw-<when, UTC>/<batch>/, and return
    their names: what a capture that starts without a checkpoint finds in raw/ (a lakehouse re-initialised after
    its checkpoint was purged keeps its raw/). Their chain is one the new one does not continue (other positions,
    a gap in seqs), so in raw/ they broke the chain check and every reader of raw batches by seq. The one
    exception is the batch this capture writes first (`first`) when it is all raw/ holds: a capture killed between
    its first batch and its first checkpoint left it, and capture adopts it (capture/run.py). Manifests go first,
    so a batch leaves raw/ at once; a crash midway leaves the rest for the next capture, which has no checkpoint
    either."""
    keys = store.list_keys(RAW)
    names = sorted({key[len(RAW) + 1 :].split("/", 1)[0] for key in keys if key.count("/") >= 2})
    if not names or names == [first]:
        return []
    folder = f"{ARCHIVE}/{RAW}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(when))}"
    for key in sorted(keys, key=lambda k: not k.endswith(f"/{MANIFEST_FILE}")):
        store.move(key, folder + key[len(RAW) :])
    return names


def archived_last_seq(store: ObjectStore) -> int:
    """The highest `_cdc_seq` of the raw batches under archive/ (0 when none): each archived chain's last batch, the
    last by name (names sort in binlog order), ends it."""
    suffix = f"/{MANIFEST_FILE}"
    last: dict[str, str] = {}  # archive folder -> the key of its last batch's manifest
    for key in store.list_keys(ARCHIVE):
        folder = key.split("/")[1] if key.count("/") == 3 else None
        if folder is not None and key.endswith(suffix):
            last[folder] = max(last.get(folder, key), key)
    seqs = [BatchManifest.from_json(json.loads(store.get(key))).next_seq - 1 for key in last.values()]
    return max(seqs, default=0)


def archived_chain_starts(store: ObjectStore) -> set[str]:
    """The name of each archived chain's first batch (names sort in binlog order): where each earlier lakehouse's
    capture began."""
    suffix = f"/{MANIFEST_FILE}"
    first: dict[str, str] = {}  # archive folder -> the name of its first batch
    for key in store.list_keys(ARCHIVE):
        parts = key.split("/")
        if len(parts) == 4 and key.endswith(suffix):
            first[parts[1]] = min(first.get(parts[1], parts[2]), parts[2])
    return set(first.values())


def batch_exists(store: ObjectStore, name: str) -> bool:
    """Whether the batch is visible (its manifest, written last, is there)."""
    return store.exists(_key(name, MANIFEST_FILE))


def list_batches(store: ObjectStore, after: str | None = None) -> list[str]:
    """Names of visible batches (those with a manifest) after `after`, in binlog order, from one listing."""
    start_after = _key(after, MANIFEST_FILE) if after else None
    suffix = f"/{MANIFEST_FILE}"
    names = (key[len(RAW) + 1 : -len(suffix)] for key in store.list_keys(RAW, start_after) if key.endswith(suffix))
    return sorted(name for name in names if "/" not in name and (after is None or name > after))


def read_manifest(store: ObjectStore, name: str) -> BatchManifest:
    try:
        raw = store.get(_key(name, MANIFEST_FILE))
    except MissingObject as exc:
        raise CdcUserError(
            f"Raw batch {name} has no manifest in the lakehouse: restore raw/{name}/ from a backup or "
            "remove the later state so the batch is captured again."
        ) from exc
    try:
        return BatchManifest.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise CdcUserError(f"Raw batch {name} has a corrupt manifest: restore raw/{name}/ from a backup.") from exc


def read_row_slices(store: ObjectStore, manifest: BatchManifest, rows_per_slice: int) -> Iterator[pa.Table]:
    """The batch's rows, checked against the manifest's digest, decoded `rows_per_slice` rows at a time."""
    data = _checked_data(store, manifest)
    for batch in pq.ParquetFile(io.BytesIO(data)).iter_batches(batch_size=rows_per_slice):
        yield pa.Table.from_batches([batch])


def read_rows(store: ObjectStore, manifest: BatchManifest) -> pa.Table:
    """The batch's rows, checked against the manifest's digest."""
    return pq.read_table(io.BytesIO(_checked_data(store, manifest)))


def _checked_data(store: ObjectStore, manifest: BatchManifest) -> bytes:
    try:
        data = store.get(_key(manifest.name, manifest.data_file))
    except MissingObject as exc:
        raise CdcUserError(
            f"Raw batch {manifest.name} is missing its data file {manifest.data_file}: restore raw/{manifest.name}/ "
            "from a backup."
        ) from exc
    if hashlib.sha256(data).hexdigest() != manifest.data_sha256:
        raise CdcUserError(
            f"Raw batch {manifest.name} is corrupt (its data does not match the manifest's SHA-256): "
            f"restore raw/{manifest.name}/ from a backup."
        )
    return data


def seq_floor_at(names: list[str], manifest_at: Callable[[int], BatchManifest], position: BinlogPosition) -> int:
    """A `_cdc_seq` every change after `position` exceeds, from the batches (names in order, read on demand):
    the batch holding `position` counts as after it. 0 before the first batch."""
    index = bisect.bisect_right(names, position.batch_name()) - 1
    if index < 0:
        return 0
    manifest = manifest_at(index)
    return manifest.next_seq - 1 if manifest.end <= position else manifest.first_seq - 1


def seq_ceiling_at(names: list[str], manifest_at: Callable[[int], BatchManifest], position: BinlogPosition) -> int:
    """A `_cdc_seq` no change at or before `position` exceeds, from the batches (names in order, read on demand):
    the end of the batch holding `position`. 0 before the first batch."""
    index = bisect.bisect_right(names, position.batch_name()) - 1
    return manifest_at(index).next_seq - 1 if index >= 0 else 0


# -- rewriting a batch in place (cdc_assets/stages/rewrite: a person forgotten, a column policy applied) ---------------


def batch_folders(store: ObjectStore) -> list[str]:
    """The folder of every visible batch, in raw/ and in archive/ (the chains of earlier lakehouses): each holds a
    manifest."""
    suffix = f"/{MANIFEST_FILE}"
    keys = [*store.list_keys(RAW), *store.list_keys(ARCHIVE)]
    return sorted(key[: -len(suffix)] for key in keys if key.endswith(suffix))


def read_folder_manifest(store: ObjectStore, folder: str) -> BatchManifest:
    """The manifest of the batch in `folder` (under raw/ or archive/)."""
    return BatchManifest.from_json(json.loads(store.get(f"{folder}/{MANIFEST_FILE}")))


def read_folder_rows(store: ObjectStore, folder: str, manifest: BatchManifest) -> pa.Table:
    """The rows of the batch in `folder`, checked against its manifest's digest."""
    data = store.get(f"{folder}/{manifest.data_file}")
    if hashlib.sha256(data).hexdigest() != manifest.data_sha256:
        raise CdcUserError(
            f"Raw batch {folder} is corrupt (its data does not match the manifest's SHA-256): restore it from a backup."
        )
    return pq.read_table(io.BytesIO(data))


def rewrite_batch_data(
    store: ObjectStore, folder: str, manifest: BatchManifest, rows: pa.Table, shapes: dict[int, TableShape] | None = None
) -> BatchManifest:
    """Replace the rows of a visible batch, keeping everything else of it: the new data under a name of its own
    (its digest's), then the manifest naming it with its new digest, size and row count (one atomic replace: readers
    see the old batch or the new, never a mix), then the old data file is deleted. Positions, seqs, GTIDs and
    statements stay as they are, so the chain and every seq of the rows kept are unchanged; `shapes` replaces some
    table versions' shapes (a column policy applied: the images' columns changed with them). A crash between the steps
    leaves a data file the manifest does not name: `remove_unnamed_data` deletes it."""
    with tempfile.TemporaryDirectory(prefix="cdc-rewrite-") as work:
        path = Path(work) / DATA_FILE
        pq.write_table(rows.cast(RAW_ROWS_SCHEMA), path, compression="zstd")
        digest, size = _file_digest(path)
        name = f"changes-{digest[:16]}.parquet"
        store.put_file(f"{folder}/{name}", path)
    failpoints.hit("rewrite.raw_data_written")
    body = dict(manifest.raw) | {"data_file": name, "data_sha256": digest, "data_bytes": size, "rows": rows.num_rows}
    if shapes:
        body["tables"] = [(shapes.get(i) or shape).versioned_json(i) for i, shape in sorted(manifest.shapes.items())]
    store.put(f"{folder}/{MANIFEST_FILE}", json.dumps(body, indent=1, sort_keys=True).encode())
    failpoints.hit("rewrite.raw_manifest_switched")
    new = BatchManifest.from_json(body)
    remove_unnamed_data(store, folder, new)
    return new


def remove_unnamed_data(store: ObjectStore, folder: str, manifest: BatchManifest) -> int:
    """Delete the data files of a batch's folder its manifest does not name (what a rewrite stopped midway left: the
    new file not yet named, or the old one no longer named); returns how many."""
    stale = [
        key for key in store.list_keys(folder)
        if key.rsplit("/", 1)[-1].endswith(".parquet") and key.rsplit("/", 1)[-1] != manifest.data_file
    ]  # fmt: skip
    for key in stale:
        store.delete(key)
    return len(stale)
