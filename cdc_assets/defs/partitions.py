"""Tables as Dagster partitions: the change-log and current-state layers have one partition per source table."""

from collections.abc import Iterable

from dagster import DynamicPartitionsDefinition

TABLES_PARTITIONS_NAME = "tables"
tables_partitions = DynamicPartitionsDefinition(name=TABLES_PARTITIONS_NAME)


def with_new_tables(existing: list[str], tables: Iterable[str]) -> tuple[list[str], list[str]]:
    """The partition keys in their order (those there already, then the tables not among them, sorted) and
    the new ones."""
    new = sorted(set(tables) - set(existing))
    return existing + new, new


def touched_ranges(ordered_keys: list[str], touched: set[str]) -> list[tuple[str, str]]:
    """The touched keys as the fewest (first, last) runs of consecutive keys in partition order.

    A Dagster run covers one partition or one range of partitions, so this many runs materialize
    exactly the touched tables and nothing else.
    """
    ranges: list[tuple[str, str]] = []
    first: str | None = None
    last: str | None = None
    for key in ordered_keys:
        if key in touched:
            first = key if first is None else first
            last = key
        elif first is not None and last is not None:
            ranges.append((first, last))
            first = last = None
    if first is not None and last is not None:
        ranges.append((first, last))
    return ranges


