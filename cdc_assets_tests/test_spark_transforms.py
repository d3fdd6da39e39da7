"""The stages' transforms: keying changes, the same on Spark (the change-log job's `keyed_frame`) and on Arrow
(whichever engine wrote a change log, a key has one text). The newest change per key is one function both engines
call (test_current_rows), proved end to end on each (test_engines_agree)."""

import pyarrow as pa

from cdc_assets.stages.changes.keys import keyed_changes
from cdc_assets.stages.changes.spark_tasks import keyed_frame
from spark_resources.engine import choose_transforms
from spark_resources.transforms import arrow_frame


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


def _keyed_on_spark(spark: object, rows: pa.Table, keys: pa.Table) -> pa.Table:
    keyed = keyed_frame(arrow_frame(spark, rows), arrow_frame(spark, keys))  # type: ignore[arg-type]
    return keyed.orderBy("schema", "table", "seq").toArrow()


def test_keyed_changes_in_one_job_over_tables() -> None:
    rows, keys = _raw_rows()
    keyed = keyed_changes(rows, keys).to_pylist()
    assert [(r["table"], r["seq"], r["key"], r["before_key"]) for r in keyed] == [
        ("a", 2, '["1","y"]', '["1","y"]'),
        ("b", 1, '["7"]', None),
        ("b", 3, '["7"]', '["7"]'),
        ("c", 4, '["q\\"uo\\\\te 🚀",null,"tab\\there\\u0001\\u001F"]', None),  # JSON as Spark's to_json writes it
    ]  # the row of a table version without keys (z) is left out


def test_both_engines_key_a_change_the_same_way(spark: object) -> None:
    rows, keys = _raw_rows()
    assert _keyed_on_spark(spark, rows, keys).to_pylist() == keyed_changes(rows, keys).to_pylist()


def test_engine_by_the_size_of_the_run() -> None:
    assert choose_transforms(999, 1000, lambda: None).engine == "arrow"
    assert choose_transforms(1000, 1000, lambda: None).engine == "spark"
