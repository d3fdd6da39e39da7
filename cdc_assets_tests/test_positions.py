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
