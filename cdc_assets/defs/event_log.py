"""Dagster's SQLite event log, writing a batch of events in one transaction per database.

A run over a range of table partitions logs a planned and a done materialization per table and asset: 800
events for 200 tables. Dagster's SQLite storage opens a database, commits and syncs for each event (tens of
milliseconds on a small VM, most of a sync's time). Dagster already hands such events over in batches when
`DAGSTER_EVENT_BATCH_SIZE` is set, but its SQLite storage then still writes them one by one; this one writes
each batch with one transaction on the run's database and one on the index. Same files, same rows: an
instance written by it reads as any other SQLite instance (`instance.py` configures it).

`log_batch` hands a step's own events over as one such batch: the per-table materializations and check evaluations
a run records for hundreds of tables (Dagster batches only the outputs of partitioned assets, and writes a check's
evaluation one by one). Both reach into Dagster's internals, the only place the project does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dagster import AssetCheckEvaluation, AssetMaterialization, AssetObservation
from dagster._core.events import (
    ASSET_EVENTS,
    BATCH_WRITABLE_EVENTS,
    DagsterEvent,
    DagsterEventBatchMetadata,
    DagsterEventType,
    generate_event_batch_id,
)
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._serdes import ConfigurableClassData, serialize_value

CHECK_EVALUATION = DagsterEventType.ASSET_CHECK_EVALUATION


def log_batch(context: Any, events: Sequence[AssetMaterialization | AssetObservation | AssetCheckEvaluation]) -> None:
    """Log a step's asset events and check evaluations as one batch (as `context.log_event` each, in the run's
    events too): with DAGSTER_EVENT_BATCH_SIZE set, the instance hands them to the storage together."""
    op_context = getattr(context, "op_execution_context", context)
    step = op_context._step_execution_context  # noqa: SLF001
    batch_id = generate_event_batch_id()
    for i, event in enumerate(events):
        batch = DagsterEventBatchMetadata(batch_id, i == len(events) - 1)
        if isinstance(event, AssetMaterialization):
            logged = DagsterEvent.asset_materialization(step, event, batch)
        elif isinstance(event, AssetObservation):
            logged = DagsterEvent.asset_observation(step, event, batch)
        else:
            verdict = "passed" if event.passed else "did not pass"
            message = f"Asset check '{event.check_name}' on '{event.asset_key.to_user_string()}' {verdict}."
            logged = DagsterEvent.from_step(CHECK_EVALUATION, step, event, message, batch)
        op_context._events.append(logged)  # noqa: SLF001  what log_event does: the step yields them too


class BatchingSqliteEventLogStorage(SqliteEventLogStorage):
    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict
    ) -> BatchingSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        """As `store_event` for each event (run database, then the asset index), in two transactions."""
        kinds = BATCH_WRITABLE_EVENTS | {CHECK_EVALUATION}
        writable = all(e.is_dagster_event and e.dagster_event_type in kinds for e in events)
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
        evaluations = [(e, s) for e, s in zip(events, statements, strict=True) if e.dagster_event_type == CHECK_EVALUATION]
        if evaluations:
            with self.index_transaction() as conn:
                for event, statement in evaluations:
                    with db_result(conn, statement) as result:
                        self._store_check_evaluation(conn, event, result.inserted_primary_key[0])
        for event, statement in zip(events, statements, strict=True):
            if event.dagster_event_type not in ASSET_EVENTS and event.dagster_event_type != CHECK_EVALUATION:
                # an asset check's planned evaluation
                with self.index_connection() as conn, db_result(conn, statement) as result:
                    event_id = result.inserted_primary_key[0]
                self.store_asset_check_event(event, event_id)

    def _store_check_evaluation(self, conn: Any, event: EventLogEntry, event_id: int) -> None:
        """As Dagster's `_update_asset_check_evaluation`, on the batch's connection: the execution row its planned
        event made (the check ran as a step), else a new one (an evaluation a run records for a table's asset)."""
        evaluation: AssetCheckEvaluation = event.get_dagster_event().event_specific_data  # type: ignore[assignment]
        status = AssetCheckExecutionRecordStatus.SUCCEEDED if evaluation.passed else AssetCheckExecutionRecordStatus.FAILED
        target = evaluation.target_materialization_data
        values = {
            "execution_status": status.value,
            "evaluation_event": serialize_value(event),
            "evaluation_event_timestamp": datetime.fromtimestamp(event.timestamp, UTC).replace(tzinfo=None),
            "evaluation_event_storage_id": event_id,
            "materialization_event_storage_id": target.storage_id if target else None,
        }
        table = AssetCheckExecutionsTable.c
        partition = table.partition.is_(None) if evaluation.partition is None else table.partition == evaluation.partition
        updated = conn.execute(
            AssetCheckExecutionsTable.update()
            .where(
                table.asset_key == evaluation.asset_key.to_string(),
                table.check_name == evaluation.check_name,
                table.run_id == event.run_id,
                partition,
            )
            .values(**values)
        ).rowcount
        if updated == 0:
            conn.execute(
                AssetCheckExecutionsTable.insert().values(
                    asset_key=evaluation.asset_key.to_string(),
                    check_name=evaluation.check_name,
                    run_id=event.run_id,
                    partition=evaluation.partition,
                    **values,
                )
            )
