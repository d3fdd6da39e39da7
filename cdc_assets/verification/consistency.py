"""Current state against the source at one consistent point, without false differences while the source writes.

A current-state table holds its source table as of its applied `_cdc_seq` A; a consistent read snapshot of the
source holds it as of a binlog position S. Between the two lie the changes "in flight": captured after A (raw
batches) or not captured yet (the binlog from the checkpoint to S). Every key such a change touches, before or
after it, is left out on both sides; every other row must be equal, which is proved by row counts, an
order-independent checksum per side and the row-for-row comparison of `verify`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from deltalake import DeltaTable

from cdc_assets.capture import failover
from cdc_assets.capture.event_loop import CaptureOptions, capture_batches
from cdc_assets.capture.statement_scope import changed_tables
from cdc_assets.core import failpoints
from cdc_assets.core.arrow import release_unused_memory
from cdc_assets.core.column_policy import ColumnPolicy, clear_left_sentence
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import ColumnSpec, arrow_schema, arrow_type, decode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import CREATE, TRUNCATE, UNLOGGED_ROWS
from cdc_assets.core.parallel import TABLE_WORKERS, for_each_table
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.progress import COMPARE, Update
from cdc_assets.core.progress import report as report_progress
from cdc_assets.core.settings import MAX_SERVER_ID, SourceSettings, TableFilter
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import APPLIED_SEQ_KEY, max_seq, read_query, row_count
from cdc_assets.lake.files import read_table_chunks
from cdc_assets.lake.layout import CURRENT, CURRENT_STAGE
from cdc_assets.lake.raw_batches import (
    RAW_ROWS_SCHEMA,
    BatchManifest,
    list_batches,
    read_manifest,
    read_rows,
    seq_floor_at,
)
from cdc_assets.lake.repair_marks import RepairMark, load_mark
from cdc_assets.lake.state import Checkpoint, known_tables, load_checkpoint, load_policy_record, load_progress
from cdc_assets.lake.store import Lakehouse, ObjectStore
from cdc_assets.source import server as source
from cdc_assets.source.rows import (
    count_many_source_rows,
    count_source_rows,
    read_source_chunks,
    read_source_rows_with_keys,
    read_source_table,
    source_row_estimates,
    source_shapes,
)
from cdc_assets.stages.current.apply import current_expected
from cdc_assets.stages.current.rows import DELETED_COLUMN, live_rows, live_rows_sql
from cdc_assets.verification import buckets as bucketed
from cdc_assets.verification.compare import TableDiff, align_current, compare_tables, tables_to_verify
from cdc_assets.verification.key_rows import keys_table, lake_rows_with_keys, with_keys
from cdc_assets.verification.row_hashes import EMPTY_CHECKSUM, checksum_text, content_checksum

# A table changed by DDL after the snapshot began: "Table definition has changed, please retry transaction"
# (1412), a column or the table itself gone meanwhile (1054, 1146).
DEFINITION_CHANGED_ERRORS = (1412, 1054, 1146)
SEQ_NONE = 0  # "after seq 0": every captured change of a table without an applied seq is in flight
RECOMPARE_AFTER_SECONDS = 0.5  # a lock-free point's differing tables are compared again after this (see compare_many)
EVERY_ROW = "every row"
CHANGED_KEYS = "changed keys"

# Which keys of a table to compare (None: every row), given the current-state table opened inside the consistent
# snapshot, its applied seq and the source's shape: how the equality check after an apply narrows a comparison
# to the keys the apply changed (verification/changed_keys.py).
Narrowing = Callable[[TableRef, DeltaTable, int | None, TableShape], set[tuple[Any, ...]] | None]


def _without_keys(rows: pa.Table, key_names: list[str], keys: set[tuple[Any, ...]]) -> pa.Table:
    """The rows whose key is not among `keys` (the keys changed in flight)."""
    if not keys or not rows.num_rows:
        return rows
    key_values = zip(*(rows.column(n).to_pylist() for n in key_names), strict=True)
    return rows.filter(pa.array([k not in keys for k in key_values], pa.bool_()))


@dataclass
class ConsistentComparison:
    """A current-state table compared with its source at one consistent point, in-flight keys left out."""

    table: TableRef
    position: str  # the source snapshot's binlog position (str(BinlogPosition))
    applied_seq: int | None  # current-state table's applied _cdc_seq that was compared
    source_rows: int  # rows in the source snapshot
    lakehouse_rows: int
    compared_rows: int  # source rows compared after leaving out keys changed in flight
    in_flight_keys: int  # distinct keys changed after applied_seq up to the snapshot (left out on both sides)
    source_checksum: str  # order-independent checksum over the compared rows (hex), same algorithm both sides
    lakehouse_checksum: str
    diff: TableDiff  # (verification/compare.py) computed over the compared rows only
    not_compared: str | None = None  # why no row could be compared now (a TRUNCATE or DDL of the table in flight)
    buckets: int = 0  # how many buckets the table was compared in, streamed (0: read whole; see verification/buckets.py)
    scope: str = EVERY_ROW  # or CHANGED_KEYS: only the rows of `changed_keys` keys were read and compared
    changed_keys: int = 0  # keys changed since the table was last found equal (scope CHANGED_KEYS)
    files_read: int = 0  # current-state files read for them (scope CHANGED_KEYS)
    counts_differ: bool = False  # total row counts disagree beyond what is in flight (scope CHANGED_KEYS)
    # False: the source's rows were not counted (a repair's comparison of some keys' rows: it writes from those rows,
    # and the check after its apply counts), so the comparison is never equal
    counted: bool = True
    lake_version: int | None = None  # the current-state table's Delta version that was compared
    checked_seq: int | None = None  # every change up to this seq is in the rows compared (in-flight keys: after it)
    dropped_seq: int | None = None  # the table was dropped from the source at this seq and its current state removed
    # the rows compared, when a repair asked for them: the source's and the lakehouse's (source columns), in-flight
    # keys left out on both sides
    rows: tuple[pa.Table, pa.Table] | None = field(default=None, repr=False)
    # clear values found in columns a policy covers since they were captured (allowed for, and said: core/column_policy)
    clear_left: str | None = None

    @property
    def equal(self) -> bool:
        """Nothing compared differs (true too when nothing could be compared: see `ok`)."""
        return self.diff.ok and self.source_checksum == self.lakehouse_checksum and not self.counts_differ and self.counted

    @property
    def ok(self) -> bool:
        """Compared, and equal: a table that could not be compared is never ok."""
        return self.not_compared is None and self.equal

    @property
    def differs(self) -> bool:
        return self.not_compared is None and not self.equal

    @property
    def status(self) -> str:
        return "not compared" if self.not_compared else ("ok" if self.ok else "differs")

    def describe(self) -> str:
        """One line of what was found; a table still holding clear values a policy added later covers says so first."""
        return f"{self.clear_left}. {self._described()}" if self.clear_left else self._described()

    def _described(self) -> str:
        left_out = f"{self.in_flight_keys} keys changed in flight left out" if self.in_flight_keys else ""
        if self.not_compared:
            return f"{self.table}: not compared at {self.position}: {self.not_compared}"
        if self.ok and self.dropped_seq is not None and not self.source_rows and not self.lakehouse_rows:
            return f"{self.table}: dropped from the source (_cdc_seq {self.dropped_seq}) and from the lakehouse, at {self.position}"
        if self.ok and self.scope == CHANGED_KEYS and not self.changed_keys:
            return f"{self.table}: no key changed since it was last found equal, and the row counts agree ({self.source_rows} in the source) at {self.position}"
        if self.ok:
            tail = f"; {left_out}" if left_out else ""
            if self.scope == CHANGED_KEYS:
                matched = (
                    f"the rows of the {self.changed_keys} keys changed since it was last found equal match "
                    f"({self.compared_rows} rows; {self.source_rows} in the source) at {self.position}"
                )
            else:
                matched = f"{self.compared_rows} rows match at {self.position} (checksum {self.source_checksum})"
            return f"{self.table}: {matched}{tail}"
        text = self.diff.describe()
        if not self.counted and self.diff.ok:
            text = f"{self.table}: the rows of {self.compared_rows} keys match; the source's rows were not counted"
        elif self.counts_differ and self.diff.ok:
            text = f"{self.table}: source {self.source_rows} rows, lakehouse {self.lakehouse_rows} rows"
        elif self.diff.ok:  # equal keys and values, yet the checksums differ: a value whose repr differs
            text = f"{self.table}: checksums differ over {self.compared_rows} rows"
        else:
            text += f"; checksums {self.source_checksum} / {self.lakehouse_checksum}"
        fix = "" if self.diff.schema_problem else f"; `cdc-lakehouse repair {self.table}` rewrites the rows that differ"
        return f"{text} (at {self.position}" + (f"; {left_out}" if left_out else "") + f"){fix}"


@dataclass
class _Target:
    """One table under comparison: what is in flight for it, and the keys found in flight so far."""

    table: TableRef
    shape: TableShape | None  # the source's shape in the snapshot as the lakehouse keeps it (None: no such table)
    applied_seq: int | None
    current: DeltaTable | None
    after_seq: int = SEQ_NONE  # changes with a larger `_cdc_seq` are in flight
    # the last raw batch the current-state stage has taken in for it (lake/state.TableProgress, read before the
    # table was opened, so the rows compared hold all of it), and the first batch after it that holds a change of it
    progress_batch: str | None = None
    behind_from: str | None = None
    released_seq: int = SEQ_NONE  # statements up to this seq are applied, or hold nothing the stage has to apply
    release_cap: int | None = None  # never past this seq: statements after the source snapshot's point are in flight
    keys: set[tuple[Any, ...]] = field(default_factory=set)
    not_compared: str | None = None
    missing: str | None = None  # why the lakehouse should have a current-state table it does not have
    dropped_seq: int | None = None  # its current state was removed by the DROP of this seq (applied)
    unsettled: tuple[int, str] | None = None  # the last change in flight not made row by row: its seq, and why
    created_seq: int | None = None  # the last plain CREATE of the table in flight
    large_rows: int = 0  # more rows than LARGE_TABLE_ROWS on some side: how many (compared in buckets); else 0
    only: set[tuple[Any, ...]] | None = None  # compare only these keys' rows (None: every row)
    source_count: int | None = None  # its source rows, counted with the other tables' (None: counted on its own)
    lakehouse: Lakehouse | None = None  # where its current state's files are (a large table's are read file by file)
    keep_rows: bool = False  # keep the rows compared on the result (a repair writes from them)
    # a statement changed its rows without row events, and no repair has made up for it: why (it differs); a repair
    # comparing the table leaves this None and compares its rows
    owes_repair: str | None = None
    mark: RepairMark | None = None  # the table's repair mark (None: a repair's own comparison, which ignores them)
    # the source's own shape, read through `policy` (core/column_policy): the source's values as the lakehouse holds them
    source: TableShape | None = None
    policy: ColumnPolicy = field(default_factory=ColumnPolicy)
    added: dict[str, str] = field(default_factory=dict)  # columns policed since they were captured (until the rewrite)
    clear_found: int = 0  # clear values of `added` columns met in the lakehouse's rows

    @property
    def statements_after(self) -> int:
        """Statements with a larger `_cdc_seq` are in flight."""
        return max(self.after_seq, self.released_seq)

    def take_in(self, manifest: BatchManifest, changed: Collection[str]) -> None:
        """Release the statements of `manifest`, a raw batch read in order whose `changed` tables are its
        `tables()`, when the current-state stage has taken in all it holds for this table: the batch is within the
        stage's progress for it, or neither it nor a batch between holds a change of it (its rows, a TRUNCATE, a
        schema change). A statement that changes the table in a way capture does not record (one it could not read)
        then has nothing left to be applied."""
        taken = self.progress_batch is not None and manifest.name <= self.progress_batch
        if self.behind_from is not None or not (taken or str(self.table) not in changed):
            self.behind_from = self.behind_from or manifest.name
            return
        through = manifest.next_seq - 1 if self.release_cap is None else min(manifest.next_seq - 1, self.release_cap)
        self.released_seq = max(self.released_seq, through)

    def settled(self, rows: pa.Table) -> pa.Table:
        """Lakehouse rows with the clear values a policy added later left in them policed, counted."""
        if not self.added:
            return rows
        rows, found = self.policy.settle_clear(self.added, rows)
        self.clear_found += found
        return rows

    @property
    def source_columns(self) -> list[ColumnSpec]:
        return list(self.source.columns) if self.source else self.columns

    def policed(self, rows: pa.Table) -> pa.Table:
        """Source rows (of `source_columns`) as the lakehouse holds them."""
        return self.policy.lake_rows(self.source, rows) if self.source is not None else rows

    @property
    def columns(self) -> list[ColumnSpec]:
        return list(self.shape.columns) if self.shape else []

    @property
    def key(self) -> list[str]:
        """The source's primary key (empty: the whole row is the key)."""
        return list(self.shape.primary_key) if self.shape else []

    @property
    def key_names(self) -> list[str]:
        return self.key or [c.name for c in self.columns]

    def key_types(self) -> list[pa.DataType]:
        by_name = {c.name: c for c in self.columns}
        return [arrow_type(by_name[n]) for n in self.key_names]


