"""The exactly-once oracle: every row change of the raw batches is in its table's change log once, and nothing else.

The raw batches are the capture's record of the binlog (a chain checked for gaps and overlaps); the change logs
are what the stages made of them. Compared per table and per `_cdc_seq`, so a lost change, a change applied twice
and a change filed under the wrong table each show up by name. Used by the crash tests and benchmarks/chaos.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

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


def raw_changes(lakehouse: Lakehouse) -> Counter[tuple[str, int]]:
    """(table, seq) of every row change in the visible raw batches."""
    store = lakehouse.store
    found: Counter[tuple[str, int]] = Counter()
    for name in list_batches(store):
        rows = read_rows(store, read_manifest(store, name)).select(["schema", "table", "seq"])
        for schema, table, seq in zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True):
            found[(str(TableRef(schema, table)), seq)] += 1
    return found


def logged_changes(lakehouse: Lakehouse) -> Counter[tuple[str, int]]:
    """(table, seq) of every row change in the change logs, counted."""
    found: Counter[tuple[str, int]] = Counter()
    for table in lakehouse.tables(CHANGES):
        log = lakehouse.open(CHANGES, table)
        if log is None:
            continue
        seqs = read_query(log, f"SELECT _cdc_seq FROM changes WHERE {ROW_OPS}", "changes").column(0).to_pylist()
        found.update((str(table), seq) for seq in seqs)
    return found


def check_exactly_once(lakehouse: Lakehouse) -> ExactlyOnce:
    """Raw batches against change logs (run it once every stage has caught up with capture)."""
    raw, logged = raw_changes(lakehouse), logged_changes(lakehouse)
    result = ExactlyOnce(chain_breaks=batch_chain_breaks(lakehouse), changes=sum(raw.values()))
    for (table, seq), n in sorted(raw.items()):
        if n > 1:  # a seq twice in the raw batches: the capture wrote a change twice
            result.duplicated.setdefault(table, []).append(seq)
        if logged.get((table, seq), 0) == 0:
            result.lost.setdefault(table, []).append(seq)
    for (table, seq), n in sorted(logged.items()):
        if n > 1:
            result.duplicated.setdefault(table, []).append(seq)
        if (table, seq) not in raw:
            result.unknown.setdefault(table, []).append(seq)
    return result
