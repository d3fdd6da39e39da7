"""Quarantined tables in comparisons: never compared, never "ok", each a difference named by its quarantine sentence.

A quarantined table owes changes (lake/quarantine), so comparing it could only find it behind, or pass by leaving
every key it owes out as in flight; and reading it may be what failed (an odd column type). So the checks after an
apply, the full comparisons and `verify` leave it out and report it as differing, with the cause and the fix."""

from __future__ import annotations

from collections.abc import Callable

from cdc_assets.core.names import TableRef
from cdc_assets.lake.quarantine import describe, of_the_table, quarantined_tables
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.compare import TableDiff
from cdc_assets.verification.consistency import ConsistentComparison
from cdc_assets.verification.row_hashes import EMPTY_CHECKSUM


def quarantined_comparison(table: TableRef, position: str, sentence: str) -> ConsistentComparison:
    """A quarantined table's result: a difference (so a check fails as an error, and `verify` exits 1) whose
    description is the quarantine's sentence."""
    diff = TableDiff(table, schema_problem=sentence)
    return ConsistentComparison(table, position, None, 0, 0, 0, 0, EMPTY_CHECKSUM, EMPTY_CHECKSUM, diff)


def _each_on_its_own_if_need_be(
    tables: list[TableRef], compare: Callable[[list[TableRef]], list[ConsistentComparison]], position: str
) -> list[ConsistentComparison]:
    """`compare` over all the tables; when one table's own error stops it (a value the reader cannot map), each table
    on its own, and the one that cannot be compared is "not compared" with the cause, never "ok": one odd table never
    stops the comparison of the others."""
    try:
        return compare(tables)
    except Exception as exc:
        if not of_the_table(exc):
            raise
    results = []
    for table in tables:
        try:
            results += compare([table])
        except Exception as exc:
            if not of_the_table(exc):
                raise
            result = quarantined_comparison(table, position, "")
            result.diff.schema_problem = None
            result.not_compared = f"it cannot be read for the comparison ({describe(exc)}): report it"
            results.append(result)
    return results


def comparing_all_but_quarantined(
    lakehouse: Lakehouse, tables: list[TableRef], compare: Callable[[list[TableRef]], list[ConsistentComparison]]
) -> list[ConsistentComparison]:
    """`compare` over the tables not quarantined, and a quarantined comparison for each other, in `tables`' order."""
    held = quarantined_tables(lakehouse.store)
    kept = [t for t in tables if str(t) not in held]
    checkpoint = load_checkpoint(lakehouse.store)
    position = str(checkpoint.position) if checkpoint is not None else "-"
    compared = {c.table: c for c in _each_on_its_own_if_need_be(kept, compare, position)} if kept else {}
    return [
        compared[t] if t in compared else quarantined_comparison(t, position, held[str(t)].sentence())
        for t in tables
        if t in compared or str(t) in held
    ]
