"""The Spark jobs of the pipeline, on the session's real SparkSession."""

import pyarrow as pa

from spark_resources.transforms import keyed_changes, latest_change_per_key


def _events(rows: list[tuple]) -> pa.Table:
    names = ["table_id", "seq", "op", "key", "before_key"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


def test_latest_change_per_key(spark) -> None:
    events = _events(
        [
            (0, 1, "insert", '["a"]', None),
            (0, 2, "update", '["a"]', '["a"]'),  # same key: an upsert
            (0, 3, "update", '["b"]', '["a"]'),  # the key moves from a to b
            (0, 4, "insert", '["c"]', None),
            (0, 5, "delete", '["c"]', '["c"]'),
            (0, 6, "insert", '["a"]', None),  # a comes back
            (1, 7, "insert", '["a"]', None),  # the same key in another table is another row
        ]
    )
    latest = latest_change_per_key(spark, events).to_pylist()
    assert sorted((r["table_id"], r["key"], r["seq"], r["action"]) for r in latest) == [
        (0, '["a"]', 6, "upsert"),
        (0, '["b"]', 3, "upsert"),
        (0, '["c"]', 5, "delete"),
        (1, '["a"]', 7, "upsert"),
    ]


def test_keyed_changes_in_one_job_over_tables(spark) -> None:
    rows = pa.table(
        {
            "seq": pa.array([1, 2, 3], pa.int64()),
            "schema": ["s", "s", "s"],
            "table": ["b", "a", "b"],
            "table_version": pa.array([1, 0, 1], pa.int32()),
            "op": ["insert", "update", "delete"],
            "before": pa.array([None, ["1", "x", "y"], ["7", "z"]], pa.list_(pa.string())),
            "after": pa.array([["7", "z"], ["1", "x2", "y"], None], pa.list_(pa.string())),
            "batch": ["b1", "b1", "b1"],
        }
    )
    keys = pa.table(
        {
            "batch": ["b1", "b1"],
            "table_version": pa.array([0, 1], pa.int32()),
            "key_idx": pa.array([[0, 2], [0]], pa.list_(pa.int32())),
        }
    )
    keyed = keyed_changes(spark, rows, keys).to_pylist()
    assert [(r["table"], r["seq"], r["key"], r["before_key"]) for r in keyed] == [
        ("a", 2, '["1","y"]', '["1","y"]'),
        ("b", 1, '["7"]', None),
        ("b", 3, '["7"]', '["7"]'),
    ]