def verify_server_id(reader_id: int, source_id: int) -> int:
    """Replica id for verify's own binlog reading: not the pipeline's, so a running sync keeps its stream."""
    candidate = reader_id
    while candidate in (reader_id, source_id, 0):
        candidate = candidate % MAX_SERVER_ID + 1
    return candidate


def _literal_glob(name: str) -> str:
    """A TableFilter glob matching exactly `name`."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _image_keys(rows: pa.Table, version: TableShape, target: _Target) -> set[tuple[Any, ...]] | None:
    """Keys in the before- and after-images of one table version's changes, typed like the source's (None: the
    version lacks a key column or its types do not convert, i.e. the table's shape changed)."""
    by_name = {c.name: (i, c) for i, c in enumerate(version.columns)}
    names = target.key_names
    if not names or any(n not in by_name for n in names):
        return None
    keys: set[tuple[Any, ...]] = set()
    for image in ("before", "after"):
        images = rows.column(image).combine_chunks() if rows.num_rows else pa.array([], rows.schema.field(image).type)
        images = images.filter(pc.is_valid(images))
        if not len(images):
            continue
        values = []
        for name, target_type in zip(names, target.key_types(), strict=True):
            index, column = by_name[name]
            try:
                values.append(decode_column(column, pc.list_element(images, index)).cast(target_type).to_pylist())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                return None
        keys.update(zip(*values, strict=True))
    return keys


def _statement_effect(statement: dict[str, Any], table: TableRef) -> str | None:
    """What a recorded DDL or TRUNCATE does to `table` other than row by row: "create" (a plain CREATE TABLE:
    every row it gets later is a row change in flight), "unsettles" (its rows or columns change without row events,
    or it goes), "unlogged" (rows changed without row events: a repair makes up for them), or None.

    A TRUNCATE names its table and a parsed DDL its table changes, exactly; any other statement counts only when its
    tokens say it may change the table's rows or columns (capture/statement_scope.py: a foreign key referencing the
    table, a routine naming it, REPAIR TABLE do not), or, when they do not tell, when the table's name appears in it."""
    mine = str(table)
    if statement.get("kind") == TRUNCATE and statement.get("table"):
        return "unsettles" if statement["table"] == mine else None
    changes = statement.get("changes")
    if changes:
        effect = None
        for c in changes:
            if mine in (c.get("renamed_from"), c.get("renamed_to")):
                return "unsettles"
            if c["table"] == mine and c["action"] in UNLOGGED_ROWS:
                effect = effect or "unlogged"
            elif c["table"] == mine:
                effect = "create" if c["action"] == CREATE and not c.get("renamed_from") else "unsettles"
        return effect
    query = str(statement.get("query") or "")
    schema = statement.get("schema")
    scope = changed_tables(query, schema)
    name = r"`?" + re.escape(table.table) + r"`?(?![\w$`])"
    if scope is None:  # a statement its tokens do not tell about: it counts when it names the table
        if not re.search(r"(?<![\w$])" + name, query, re.IGNORECASE):
            return None
        if schema and schema != table.schema and table.schema.lower() not in query.lower():
            return None
    elif not scope.covers(table):
        return None
    creates = r"^\s*CREATE\s+(TEMPORARY\s+)?TABLE\s+(IF\s+NOT\s+EXISTS\s+)?(`?" + re.escape(table.schema) + r"`?\.)?"
    return "create" if re.match(creates + name, query, re.IGNORECASE) else "unsettles"


def _statement_text(query: str, most: int = 80) -> str:
    """A statement as a sentence quotes it: on one line, cut at `most` characters."""
    text = " ".join(query.split())
    return text if len(text) <= most else text[: most - 1] + "…"


def _collect(
    rows: pa.Table,
    versions: dict[int, TableShape],
    statements: list[dict[str, Any]],
    targets: list[_Target],
    captured: bool = True,
) -> None:
    """Add the in-flight keys and statements of one batch (raw, or read from the binlog now: not `captured`) to the
    targets. Whether a table can be compared is settled once every batch is in (`_settle`)."""
    waits = "is not applied yet" if captured else "is in flight, not captured yet"
    for target in targets:
        for statement in statements:
            seq = int(statement["seq"])
            effect = _statement_effect(statement, target.table) if seq > target.statements_after else None
            if effect == "create":
                target.created_seq = seq
            elif effect == "unlogged":  # rows changed without row events: only a repair makes up for them
                if target.mark is not None and not target.mark.settled(seq):
                    target.owes_repair = (
                        f"a statement at _cdc_seq {seq} changed its rows without row events ({statement['query'][:80]!r}): "
                        f"the next `cdc-lakehouse sync` repairs it, as `cdc-lakehouse repair {target.table}` does"
                    )
            elif effect == "unsettles":
                kind = statement.get("kind", "ddl")
                text = _statement_text(str(statement.get("query") or ""))
                target.unsettled = (
                    seq, f"a {kind} of the table at _cdc_seq {seq} (`{text}`) {waits}; the next sync applies it"
                )  # fmt: skip
        if not rows.num_rows:
            continue
        mine = rows.filter(
            pc.and_(
                pc.and_(
                    pc.equal(rows.column("schema"), target.table.schema),
                    pc.equal(rows.column("table"), target.table.table),
                ),
                pc.greater(rows.column("seq"), pa.scalar(target.after_seq, pa.int64())),
            )
        )
        for version_id in pc.unique(mine.column("table_version")).to_pylist():
            part = mine.filter(pc.equal(mine.column("table_version"), version_id))
            keys = _image_keys(part, versions[version_id], target)
            if keys is None:
                last = int(pc.max(part.column("seq")).as_py())
                reason = (
                    f"it changed in flight (up to _cdc_seq {last}) and is gone from the source"
                    if not target.columns
                    else f"its changes in flight up to _cdc_seq {last} have other columns or another key than the "
                    "source now; the next sync applies them"
                )
                target.unsettled = (last, reason)
                continue
            target.keys |= keys


def _settle(targets: list[_Target]) -> None:
    """A table is not compared when something in flight changed it other than row by row, unless a plain
    CREATE of it came later: all its rows then come from row changes in flight, left out on both sides."""
    for target in targets:
        if target.unsettled is not None and (target.created_seq is None or target.unsettled[0] > target.created_seq):
            target.not_compared = target.unsettled[1]


class _Manifests:
    """Manifests of visible batches, read once each (they are immutable)."""

    def __init__(self, store: ObjectStore, names: list[str]) -> None:
        self.store = store
        self.names = names
        self._read: dict[str, BatchManifest] = {}

    def __getitem__(self, index: int) -> BatchManifest:
        name = self.names[index]
        if name not in self._read:
            self._read[name] = read_manifest(self.store, name)
        return self._read[name]

    def first_after(self, seq: int) -> int:
        """Index of the first batch holding a `_cdc_seq` above `seq` (seqs grow with batch names)."""
        low, high = 0, len(self.names)
        while low < high:
            middle = (low + high) // 2
            if self[middle].next_seq - 1 > seq:
                high = middle
            else:
                low = middle + 1
        return low

    def seq_floor_at(self, position: BinlogPosition) -> int:
        """A seq that every change after `position` exceeds: the batch holding `position` counts as after it."""
        return seq_floor_at(self.names, self.__getitem__, position)


def _scan_raw_batches(store: ObjectStore, manifests: _Manifests, targets: list[_Target]) -> None:
    """In-flight keys from raw batches past each table's applied seq; rows only of batches that list the table."""
    if not targets:
        return
    for index in range(manifests.first_after(min(t.after_seq for t in targets)), len(manifests.names)):
        manifest = manifests[index]
        wanted = [t for t in targets if manifest.next_seq - 1 > t.after_seq]
        changed = set(manifest.tables())
        for target in wanted:
            target.take_in(manifest, changed)
        listed = {v.table for v in manifest.shapes.values()} & {t.table for t in wanted}
        rows = read_rows(store, manifest) if listed else RAW_ROWS_SCHEMA.empty_table()
        _collect(rows, manifest.shapes, manifest.raw.get("statements", []), wanted)


def _scan_binlog(
    settings: SourceSettings,
    conn: pymysql.Connection,
    server: source.ServerInfo,
    checkpoint: Checkpoint,
    position: BinlogPosition,
    targets: list[_Target],
) -> None:
    """In-flight keys from the binlog between the checkpoint and the snapshot, read in memory (nothing written)."""
    base = settings.table_filter
    captured = [t for t in targets if base.matches(t.table.schema, t.table.table)]
    if not captured or not checkpoint.position < position:
        return
    source.check_available(conn, checkpoint.position)
    only = TableFilter(tuple(_literal_glob(str(t.table)) for t in captured), base.exclude)
    policy = targets[0].policy if targets else ColumnPolicy()  # keys in flight as the lakehouse holds them
    options = CaptureOptions(
        only, verify_server_id(settings.server_id, server.server_id), settings.max_batch_rows, policy=policy
    )
    for batch in capture_batches(
        settings.url, server, checkpoint.position, checkpoint.gtid, checkpoint.next_seq, position, options, hold_for_xa=False
    ):  # every transaction committed by now is in flight, also those after an XA PREPARE not yet decided
        _collect(batch.rows, batch.shapes, batch.statements, captured, captured=False)


def open_current(lakehouse: Lakehouse, table: TableRef) -> tuple[DeltaTable | None, int | None]:
    """The current-state table (one object) and an applied seq its rows hold at least.

    delta-rs reads commit history from the newest commit even on a table loaded at an older version, so the
    seq could be newer than the loaded rows; moving the object to the newest version after reading the seq
    makes the rows at least as new. Applied seqs only grow, so the seq never overstates what the rows hold.
    """
    current = lakehouse.open(CURRENT, table)
    if current is None:
        return None, None
    applied = max_seq(current, APPLIED_SEQ_KEY)
    current.update_incremental()
    return current, applied


def _absence(lakehouse: Lakehouse, target: _Target) -> tuple[str | None, int | None]:
    """For a table without current state: why it should have one (see stages.current.apply.current_expected), or
    None; and the seq of the applied DROP that removed it, if one did (changes up to it are not in flight)."""
    progress = load_progress(lakehouse.store, CURRENT_STAGE, str(target.table))
    if not current_expected(lakehouse, target.table, progress):
        return None, progress.dropped_seq if progress.present is False else None
    fix = (
        f"`cdc-lakehouse snapshot {target.table}` loads it again"
        if progress.snapshot_seq is not None
        else "`cdc-lakehouse sync` rebuilds it from its change log"
    )
    where = lakehouse.table_key(CURRENT, target.table)
    return f"its current-state table {where} is missing from the lakehouse (removed by hand?): {fix}", None


def _refuse_unknown(lakehouse: Lakehouse, targets: list[_Target]) -> None:
    """A table asked for that neither the source nor the lakehouse has is a mistyped name, not an equal table."""
    known = set(known_tables(lakehouse.store))
    unknown = [t.table for t in targets if t.shape is None and t.current is None and str(t.table) not in known]
    if unknown:
        names = ", ".join(map(str, unknown))
        raise CdcUserError(
            f"No table {names} in the source or in the lakehouse: check the name (`cdc-lakehouse status` lists the "
            "lakehouse's tables)."
        )


def _lake_rows(current: DeltaTable | None) -> int:
    """Live rows of a current-state table: from the log's statistics, or counted when soft deletes keep rows."""
    if current is None:
        return 0
    names = _lake_columns(current)
    if DELETED_COLUMN not in names:
        return row_count(current)
    return int(read_query(current, live_rows_sql(names, "count(*) AS n"), "current").column(0)[0].as_py())


def _lake_columns(current: DeltaTable) -> list[str]:
    return list(pa.schema(current.schema().to_arrow()).names)


def _source_columns(names: list[str]) -> list[str]:
    """A current-state table's columns without the `_cdc_` metadata ones."""
    return [n for n in names if not n.startswith("_cdc_")]


@dataclass(frozen=True)
class _LakeSide:
    """What a pool thread read of a table's current state for its comparison (delta-rs and pyarrow work outside
    the GIL, beside the source's reads): every live row; or, for a comparison of some keys (`_compare_changed`),
    the live rows of the keys changed and in flight, how many of the table's files held them, and those keys (which
    the source's rows are read by)."""

    rows: pa.Table | None = None
    files_read: int = 0
    keys: pa.Table | None = None


def _compares_keys(target: _Target) -> bool:
    return target.only is not None and bool(target.columns)


def _read_lake(target: _Target) -> _LakeSide:
    if target.current is None or target.missing or target.owes_repair:
        return _LakeSide()
    if _compares_keys(target):
        if target.not_compared:
            return _LakeSide()
        assert target.only is not None and target.lakehouse is not None
        wanted = keys_table(target.only | target.keys, target.key_names, target.key_types())
        return _LakeSide(*lake_rows_with_keys(target.lakehouse, target.table, target.current, wanted), keys=wanted)
    if target.large_rows:
        return _LakeSide()  # read in buckets (`_compare_large`)
    return _LakeSide(read_query(target.current, live_rows_sql(_lake_columns(target.current)), "current"))


def _lake_chunks(target: _Target) -> Iterator[pa.Table]:
    """A large table's live rows in the lakehouse, a chunk at a time."""
    if target.current is None:
        return
    assert target.lakehouse is not None
    access, table_key = target.lakehouse.file_access(), target.lakehouse.table_key(CURRENT, target.table)
    for rows in read_table_chunks(access, table_key, target.current, bucketed.STREAM_ROWS):
        yield live_rows(rows)


def _comparison(
    target: _Target, position: BinlogPosition, diff: TableDiff, source_rows: int, lake_rows: int, compared: int,
    source_sum: str, lake_sum: str, buckets: int = 0,
) -> ConsistentComparison:  # fmt: skip
    return ConsistentComparison(
        target.table, str(position), target.applied_seq, source_rows, lake_rows, compared, len(target.keys),
        source_sum, lake_sum, diff, target.not_compared, buckets,
        lake_version=None if target.current is None else target.current.version(), checked_seq=target.after_seq,
        dropped_seq=target.dropped_seq,
        clear_left=clear_left_sentence(target.table, target.added, target.clear_found) if target.clear_found else None,
    )  # fmt: skip


def _compare(
    conn: pymysql.Connection, position: BinlogPosition, target: _Target, side: _LakeSide
) -> ConsistentComparison:
    """Both sides with the in-flight keys left out: counts, checksums and the row-for-row diff."""
    if target.missing or target.owes_repair:
        return _known_difference(target, position)
    if _compares_keys(target):
        return _compare_changed(conn, position, target, side)
    if target.large_rows:
        return _compare_large(conn, position, target)
    table, lake = target.table, side.rows
    lake_rows = lake.num_rows if lake is not None else 0
    lake = target.settled(lake) if lake is not None else None
    source_table = target.policed(read_source_table(conn, table, target.source_columns)) if target.columns else None
    source_rows = source_table.num_rows if source_table is not None else 0

    def result(diff: TableDiff, compared: int, source_sum: str, lake_sum: str) -> ConsistentComparison:
        return _comparison(target, position, diff, source_rows, lake_rows, compared, source_sum, lake_sum)

    if target.not_compared:
        return result(TableDiff(table, source_rows, lake_rows), 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM)
    if source_table is None:
        if not lake_rows:
            return result(TableDiff(table), 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM)
        assert lake is not None
        data = lake.select(_source_columns(lake.column_names))
        diff = TableDiff(table, lakehouse_rows=lake_rows, schema_problem="the table no longer exists in the source")
        return result(diff, 0, EMPTY_CHECKSUM, content_checksum(data))
    aligned = source_table.schema.empty_table() if lake is None else align_current(table, source_table, lake)
    kept_source = _without_keys(source_table, target.key_names, target.keys)
    if isinstance(aligned, TableDiff):  # columns or types differ: no row comparison possible
        assert lake is not None
        data = lake.select(_source_columns(lake.column_names))
        return result(aligned, kept_source.num_rows, content_checksum(kept_source), content_checksum(data))
    kept_lake = _without_keys(aligned, target.key_names, target.keys)
    diff = compare_tables(table, kept_source, kept_lake, target.key)
    compared = result(diff, kept_source.num_rows, content_checksum(kept_source), content_checksum(kept_lake))
    compared.rows = (kept_source, kept_lake) if target.keep_rows else None
    return compared


def _compare_changed(
    conn: pymysql.Connection, position: BinlogPosition, target: _Target, side: _LakeSide
) -> ConsistentComparison:
    """`_compare` of only the rows of the keys changed since the table was last found equal (`target.only`), and
    of the total row counts: the rows of the keys in flight are read too, so that the counts can leave them out.
    The lakehouse's rows of those keys are `side`'s, read on a pool thread."""
    assert target.only is not None and target.current is not None
    table = target.table
    lake_rows = _lake_rows(target.current)
    if target.not_compared:
        source_rows = _source_rows(conn, target)
        result = _comparison(target, position, TableDiff(table, source_rows, lake_rows), source_rows, lake_rows, 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM)
        result.scope, result.changed_keys = CHANGED_KEYS, len(target.only)
        return result
    assert side.rows is not None and side.keys is not None
    source = target.policed(read_source_rows_with_keys(conn, table, target.source_columns, target.key_names, side.keys))
    # a repair writes from the rows it compares and leaves the count to the check after its apply: a COUNT(*) reads
    # every row of the table (seconds for 10M rows)
    counted = not target.keep_rows
    source_rows = _source_rows(conn, target) if counted else 0
    lake, files = target.settled(side.rows), side.files_read
    aligned = align_current(table, source, lake)
    if isinstance(aligned, TableDiff):  # columns or types differ: no row comparison possible
        aligned.source_rows, aligned.lakehouse_rows = source_rows, lake_rows
        data = lake.select(_source_columns(lake.column_names))
        result = _comparison(target, position, aligned, source_rows, lake_rows, 0, content_checksum(source), content_checksum(data))
    else:
        in_flight = keys_table(target.keys, target.key_names, target.key_types())
        kept_source = _without_keys(source, target.key_names, target.keys)
        kept_lake = _without_keys(aligned, target.key_names, target.keys)
        diff = compare_tables(table, kept_source, kept_lake, target.key)
        diff.source_rows, diff.lakehouse_rows = source_rows, lake_rows
        source_sum, lake_sum = content_checksum(kept_source), content_checksum(kept_lake)
        result = _comparison(target, position, diff, source_rows, lake_rows, kept_source.num_rows, source_sum, lake_sum)
        # every row outside the keys in flight is in both or in neither: the totals without them agree
        result.counts_differ = counted and (
            source_rows - with_keys(source, in_flight).num_rows != lake_rows - with_keys(aligned, in_flight).num_rows
        )
        result.rows = (kept_source, kept_lake) if target.keep_rows else None
    result.scope, result.changed_keys, result.files_read, result.counted = CHANGED_KEYS, len(target.only), files, counted
    return result


def _source_rows(conn: pymysql.Connection, target: _Target) -> int:
    """The table's source rows in the snapshot: counted with the other tables' (`_count_changed_tables`), else now."""
    return target.source_count if target.source_count is not None else count_source_rows(conn, target.table)


def _count_changed_tables(conn: pymysql.Connection, targets: list[_Target]) -> None:
    """The row counts `_compare_changed` needs, a statement for many tables (`count_many_source_rows`) in the
    snapshot; a repair's tables (`keep_rows`) are left to count their own when not compared, as they count nothing
    else. When that statement fails (a table's definition changed after the snapshot began: error 1412), each table
    counts its own rows, and the one that cannot is found out there as before."""
    counted = [
        t for t in targets
        if t.only is not None and t.columns and not t.keep_rows and not t.missing and not t.owes_repair
    ]  # fmt: skip
    if len(counted) < 2:
        return
    try:
        counts = count_many_source_rows(conn, [t.table for t in counted])
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in DEFINITION_CHANGED_ERRORS:
            return
        raise
    for target in counted:
        target.source_count = counts[target.table]


def _known_difference(target: _Target, position: BinlogPosition) -> ConsistentComparison:
    """A difference whatever is in flight, found without reading rows: a current-state table the pipeline made and
    someone removed, or one a statement changed without row events and no repair has made up for yet."""
    diff = TableDiff(target.table, schema_problem=target.missing or target.owes_repair)
    target.not_compared = None  # whatever is in flight, the table itself is gone, or owes its repair
    return _comparison(target, position, diff, 0, 0, 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM)


def _unsettled(target: _Target, position: BinlogPosition) -> ConsistentComparison:
    """A table whose definition changed after the snapshot began: InnoDB cannot read it in the snapshot
    (error 1412), so it is not compared this time, as a DDL found in flight would not be."""
    target.not_compared = (
        f"its definition changed after the consistent snapshot at {position} began (a DDL or TRUNCATE in flight, not "
        "captured yet): the next sync captures and applies it, and the next check compares the table again"
    )
    lake_rows = _lake_rows(target.current)
    return _comparison(
        target, position, TableDiff(target.table, 0, lake_rows), 0, lake_rows, 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM
    )


def _nothing_compared(result: ConsistentComparison) -> ConsistentComparison:
    """A comparison of every row that left every row out (each key changed in flight) compared nothing: it is
    not compared, never "0 rows match". A lakehouse behind its source (a sync that failed, one not run yet) looks
    like this."""
    if (
        result.not_compared is None and result.scope == EVERY_ROW and not result.compared_rows
        and result.in_flight_keys and result.equal and (result.source_rows or result.lakehouse_rows)
    ):  # fmt: skip
        result.not_compared = (
            f"every one of its rows changed after the lakehouse's applied _cdc_seq {result.applied_seq or 0} "
            f"({result.in_flight_keys} keys in flight): run `cdc-lakehouse sync`, then compare again"
        )
    return result


def _compare_in_snapshot(
    conn: pymysql.Connection, position: BinlogPosition, target: _Target, side: _LakeSide
) -> ConsistentComparison:
    try:
        return _compare(conn, position, target, side)
    except pymysql.err.MySQLError as exc:
        if exc.args and exc.args[0] in DEFINITION_CHANGED_ERRORS:
            return _unsettled(target, position)
        raise
    finally:
        release_unused_memory()


def _compare_large(conn: pymysql.Connection, position: BinlogPosition, target: _Target) -> ConsistentComparison:
    """`_compare` for a table too large to read whole: both sides streamed and compared in bucketed."""
    table = target.table

    def keep(rows: pa.Table) -> pa.Table:
        return _without_keys(rows, target.key_names, target.keys)

    result = partial(_comparison, target, position)
    if target.not_compared:
        source_rows = count_source_rows(conn, table) if target.columns else 0
        lake_rows = _lake_rows(target.current)
        return result(TableDiff(table, source_rows, lake_rows), source_rows, lake_rows, 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM)
    lake_schema = read_query(target.current, "SELECT * FROM current LIMIT 0", "current").schema if target.current else None
    if not target.columns:  # gone from the source: what the lakehouse still holds
        data = _source_columns(lake_schema.names) if lake_schema else []
        lake_rows, _, lake_sum = bucketed.hash_sum_streamed(_lake_chunks(target), lambda r: r.select(data))
        diff = TableDiff(table, lakehouse_rows=lake_rows, schema_problem="the table no longer exists in the source")
        return result(diff, 0, lake_rows, 0, EMPTY_CHECKSUM, checksum_text(lake_sum))
    schema = arrow_schema(target.columns)
    source_chunks = map(target.policed, read_source_chunks(conn, table, target.source_columns, bucketed.STREAM_ROWS))
    aligned = align_current(table, schema.empty_table(), (lake_schema or schema).empty_table())
    if isinstance(aligned, TableDiff):  # columns or types differ: no row comparison possible
        source_rows, kept, source_sum = bucketed.hash_sum_streamed(source_chunks, keep)
        data = _source_columns(lake_schema.names) if lake_schema else []
        lake_rows, _, lake_sum = bucketed.hash_sum_streamed(_lake_chunks(target), lambda r: r.select(data))
        aligned.source_rows, aligned.lakehouse_rows = source_rows, lake_rows
        return result(aligned, source_rows, lake_rows, kept, checksum_text(source_sum), checksum_text(lake_sum))
    lake_chunks = (align_current(table, schema.empty_table(), target.settled(chunk)) for chunk in _lake_chunks(target))
    buckets = bucketed.bucket_count(target.large_rows)
    found = bucketed.compare_in_buckets(table, schema, source_chunks, lake_chunks, target.key, buckets, keep)
    return result(
        found.diff, found.source_rows, found.lakehouse_rows, found.compared_rows,
        checksum_text(found.source_hash_sum), checksum_text(found.lakehouse_hash_sum), buckets,
    )  # fmt: skip


def compare_many(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    tables: list[TableRef],
    narrow: Narrowing | None = None,
    repairing: bool = False,
) -> list[ConsistentComparison]:
    """Tables compared at one consistent point: one source snapshot, one pass over raw batches and the binlog.
    `narrow` may limit a table's comparison to some keys and its row counts (see `Narrowing`).

    A lock-free point on MySQL (`source.SnapshotPoint`) leaves one race: a transaction the lakehouse already holds
    whose engine commit was not yet visible when the snapshot began (microseconds after its binlog write). It can
    only make a table look different, never equal: the tables found different are compared once more, at a new
    point, and that comparison is the result. A difference that is real is found again.

    A table that owes a repair (lake/repair_marks) differs without its rows being read, unless `repairing`: a
    repair compares its rows to find what to write."""
    results, point = _compare_at_one_point(settings, lakehouse, tables, narrow, marks=not repairing)
    differing = [i for i, r in enumerate(results) if not r.ok and not r.not_compared]
    if point.exact or not differing:
        return results
    time.sleep(RECOMPARE_AFTER_SECONDS)
    again, _ = _compare_at_one_point(settings, lakehouse, [results[i].table for i in differing], narrow, marks=not repairing)
    for i, result in zip(differing, again, strict=True):
        results[i] = result
    return results


def compare_to_repair(
    settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef], narrow: Narrowing | None
) -> tuple[list[ConsistentComparison], source.SnapshotPoint]:
    """The tables compared at one consistent point for a repair, with the rows compared kept on each result, and
    that point. Its low watermark waits for the binlog's writes to be committed first (as a snapshot's does), and a
    differing table is not compared again: the repair writes the source's rows of this very snapshot."""
    return _compare_at_one_point(
        settings, lakehouse, tables, narrow, keep_rows=True, settle=source.MYSQL_SETTLE_SECONDS, marks=False
    )


