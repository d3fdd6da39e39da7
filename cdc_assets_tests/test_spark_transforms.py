"""The stages' transforms: keying changes (one function both engines call, `keyed_changes`, to the texts Spark's
to_json wrote when Spark keyed in its own SQL: change logs hold them). The newest change per key is one function
both engines call too (test_current_rows), proved end to end on each (test_engines_agree)."""

import pyarrow as pa

from cdc_assets.stages.changes.keys import keyed_changes
from spark_resources.engine import choose_transforms


def _raw_rows() -> tuple[pa.Table, pa.Table]:
    rows = pa.table(
        {
            "seq": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "schema": ["s", "s", "s", "s", "s"],
            "table": ["b", "a", "b", "c", "z"],
            "table_version": pa.array([1, 0, 1, 2, 9], pa.int32()),
            "op": ["insert", "update", "delete", "insert", "insert"],
            "before": pa.array([None, ["1", "x", "y"], ["7", "z"], None, None], pa.list_(pa.string())),
            "after": pa.array(
                [["7", "z"], ["1", "x2", "y"], None, ['q"uo\\te 🚀', None, "tab\there\x01\x1f"], ["no keys"]],
                pa.list_(pa.string()),
            ),
            "batch": ["b1", "b1", "b1", "b1", "b1"],
        }
    )
    keys = pa.table(
        {
            "batch": ["b1", "b1", "b1"],
            "table_version": pa.array([0, 1, 2], pa.int32()),
            "key_idx": pa.array([[0, 2], [0], [0, 1, 2]], pa.list_(pa.int32())),
        }
    )
    return rows, keys


def test_keyed_changes_in_one_job_over_tables() -> None:
    rows, keys = _raw_rows()
    keyed = keyed_changes(rows, keys).to_pylist()
    assert [(r["table"], r["seq"], r["key"], r["before_key"]) for r in keyed] == [
        ("a", 2, '["1","y"]', '["1","y"]'),
        ("b", 1, '["7"]', None),
        ("b", 3, '["7"]', '["7"]'),
        ("c", 4, '["q\\"uo\\\\te 🚀",null,"tab\\there\\u0001\\u001F"]', None),  # JSON as Spark's to_json writes it
    ]  # the row of a table version without keys (z) is left out


def test_engine_by_the_size_of_the_run() -> None:
    assert choose_transforms(999, 1000, lambda: None).engine == "arrow"
    assert choose_transforms(1000, 1000, lambda: None).engine == "spark"
