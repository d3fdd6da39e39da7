"""Reading the binlog as a replica, without python-mysql-replication's per-value Python decoding.

    protocol.py    the binlog dump over a MySQL connection: raw events, checksums verified
    events.py      event types and the few fields capture needs from GTID, query, XA and rotate events
    table_map.py   a TableMapEvent (with FULL row metadata) as the table's ColumnSpecs and binlog layouts
    row_images.py  row events decoded straight into canonical texts, one reader per column; PARTIAL_JSON
                   updates applied to their before-images
    json_binary.py MySQL's binary JSON printed as the server prints it, and partial JSON diffs applied
    packed.py      MySQL's packed DECIMAL and TIME, which row images and binary JSON share

Capture spends its time here: python-mysql-replication decodes ~35k row images/s on one core through
several Python calls per value; these modules decode each value in one small function and produce the
canonical text directly (mysql_types), several times faster. `cdc_assets_tests/test_binlog_decoder.py`
checks every type against python-mysql-replication and the source's own SELECT.
"""