def _compare_at_one_point(
    settings: SourceSettings, lakehouse: Lakehouse, tables: list[TableRef], narrow: Narrowing | None,
    keep_rows: bool = False, settle: float = 0.0, marks: bool = True,
) -> tuple[list[ConsistentComparison], source.SnapshotPoint]:  # fmt: skip
    """`compare_many`'s one comparison, and the point it was made at."""
    url = settings.url
    conn = source.connect(url)
    try:
        server = source.preflight(conn, url, settings.server_id)
        # information_schema is not part of the snapshot: the shapes read before it and again after the rows
        # were read prove the shape inside it, when they agree (a DDL in between makes them differ).
        shapes = source_shapes(conn, tables)
        policy = settings.column_policy
        rewrite = load_policy_record(lakehouse.store).rewrite  # columns whose clear values are left until a rewrite
        with source.consistent_snapshot(conn, server, settings.global_read_lock, settle) as point:
            # Changes up to `low` are in the snapshot; those after it up to `high` may be or not: in flight.
            position = point.high
            failpoints.hit("verify.in_snapshot")
            # the stage's progress first: the table opened after it holds every change that progress covers
            opened = for_each_table(
                tables, lambda table: (load_progress(lakehouse.store, CURRENT_STAGE, str(table)).batch, *open_current(lakehouse, table))
            )
            targets = [
                _Target(
                    table, policy.lake_shape(shapes[table]) if shapes[table] else None, applied, current,
                    lakehouse=lakehouse, keep_rows=keep_rows, source=shapes[table], policy=policy, added=rewrite.get(str(table), {}),
                    progress_batch=progress,
                )
                for table, (progress, current, applied) in zip(tables, opened, strict=True)
            ]
            if marks:
                for target, mark in zip(targets, for_each_table(tables, lambda t: load_mark(lakehouse.store, str(t))), strict=True):
                    target.mark = mark
                    target.owes_repair = mark.sentence() if mark.pending else None
            _refuse_unknown(lakehouse, targets)
            absent = [t for t in targets if t.current is None]
            for target, (reason, dropped) in zip(absent, for_each_table(absent, partial(_absence, lakehouse)), strict=True):
                target.missing = reason
                if dropped is not None:
                    target.applied_seq = target.dropped_seq = dropped
            if narrow is not None:
                narrowed = [  # rows by key are read from the source by their clear key: not a table keyed on a hash
                    t for t in targets
                    if t.current is not None and t.shape is not None and t.shape.primary_key
                    and not (t.source is not None and policy.keys_policed(t.source))
                ]
                only = for_each_table(narrowed, lambda t: narrow(t.table, t.current, t.applied_seq, t.shape))
                for target, keys in zip(narrowed, only, strict=True):
                    target.only = keys
            # Read after the current-state tables: the checkpoint and the batches cover every applied seq.
            checkpoint = load_checkpoint(lakehouse.store)
            failover.require_same_server(checkpoint, server, "compare")
            manifests = _Manifests(lakehouse.store, list_batches(lakehouse.store))
            # A sync may have captured (and applied) past the snapshot: changes after it are in flight too.
            floor = (
                manifests.seq_floor_at(point.low.in_epoch(checkpoint.position.epoch))
                if checkpoint and point.low < checkpoint.position
                else None
            )
            estimates = source_row_estimates(conn, tables)
            for target in targets:
                applied = SEQ_NONE if target.applied_seq is None else target.applied_seq
                target.after_seq = applied if floor is None else min(applied, floor)
                target.release_cap = floor
                most = max(estimates[target.table], _lake_rows(target.current))
                target.large_rows = most if most > bucketed.LARGE_TABLE_ROWS else 0
            _scan_raw_batches(lakehouse.store, manifests, targets)
            if checkpoint is not None:
                _scan_binlog(settings, conn, server, checkpoint, position, targets)
            _settle(targets)
            _count_changed_tables(conn, targets)
            # The lakehouse side (`_LakeSide`) is read on threads (delta-rs works outside the GIL) while this one
            # reads the source, table by table, inside the one snapshot.
            with ThreadPoolExecutor(TABLE_WORKERS, thread_name_prefix="cdc-lake") as pool:
                lakes = [pool.submit(_read_lake, t) for t in targets]
                results = []
                report_progress(Update(COMPARE, 0, len(targets), "tables"))
                for target, lake in zip(targets, lakes, strict=True):
                    results.append(_compare_in_snapshot(conn, position, target, lake.result()))
                    rows = sum(r.compared_rows for r in results)
                    report_progress(Update(COMPARE, len(results), len(targets), "tables", rows))
            settled = source_shapes(conn, tables)
            return [
                _nothing_compared(_unsettled(t, position) if settled[t.table] != shapes[t.table] and not t.missing else result)
                for t, result in zip(targets, results, strict=True)
            ], point
    except pymysql.err.MySQLError as exc:  # e.g. no SELECT privilege, or the binlog reader refused
        raise source.describe_error(exc, url) from exc
    finally:
        conn.close()


def verify_tables(
    settings: SourceSettings, lakehouse: Lakehouse, requested: list[str] | None = None
) -> list[ConsistentComparison]:
    """`cdc-lakehouse verify`: the tables asked for (default: every table the lakehouse knows) compared with
    the source at one consistent point, keys changed in flight left out on both sides."""
    return compare_many(settings, lakehouse, tables_to_verify(lakehouse, requested))
