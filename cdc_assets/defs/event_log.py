"""Dagster's SQLite event log, writing a batch of events in one transaction per database.

A run over a range of table partitions logs a planned and a done materialization per table and asset: 800
events for 200 tables. Dagster's SQLite storage opens a database, commits and syncs for each event (tens of
milliseconds on a small VM, most of a sync's time). Dagster already hands such events over in batches when
`DAGSTER_EVENT_BATCH_SIZE` is set, but its SQLite storage then still writes them one by one; this one writes
each batch with one transaction on the run's database and one on the index. Same files, same rows: an
instance written by it reads as any other SQLite instance (`instance.py` configures it).
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster._core.events import ASSET_EVENTS, BATCH_WRITABLE_EVENTS
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._serdes import ConfigurableClassData


class BatchingSqliteEventLogStorage(SqliteEventLogStorage):
    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict
    ) -> BatchingSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """As `store_event` for each event (run database, then the asset index), in two transactions."""
        writable = all(e.is_dagster_event and e.dagster_event_type in BATCH_WRITABLE_EVENTS for e in events)
        if len(events) < 2 or not writable or len({e.run_id for e in events}) != 1:
            super().store_event_batch(events)
            return
        statements = [self.prepare_insert_event(e) for e in events]
        with self.run_connection(events[0].run_id) as conn:
            for statement in statements:
                conn.execute(statement)
        assets = [(e, s) for e, s in zip(events, statements, strict=True) if e.dagster_event_type in ASSET_EVENTS]
        if assets:
            with self.index_transaction() as conn:
                ids = []
                for _, statement in assets:
                    with db_result(conn, statement) as result:
                        ids.append(result.inserted_primary_key[0])
                self._store_asset_event_tags(conn, [e for e, _ in assets], ids)
                for (event, _), event_id in zip(assets, ids, strict=True):
                    self._store_asset_event(conn, event, event_id)
        for event, statement in zip(events, statements, strict=True):
            if event.dagster_event_type not in ASSET_EVENTS:  # an asset check's planned evaluation
                with self.index_connection() as conn, db_result(conn, statement) as result:
                    event_id = result.inserted_primary_key[0]
                self.store_asset_check_event(event, event_id)
