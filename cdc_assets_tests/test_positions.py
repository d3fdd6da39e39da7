"""Binlog positions and batch names, without a server."""

from cdc_assets.core.positions import BinlogPosition, binlog_file_number


def test_positions_order_across_files() -> None:
    a = BinlogPosition("mysql-bin.000009", 999_999)
    b = BinlogPosition("mysql-bin.000010", 4)
    assert a < b and a <= b and not b < a
    assert binlog_file_number("binlog.1000042") == 1000042


def test_batch_names_sort_as_text_in_binlog_order() -> None:
    positions = [
        BinlogPosition("mysql-bin.000010", 4),
        BinlogPosition("mysql-bin.000009", 123_456_789),
        BinlogPosition("mysql-bin.000009", 4),
        BinlogPosition("mysql-bin.000100", 4),
    ]
    assert sorted(p.batch_name() for p in positions) == [p.batch_name() for p in sorted(positions)]
    assert BinlogPosition("mysql-bin.000001", 4).batch_name() == "0000000001-000000000004"


def test_a_batch_written_at_a_position_sorts_between_the_batches_read_around_it() -> None:
    """A repair's batch starts where the last batch read from the binlog ends (H) and ends at H's next step: its
    name, and its objects' keys in a listing, sort after the batch that ends at H and before the next one read."""
    from cdc_assets.core.positions import BinlogPosition

    before, at = BinlogPosition("mysql-bin.000001", 4), BinlogPosition("mysql-bin.000001", 5180)
    names = [before.batch_name(), at.batch_name(), at.next_step().batch_name(), at.next_step().next_step().batch_name()]
    assert names == sorted(names) and len(set(names)) == 4
    keys = [f"raw/{n}/manifest.json" for n in names]
    assert keys == sorted(keys)
    assert at.next_step() == at and at.next_step().step == 1  # the same place: equal, and not after it
    assert BinlogPosition.from_json(at.next_step().to_json()).step == 1
