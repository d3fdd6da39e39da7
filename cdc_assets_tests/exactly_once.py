"""The exactly-once oracle: every row change of the raw batches is in its table's change log once, and nothing else.

The raw batches are the capture's record of the binlog (a chain checked for gaps and overlaps); the change logs
are what the stages made of them. Compared per table and per `_cdc_seq`, so a lost change, a change applied twice
and a change filed under the wrong table each show up by name. Used by the crash tests and benchmarks/chaos.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core import ops
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.raw_batches import list_batches, read_manifest, read_rows
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.integrity import batch_chain_breaks

ROW_OPS = "_cdc_op IN (" + ", ".join(f"'{op}'" for op in ops.ROW_OPS) + ")"


@dataclass
class ExactlyOnce:
    """What the oracle found; `ok` when nothing."""

    chain_breaks: list[str] = field(default_factory=list)
    lost: dict[str, list[int]] = field(default_factory=dict)  # table -> seqs in raw batches, not in its change log
    duplicated: dict[str, list[int]] = field(default_factory=dict)  # table -> seqs more than once in its change log
    unknown: dict[str, list[int]] = field(default_factory=dict)  # table -> seqs in its change log, in no raw batch
    changes: int = 0  # row changes in the raw batches

    @property
    def ok(self) -> bool:
        return not (self.chain_breaks or self.lost or self.duplicated or self.unknown)

    @property
    def outcome(self) -> str:
        """One word for a table of results: duplicated before lost, as duplicates are what the guarantee rules out."""
        if self.duplicated or self.unknown:
            return "duplicated"
        if self.lost or self.chain_breaks:
            return "lost"
        return "exactly once"

    def describe(self) -> str:
        if self.ok:
            return f"{self.changes} changes, each exactly once"
        parts = [f"chain breaks: {self.chain_breaks[:3]}"] if self.chain_breaks else []
        for what, found in (("lost", self.lost), ("duplicated", self.duplicated), ("unknown", self.unknown)):
            parts += [f"{what} in {t}: {len(s)} seqs, e.g. {s[:5]}" for t, s in sorted(found.items())]
        return "; ".join(parts)


def raw_changes(lakehouse: Lakehouse) -> pa.Table:
    """(table, seq) of every row change in the visible raw batches, a row each."""
    store = lakehouse.store
    batches = [
        read_rows(store, read_manifest(store, name)).select(["schema", "table", "seq"]) for name in list_batches(store)
    ]
    if not batches:
        return pa.table({"table": pa.array([], pa.string()), "seq": pa.array([], pa.int64())})
    rows = pa.concat_tables(batches, promote_options="default")
    # each schema and table named once, as TableRef names it, then given to their rows by a join
    pairs = rows.group_by(["schema", "table"]).aggregate([])
    names = [str(TableRef(s, t)) for s, t in zip(pairs["schema"].to_pylist(), pairs["table"].to_pylist(), strict=True)]
    named = rows.join(pairs.append_column("name", pa.array(names, pa.string())), ["schema", "table"])
    return pa.table({"table": named["name"], "seq": named["seq"].cast(pa.int64())})


def logged_changes(lakehouse: Lakehouse) -> pa.Table:
    """(table, seq) of every row change in the change logs, a row each."""
    parts = []
    for table in lakehouse.tables(CHANGES):
        log = lakehouse.open(CHANGES, table)
        if log is None:
            continue
        seqs = read_query(log, f"SELECT _cdc_seq FROM changes WHERE {ROW_OPS}", "changes").column(0)
        parts.append(pa.table({"table": pa.repeat(str(table), len(seqs)), "seq": seqs.cast(pa.int64())}))
    if not parts:
        return pa.table({"table": pa.array([], pa.string()), "seq": pa.array([], pa.int64())})
    return pa.concat_tables(parts)


def _pairs(found: pa.Table) -> list[tuple[str, int]]:
    """(table, seq) rows, sorted."""
    return sorted(zip(found["table"].to_pylist(), found["seq"].to_pylist(), strict=True))


def compare(raw: pa.Table, logged: pa.Table, chain_breaks: list[str]) -> ExactlyOnce:
    """Raw changes against logged ones, both (table, seq) a row each: counted and joined in Arrow, so a check of a
    long-lived lakehouse does not build a Python tuple for each of its changes."""
    keys = ["table", "seq"]
    raw_counts = raw.group_by(keys).aggregate([([], "count_all")])
    logged_counts = logged.group_by(keys).aggregate([([], "count_all")])
    result = ExactlyOnce(chain_breaks=chain_breaks, changes=raw.num_rows)
    # a seq twice in the raw batches (the capture wrote a change twice), then twice in its change log
    for counts in (raw_counts, logged_counts):
        for table, seq in _pairs(counts.filter(pc.greater(counts["count_all"], 1))):
            result.duplicated.setdefault(table, []).append(seq)
    for table, seq in _pairs(raw_counts.join(logged_counts, keys, join_type="left anti")):
        result.lost.setdefault(table, []).append(seq)
    for table, seq in _pairs(logged_counts.join(raw_counts, keys, join_type="left anti")):
        result.unknown.setdefault(table, []).append(seq)
    return result


def check_exactly_once(lakehouse: Lakehouse) -> ExactlyOnce:
    """Raw batches against change logs (run it once every stage has caught up with capture)."""
    return compare(raw_changes(lakehouse), logged_changes(lakehouse), batch_chain_breaks(lakehouse))
