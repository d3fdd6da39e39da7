"""Touched tables become the fewest runs that cover exactly them."""

from cdc_assets.defs.partitions import touched_ranges

KEYS = ["a.t1", "a.t2", "a.t3", "b.t1", "b.t2"]


def test_consecutive_touched_tables_are_one_range() -> None:
    assert touched_ranges(KEYS, {"a.t2", "a.t3", "b.t1"}) == [("a.t2", "b.t1")]


def test_untouched_tables_split_ranges() -> None:
    assert touched_ranges(KEYS, {"a.t1", "a.t3", "b.t2"}) == [("a.t1", "a.t1"), ("a.t3", "a.t3"), ("b.t2", "b.t2")]


def test_all_and_none() -> None:
    assert touched_ranges(KEYS, set(KEYS)) == [("a.t1", "b.t2")]
    assert touched_ranges(KEYS, set()) == []
