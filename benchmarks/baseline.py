"""The baseline: the capture loop every tutorial shows.

Read every row event with python-mysql-replication's `BinLogStreamReader`, round-trip each row through
JSON, keep the events per table, then write one combined file and one file per table. It does no
batching at transaction boundaries, keeps no checkpoint and builds no tables: it is the floor any
"hand-written binlog script" starts from, and what cdc-lakehouse is measured against.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent


@dataclass(frozen=True)
class BaselineResult:
    row_changes: int
    seconds: float
    files: int

    @property
    def rows_per_second(self) -> float:
        return self.row_changes / self.seconds if self.seconds else 0.0


def run_baseline(connection_settings: dict[str, Any], server_id: int, out_dir: Path) -> BaselineResult:
    """Capture the whole binlog the tutorial way into `out_dir`; returns what it did and how long it took."""
    began = time.monotonic()
    stream = BinLogStreamReader(
        connection_settings=connection_settings,
        server_id=server_id,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        blocking=False,
    )
    per_table: dict[str, list[dict]] = defaultdict(list)
    combined: list[dict] = []
    try:
        for event in stream:
            kind = {WriteRowsEvent: "insert", UpdateRowsEvent: "update", DeleteRowsEvent: "delete"}[type(event)]
            for row in event.rows:
                record = {"schema": event.schema, "table": event.table, "type": kind, "row": row}
                record = json.loads(json.dumps(record, default=str))
                per_table[f"{event.schema}.{event.table}"].append(record)
                combined.append(record)
    finally:
        stream.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "all_changes.jsonl").open("w") as f:
        for record in combined:
            f.write(json.dumps(record) + "\n")
    for table, records in per_table.items():
        with (out_dir / f"{table}.jsonl").open("w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return BaselineResult(len(combined), time.monotonic() - began, len(per_table) + 1)
