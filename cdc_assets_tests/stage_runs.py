"""A sync's work without its checks, and the lakehouse read against the source, for tests on MySQL.

On MySQL the equality checks and `verify` cannot take their consistent point with the test reader's grants yet
(FLUSH TABLES WITH READ LOCK, which RDS-like grants forbid; being reworked), so `cdc-lakehouse sync` ends in that
sentence there after capture and both stages did their work. These tests run the same capture and stage functions
the sync runs and compare current state with the source themselves, through the verify's own source reader
(`source.rows`), with no writer running: no consistent point is needed. Once consistent points work on MySQL,
`cdc.sync()` and `cdc.verify()` replace them (the MariaDB runs already use those).
"""

from __future__ import annotations

import pyarrow as pa

from cdc_assets.capture.run import CaptureReport, capture
from cdc_assets.core.names import TableRef
from cdc_assets.source.rows import read_source_table, source_shapes
from cdc_assets.stages.changes.run import process_new_batches
from cdc_assets.stages.current.apply import read_current
from cdc_assets.stages.current.run import apply_pending
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.env_settings import source_now
from spark_resources.engine import Transforms, TransformsFor


def capture_and_apply(cdc: CdcEnv, transforms: TransformsFor | None = None) -> CaptureReport:
    """Capture from the checkpoint to the binlog end, then the change logs and current state (on Arrow unless
    `transforms` says otherwise), with the settings the environment gives (CDC_MYSQL_URL, CDC_TABLES, ...)."""
    report = capture(source_now(), cdc.lakehouse)
    engine = transforms or (lambda changes: Transforms())
    process_new_batches(cdc.lakehouse, engine)
    apply_pending(cdc.lakehouse, engine)
    return report


def source_and_current(cdc: CdcEnv, name: str) -> tuple[pa.Table, pa.Table]:
    """The source table's rows (read as verify reads them) and its current-state rows, in the same columns, both
    sorted by the whole row's first column (the tests' tables have it as their key). The two must already have the
    same types: a column the lakehouse typed otherwise fails here rather than being cast to look equal."""
    table = TableRef(cdc.database, name)
    with cdc.admin() as conn:
        shape = source_shapes(conn, [table])[table]
        assert shape is not None, f"{table} is not in the source"
        source_rows = read_source_table(conn, table, list(shape.columns))
    current = read_current(cdc.lakehouse, table, [c.name for c in shape.columns])
    assert current is not None, f"{table} has no current state"
    differing = [
        f"{f.name}: source {f.type}, lakehouse {current.schema.field(f.name).type}"
        for f in source_rows.schema
        if current.schema.field(f.name).type != f.type
    ]
    assert not differing, f"{table}: types differ: {'; '.join(differing)}"  # a cast would hide them (a VARCHAR as binary)
    first = shape.columns[0].name
    return source_rows.sort_by(first), current.select(source_rows.column_names).sort_by(first)
