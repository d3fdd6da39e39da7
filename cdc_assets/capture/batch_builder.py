"""Cutting the binlog into raw batches at transaction boundaries: the pure part.

`BatchBuilder` is fed decoded events and knows transactions, table versions, `_cdc_seq` and where a batch may
end; with it, how a statement is read for that (redacted, classified, a TRUNCATE's table, an XA statement).
`capture/event_loop.capture_batches` feeds it from the binlog.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdc_assets.capture.ddl import UnknownStoredValue, schema_changes
from cdc_assets.capture.spool import CHUNK_ROWS, RowSpool, SpoolDirectory
from cdc_assets.core import failpoints
from cdc_assets.core.column_policy import ColumnPolicy, Rules
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.names import TableRef
from cdc_assets.core.ops import ALTER, TRUNCATE
from cdc_assets.core.positions import FIRST_SEQ, BinlogPosition
from cdc_assets.core.settings import DEFAULT_MAX_BATCH_ROWS, TableFilter
from cdc_assets.core.shapes import SchemaChange, TableShape, shape_json
from cdc_assets.lake.quarantine import CAPTURE, default_fix, describe
from cdc_assets.lake.raw_batches import RAW_ROWS_SCHEMA, RawBatch

# Statements that manage accounts can carry passwords: they never enter a raw batch.
_ACCOUNT_STATEMENT = re.compile(
    r"^\s*(/\*.*?\*/\s*)*("
    r"(CREATE|ALTER|DROP|RENAME)\s+(OR\s+REPLACE\s+)?(DEFINER\s*=\s*\S+\s+)?(USER|ROLE)\b"
    r"|GRANT\b|REVOKE\b|SET\s+(PASSWORD|ROLE|DEFAULT\s+ROLE)\b|CHANGE\s+(MASTER|REPLICATION)\b)",
    re.IGNORECASE | re.DOTALL,
)
# Belt and braces: any other statement that may carry a credential (a password, a FEDERATED or CONNECT
# table's CONNECTION string, a URL with user:password@) has its string literals blanked.
_SECRET_HINT = re.compile(r"IDENTIFIED|PASSWORD|CONNECTION\s*=?\s*['\"]|://[^\s/'\"]*:[^\s@'\"]*@", re.IGNORECASE)
_STRING_LITERAL = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"")


def redact_statement(query: str) -> str | None:
    """The statement as it may be stored in a raw batch: None for account management, secrets blanked."""
    if _ACCOUNT_STATEMENT.search(query):
        return None
    if _SECRET_HINT.search(query):
        return _STRING_LITERAL.sub("'<redacted>'", query)
    return query


_BEGIN = re.compile(r"^\s*(BEGIN|START\s+TRANSACTION|XA\s+START)\b", re.IGNORECASE)
# A ROLLBACK in the binlog ends a transaction whose non-transactional changes stay made (their rows are
# in the binlog); a rolled-back transactional change never reaches the binlog at all.
_END = re.compile(r"^\s*(COMMIT|XA\s+COMMIT|XA\s+ROLLBACK|ROLLBACK(\s+WORK)?\s*$)", re.IGNORECASE)
_IN_TRANSACTION_MARKER = re.compile(
    r"^\s*(SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK(\s+WORK)?\s+TO|XA\s+END|XA\s+PREPARE)\b", re.IGNORECASE
)
# A row change of an open transaction: RAW_ROWS_SCHEMA without the seq and commit time it gets at COMMIT.
TRANSACTION_SCHEMA = pa.schema([f for f in RAW_ROWS_SCHEMA if f.name not in ("seq", "commit_ts")])
_XA_RESOLUTION = re.compile(r"^\s*XA\s+(COMMIT|ROLLBACK|END)\s+(.*?)\s*(ONE\s+PHASE)?\s*;?\s*$", re.IGNORECASE | re.DOTALL)


_TRUNCATE = re.compile(
    r"^\s*(?:/\*.*?\*/\s*)*TRUNCATE\s+(?:TABLE\s+)?(?:(`(?:[^`]|``)+`|[^\s.`;]+)\s*\.\s*)?(`(?:[^`]|``)+`|[^\s.`;]+)",
    re.IGNORECASE | re.DOTALL,
)


def _identifier(text: str) -> str:
    return text[1:-1].replace("``", "`") if text.startswith("`") else text


def truncated_table(query: str, default_schema: str | None) -> TableRef | None:
    """The table a TRUNCATE statement empties (None for any other statement)."""
    match = _TRUNCATE.match(query)
    if match is None:
        return None
    schema = _identifier(match.group(1)) if match.group(1) else default_schema
    return TableRef(schema, _identifier(match.group(2))) if schema else None


def xa_statement(query: str) -> tuple[str, str] | None:
    """(`END`, `COMMIT` or `ROLLBACK`, the XID as the binlog writes it) of an XA statement, else None."""
    match = _XA_RESOLUTION.match(query)
    if match is None or match.group(3):  # XA COMMIT ... ONE PHASE is logged as a plain transaction
        return None
    return match.group(1).upper(), re.sub(r"\s+", "", match.group(2))


@dataclass(frozen=True)
class _HoldPoint:
    """Where a batch must end while an XA transaction is prepared but not yet committed or rolled back:
    just before it, so the next capture reads it again and finds its outcome."""

    position: BinlogPosition
    next_seq: int
    rows: int
    statements: int
    transactions: int
    gtid_state: GtidState
    first_commit_ts: int | None
    last_commit_ts: int | None
    schemas: dict[TableRef, TableShape]
    changed_schemas: dict[TableRef, TableShape | None]


def classify_query(query: str) -> str:
    """What a QueryEvent is to transaction tracking: begin, end, marker (inside a transaction) or ddl."""
    if _BEGIN.match(query):
        return "begin"
    if _END.match(query):
        return "end"
    if _IN_TRANSACTION_MARKER.match(query):
        return "marker"
    return "ddl"


@dataclass
class BatchBuilder:
    """Assembles committed transactions into batches of at most about `max_rows` row changes."""

    start: BinlogPosition
    next_seq: int = FIRST_SEQ
    gtid_state: GtidState = field(default_factory=GtidState)  # at the last commit (MySQL: the executed set)
    max_rows: int = DEFAULT_MAX_BATCH_ROWS
    server: dict[str, Any] = field(default_factory=dict)
    # Every captured table's columns and key as of the current point of the binlog (persisted between
    # captures under _state/schemas/), so a DDL can be applied to the shape it changes.
    schemas: dict[TableRef, TableShape] = field(default_factory=dict)
    table_filter: TableFilter | None = None
    chunk_rows: int = CHUNK_ROWS  # rows of a transaction or a batch held in memory; beyond it they spill to disk
    hold_for_xa: bool = True  # False: a reader of what is committed now (no checkpoint) need not stop at a PREPARE
    # Column policies (core/column_policy), applied to every image, shape and table change the batch holds; the
    # builder's `schemas` stay the source's (a DDL applies to them). `recorded_rules`: each table's rules as
    # `_state/` records them, kept up to date by the batches (None: not tracked, e.g. verify's in-memory read).
    policy: ColumnPolicy = field(default_factory=ColumnPolicy)
    recorded_rules: dict[str, Rules] | None = None

    def __post_init__(self) -> None:
        self._transaction_dir = SpoolDirectory()
        self._spools_made = 0
        self._transaction = self._new_transaction_spool()
        self._gtid: str | None = None
        self._group_start: BinlogPosition | None = None
        self._prepared: dict[str, RowSpool] = {}  # XA transactions prepared, not yet committed or rolled back
        self._hold: _HoldPoint | None = None
        self.skipping = False  # inside a transaction already captured (see `begin`)
        self._policed: dict[int, tuple[TableShape, Any]] = {}  # id of a source shape -> (that shape, its policer)
        self._reset(self.start)

    def _reset(self, start: BinlogPosition) -> None:
        self.batch_start = start
        self.batch_start_gtid = self.gtid_state.text()
        self.batch_first_seq = self.next_seq
        self.committed_end = start
        self._batch_dir = SpoolDirectory()  # lives on with the RawBatch cut from it
        self._rows = RowSpool(RAW_ROWS_SCHEMA, self._batch_dir.path / "changes.parquet", self.chunk_rows)
        self._versions: dict[int, TableShape] = {}  # version id -> shape
        self._latest: dict[TableRef, int] = {}
        self.statements: list[dict[str, Any]] = []
        self.changed_schemas: dict[TableRef, TableShape | None] = {}
        self._awaiting_commit_ts: list[dict[str, Any]] = []
        self.events = 0
        self.transactions = 0
        self.first_commit_ts: int | None = None
        self.last_commit_ts: int | None = None
        self.quarantined: dict[str, dict[str, Any]] = {}
        self.policies: dict[str, Rules] = {}  # tables whose recorded rules this batch sets

    # -- events ---------------------------------------------------------------------------------------
    def count_event(self) -> None:
        self.events += 1

    def begin(self, gtid: str | None, at: BinlogPosition | None = None) -> None:
        self._transaction.discard()  # a transaction left open (the stream resumed mid-way) never committed
        self._gtid = gtid
        self._group_start = at
        # A MySQL transaction whose GTID the executed set holds was captured already: after a failover the new
        # server's binlog may hold such ones past the point capture resumed from (another order of the same
        # transactions). It is skipped, as a replica with auto-position skips it.
        self.skipping = gtid is not None and self.gtid_state.holds(gtid)

    # -- XA transactions --------------------------------------------------------------------------------
    # MariaDB logs an XA transaction's rows when it is PREPAREd (an event group of their own), and its
    # XA COMMIT or XA ROLLBACK later, after other transactions. Its rows count only at XA COMMIT, and
    # get their `_cdc_seq` there; until then a batch may not end after the PREPARE.

    def prepare_xa(self, xid: str) -> None:
        if self._hold is None and self.hold_for_xa:
            self._hold = _HoldPoint(
                position=self._group_start or self.committed_end,
                next_seq=self.next_seq,
                rows=len(self._rows),
                statements=len(self.statements),
                transactions=self.transactions,
                gtid_state=self.gtid_state.copy(),
                first_commit_ts=self.first_commit_ts,
                last_commit_ts=self.last_commit_ts,
                schemas=dict(self.schemas),
                changed_schemas=dict(self.changed_schemas),
            )
        self._prepared[xid] = self._transaction
        self._transaction = self._new_transaction_spool()

    def _new_transaction_spool(self) -> RowSpool:
        """A spool for an open transaction's rows, in a file of its own (prepared XA ones live on beside it)."""
        self._spools_made += 1
        path = self._transaction_dir.path / f"transaction-{self._spools_made}.parquet"
        return RowSpool(TRANSACTION_SCHEMA, path, self.chunk_rows)

    def resolve_xa(self, xid: str, committed: bool) -> bool:
        """The prepared transaction's rows become this group's (XA COMMIT) or go (XA ROLLBACK); False when
        its PREPARE was never read (it lies before where capture started)."""
        spool = self._prepared.pop(xid, None)
        if spool is None:
            return False
        if committed:
            self._transaction.discard()
            self._transaction = spool
        else:
            spool.discard()
        if not self._prepared:
            self._hold = None
        return True

    @property
    def holding(self) -> bool:
        return self._hold is not None

    def version_of(self, shape: TableShape) -> int:
        """The batch-local version id of a table's shape: a new id whenever its columns or key change, so a
        table's highest id in a batch is its newest shape (even when it changes back)."""
        latest = self._latest.get(shape.table)
        if latest is not None and self._versions[latest] == shape:
            return latest
        version = len(self._versions)
        self._versions[version] = shape
        self._latest[shape.table] = version
        self._observe(shape)
        self._track_rules(shape)
        return version

    # -- column policies ----------------------------------------------------------------------------------
    def _policer(self, shape: TableShape) -> Any:
        """The shape's image policer (None: the policy leaves its images as they are), made once per shape."""
        known = self._policed.get(id(shape))
        if known is None or known[0] is not shape:
            known = (shape, self.policy.image_policer(shape))
            self._policed[id(shape)] = known
        return known[1]

    def _track_rules(self, shape: TableShape) -> None:
        """A table's rules recorded with the batch when `_state/` does not hold them yet (a new table, new
        columns): the policy is the same for the whole capture (capture/run checks it against `_state/` first)."""
        if self.recorded_rules is None:
            return
        rules = self.policy.rules(shape)
        name = str(shape.table)
        if self.recorded_rules.get(name) != rules:
            self.recorded_rules[name] = rules
            self.policies[name] = rules

    def policy_changed(self, changes: list[tuple[SchemaChange, Rules]]) -> None:
        """Tables whose policy changed since they were captured (capture/run decided it may go on): each an
        implicit alter of its lakehouse shape, from the recorded rules' to today's, before any row of this capture."""
        if not changes:
            return
        entry = self._entry(None, "", None, "ddl")
        entry["implicit"] = True
        entry["column_policy"] = True
        first = int(entry["seq"])
        self.next_seq += len(changes) - 1
        entry["changes"] = [{**c.to_json(), "seq": str(first + i)} for i, (c, _) in enumerate(changes)]
        for change, rules in changes:
            if self.recorded_rules is not None:
                self.recorded_rules[str(change.table)] = rules
            self.policies[str(change.table)] = rules
            source_shape = self.schemas.get(change.table)
            if source_shape is not None:
                self.changed_schemas[change.table] = source_shape

    def _observe(self, shape: TableShape) -> None:
        """A row event's own columns are the truth: a shape no DDL explained (an unreadable statement,
        or one applied in a way we did not foresee) becomes an `alter` of its own, at this point."""
        known = self.schemas.get(shape.table)
        if known is not None and not known.same_layout(shape):
            self._record_ddl(None, None, [SchemaChange(shape.table, ALTER, known, shape)], None)
        elif known != shape:
            self._set_shape(shape.table, shape)

    def _set_shape(self, table: TableRef, shape: TableShape | None) -> None:
        if shape is None:
            self.schemas.pop(table, None)
        else:
            self.schemas[table] = shape
        self.changed_schemas[table] = shape

    def quarantine(self, table: TableRef, error: BaseException, at: BinlogPosition) -> None:
        """`table`'s events cannot be decoded (`error`, met at `at`): capture leaves it out from here on, and the
        batch records why, so the run quarantines it (lake/quarantine) before the checkpoint passes the batch."""
        self.quarantined.setdefault(
            str(table),
            {"cause": describe(error), "fix": default_fix(str(table), CAPTURE), "first_seq": self.next_seq, "position": str(at)},
        )

    def _wanted(self, table: TableRef | None) -> bool:
        return table is not None and (self.table_filter is None or self.table_filter.matches(table.schema, table.table))

    def row_changes(
        self,
        shape: TableShape,
        op: str,
        befores: Sequence[list[str | None] | None],
        afters: Sequence[list[str | None] | None],
    ) -> None:
        """The rows of one row event of a table of this shape: images before and after, in order."""
        if self.skipping:
            return
        n = len(befores)
        version = self.version_of(shape)
        table = shape.table
        police = self._policer(shape)
        if police is not None:  # no clear value of a policed column goes further than this
            befores, afters = police(befores), police(afters)
        self._transaction.extend(
            [[table.schema] * n, [table.table] * n, [version] * n, [op] * n, [self._gtid] * n, befores, afters]
        )
        if self._transaction.spilled:
            failpoints.hit("capture.transaction_spilled")

    def statement(
        self, schema: str | None, query: str, commit_ts: int | None = None, literal_charset: str | None = None
    ) -> None:
        """A DDL or TRUNCATE of captured tables: recorded (secrets excluded), with a `_cdc_seq` of its own
        to order it. A DDL also carries the table changes it makes (`ddl.schema_changes`, its string literals read in
        `literal_charset`); one whose values in the table's rows cannot be known from it quarantines the table."""
        if self.skipping:
            return
        redacted = redact_statement(query)
        if redacted is None:
            return
        truncated = truncated_table(query, schema)
        if truncated is not None:
            if self._wanted(truncated):
                entry = self._entry(schema, redacted, commit_ts, TRUNCATE)
                entry["table"] = str(truncated)
            return
        try:
            changes, problem = schema_changes(query, schema, self.schemas, literal_charset), None
        except UnknownStoredValue as exc:  # the rows it fills would be a guess: the table waits for a snapshot
            changes, problem = [], None
            if exc.table is not None and self._wanted(exc.table):
                fix = f"run `cdc-lakehouse snapshot {exc.table}` (a CHARACTER SET named in such a statement avoids it)"
                self.quarantined.setdefault(
                    str(exc.table), {"cause": str(exc), "fix": fix, "first_seq": self.next_seq, "position": None}
                )
        except Exception as exc:  # noqa: BLE001 - never stall capture on a statement: the row events still tell the shape
            changes, problem = [], f"{type(exc).__name__}: {exc}"
        changes = [self._filtered(c) for c in changes if self._wanted(c.table)]
        for change in changes:  # a column renamed out of (or into) its policy: the table is held, never made clearer
            renamed = self.policy.renamed_out(change)
            if renamed is not None:
                self.quarantined.setdefault(
                    str(change.table), {"cause": renamed[0], "fix": renamed[1], "first_seq": self.next_seq, "position": None}
                )
        in_scope = not schema or self.table_filter is None or self.table_filter.matches_schema(schema)
        if changes or in_scope:
            self._record_ddl(schema, redacted, changes, commit_ts, problem)

    def _filtered(self, change: SchemaChange) -> SchemaChange:
        """A rename to or from a table that is not captured is a plain create or drop."""
        partner = change.renamed_from or change.renamed_to
        if partner is not None and not self._wanted(partner):
            return SchemaChange(change.table, change.action, change.before, change.after)
        return change

    def _entry(self, schema: str | None, query: str, commit_ts: int | None, kind: str) -> dict[str, Any]:
        seq = self.next_seq
        self.next_seq += 1
        entry: dict[str, Any] = {"seq": str(seq), "schema": schema, "query": query, "gtid": self._gtid, "kind": kind}
        if commit_ts is not None:
            entry["commit_ts"] = commit_ts
        else:
            self._awaiting_commit_ts.append(entry)
        self.statements.append(entry)
        return entry

    def _record_ddl(
        self,
        schema: str | None,
        query: str | None,
        changes: list[SchemaChange],
        commit_ts: int | None,
        problem: str | None = None,
    ) -> None:
        entry = self._entry(schema, query or "", commit_ts, "ddl")
        if query is None:  # seen in a row event's columns, not in a statement
            entry["implicit"] = True
        if problem:
            entry["unparsed"] = problem
        if changes:
            # each table change has a `_cdc_seq` of its own (a RENAME of two tables makes four changes)
            first = int(entry["seq"])
            self.next_seq += len(changes) - 1
            policed = [self.policy.schema_change(c) for c in changes]
            entry["changes"] = [{**c.to_json(), "seq": str(first + i)} for i, c in enumerate(policed)]
        for change in changes:
            self._set_shape(change.table, change.after)

    def commit(self, end: BinlogPosition, commit_ts: int) -> None:
        """The transaction ending at `end` committed at `commit_ts` (epoch seconds)."""
        for entry in self._awaiting_commit_ts:  # an implicit change learns its commit time here
            entry["commit_ts"] = commit_ts
        self._awaiting_commit_ts.clear()
        if len(self._transaction):
            self.transactions += 1
            if self.first_commit_ts is None:
                self.first_commit_ts = commit_ts
            self.last_commit_ts = commit_ts
            self._move_transaction_rows(commit_ts * 1_000_000)
        if self._gtid:
            self.gtid_state.add(self._gtid)
        self._transaction.discard()
        self._gtid = None
        self.skipping = False
        self.committed_end = end

    def _move_transaction_rows(self, commit_micros: int) -> None:
        """The committed transaction's rows into the batch, numbered in binlog order and stamped with the
        commit time: row by row while it is small, row group by row group once it has spilled to disk."""
        if not self._transaction.spilled:
            columns = self._transaction.buffered_columns()
            n = len(columns[0])
            seqs = range(self.next_seq, self.next_seq + n)
            self._rows.extend([seqs, *columns[:5], [commit_micros] * n, *columns[5:]])
            self.next_seq += n
            return
        for chunk in self._transaction.chunks():
            seqs = pa.array(range(self.next_seq, self.next_seq + chunk.num_rows), pa.int64())
            self.next_seq += chunk.num_rows
            stamped = chunk.add_column(0, "seq", seqs).add_column(
                6, "commit_ts", pa.array([commit_micros] * chunk.num_rows, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
            )
            self._rows.append_table(stamped.select(RAW_ROWS_SCHEMA.names))

    def previous_gtids(self, executed: GtidState) -> None:
        """A MySQL binlog file's PREVIOUS_GTIDS: every transaction before the file is executed at its start (capture
        that began at the oldest binlog learns the set there; later files only confirm it)."""
        self.gtid_state.update(executed)

    def advance_idle_to(self, position: BinlogPosition) -> None:
        if not len(self._transaction) and self._gtid is None and self.committed_end < position:
            self.committed_end = position

    # -- batches --------------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self._rows)

    def is_full(self) -> bool:
        return self.rows >= self.max_rows

    def has_progress(self) -> bool:
        end = self._hold.position if self._hold is not None else self.committed_end
        return self.batch_start < end

    def cut(self) -> RawBatch:
        """The batch of everything committed since the last cut; the next batch starts where it ends.

        With an XA transaction still prepared, the batch ends just before it (the end of a capture):
        what follows is read again by the next capture.
        """
        limit = None
        if self._hold is not None:
            hold = self._hold
            limit = hold.rows
            self.committed_end, self.next_seq, self.transactions = hold.position, hold.next_seq, hold.transactions
            self.statements = self.statements[: hold.statements]
            self.gtid_state = hold.gtid_state
            self.first_commit_ts, self.last_commit_ts = hold.first_commit_ts, hold.last_commit_ts
            self.schemas, self.changed_schemas = hold.schemas, hold.changed_schemas
            self._hold = None
            self._prepared.clear()
        batch = RawBatch(
            start=self.batch_start,
            end=self.committed_end,
            data_path=self._rows.finish(limit),
            row_count=len(self._rows) if limit is None else limit,
            keepalive=self._batch_dir,
            shapes={v: self.policy.lake_shape(s) for v, s in self._versions.items()},
            first_seq=self.batch_first_seq,
            next_seq=self.next_seq,
            statements=self.statements,
            events=self.events,
            transactions=self.transactions,
            start_gtid=self.batch_start_gtid,
            end_gtid=self.gtid_state.text(),
            first_commit_ts=self.first_commit_ts,
            last_commit_ts=self.last_commit_ts,
            server=self.server,
            schemas={str(t): shape_json(self.policy.lake_shape(s) if s else None) for t, s in self.changed_schemas.items()},
            source_schemas=(
                {str(t): shape_json(s) for t, s in self.changed_schemas.items()} if not self.policy.empty else None
            ),
            policies=self.policies,
            quarantined=self.quarantined,
        )
        self._reset(self.committed_end)
        return batch
