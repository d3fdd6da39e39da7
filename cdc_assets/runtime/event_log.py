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

All of it is an optimisation of the embedded default, our own SQLite dagster.yaml (`instance.py`), never needed for
correctness: `CDC_EVENT_BATCHES=0` leaves it out, and a user's own instance (PostgreSQL storage) never loads it. The
steps log through `step_events.log_batch`, which comes here only when the instance's event log is this one.

Two more fixed costs of Dagster's SQLite storage are cut here, both measured on a small `sync`:
- each connection was a new engine and a new SQLite connection, closed after one statement; closing the last
  connection of a WAL database checkpoints and removes its WAL file, so every event paid an open, a checkpoint and
  a close. Inside `connections_kept_open()` (the CLI's runs, `commands/runs.py`) this storage keeps one connection per
  database (the run's and the index; at most OPEN_DATABASES) and reuses it, under the storage's own lock as
  before, and closes them all when the block ends; outside it, a connection is closed after each use, as
  Dagster's. Not always: SQLite's locks are POSIX locks, which a process drops on any close of the file, also by
  code that is not SQLite (a scan of DAGSTER_HOME, a copy), and a connection kept open across that can corrupt
  the database once another process writes it (a test that scans DAGSTER_HOME for passwords found this).
- its commits wait for no fsync of their own (`_no_sync_per_commit`).
- every new database (one per run) and every storage opened looked up alembic's head revision by loading all of
  Dagster's migration scripts again (~50 ms each); `share_alembic_scripts` loads them once per process.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory
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
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.sqlalchemy_compat import db_result
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._serdes import ConfigurableClassData, serialize_value
from sqlalchemy import create_engine
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool, StaticPool

from cdc_assets.runtime.empty_home import RUN_DATABASE, cache_complete, cache_dir, place

OPEN_DATABASES = 8  # connections kept open per storage: the index and the most recently used runs' databases

_scripts: dict[tuple[str | None, str | None], ScriptDirectory] = {}
_scripts_lock = threading.Lock()
_from_config = ScriptDirectory.from_config.__func__  # type: ignore[attr-defined]


def _shared_from_config(cls: type[ScriptDirectory], config: Config) -> ScriptDirectory:
    """One ScriptDirectory (and so one load of the migration scripts) per scripts' location: Dagster's run, event
    log and schedule storages each have an alembic Config of their own, all naming the same scripts, which do not
    change while the process runs."""
    key = (config.get_main_option("script_location"), config.get_main_option("version_locations"))
    with _scripts_lock:
        script = _scripts.get(key)
        if script is None:
            script = _scripts[key] = _from_config(cls, config)
        return script


def share_alembic_scripts() -> None:
    """Make alembic load Dagster's migration scripts once per process (idempotent). Called before our instance is
    opened (`instance.enable_event_batches`), so the run and schedule storages take it too, and by the storage itself
    (where Dagster loads it: `make dev`'s webserver and daemon); never at import, nor for an instance of another kind."""
    ScriptDirectory.from_config = classmethod(_shared_from_config)  # type: ignore[method-assign,assignment]


def _no_sync_per_commit(dbapi_connection: Any, _record: Any) -> None:
    """WAL with synchronous=NORMAL: a commit is not flushed to disk on its own, only at WAL checkpoints. The
    database stays consistent whatever happens; an operating-system crash or power loss (not a killed process)
    may lose the last events written before it. Each event used to wait for its own fsyncs."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()

CHECK_EVALUATION = DagsterEventType.ASSET_CHECK_EVALUATION


def _seed_run_database(path: Path) -> None:
    """A new run's database as a copy of the cached empty one (runtime/instance.py), when there is one: Dagster's
    set-up then finds its tables and revision in place."""
    if path.exists() or path.stem == INDEX_SHARD_NAME:
        return
    if cache_complete():
        place(cache_dir() / RUN_DATABASE, path)


def empty_run_database(dagster: Any, path: Path) -> Path:
    """An empty run database at `path`, as Dagster's SQLite event log creates one (for the cache)."""
    engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
    try:
        SqliteEventLogStorage._initdb(dagster.event_log_storage, engine)
    finally:
        engine.dispose()
    return path


def log_batch(context: Any, events: Sequence[AssetMaterialization | AssetObservation | AssetCheckEvaluation]) -> None:
    """Log a step's asset events and check evaluations as one batch (as `context.log_event` each, in the run's
    events too): with DAGSTER_EVENT_BATCH_SIZE set, the instance hands them to the storage together. On an instance
    whose event log is not ours, `context.log_event` each (another storage's batch write takes no check evaluations)."""
    if not getattr(context.instance.event_log_storage, "writes_event_batches", False):
        for event in events:
            context.log_event(event)
        return
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
    writes_event_batches = True  # what `step_events.log_batch` looks for

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None) -> None:
        share_alembic_scripts()
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._kept_open = 0  # how many connections_kept_open() blocks are running
        super().__init__(base_dir, inst_data)
        _storages.add(self)

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict
    ) -> BatchingSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> Engine:
        """The shard's engine: one connection, kept open (StaticPool); used only under `_db_lock`."""
        engine = self._engines.pop(shard, None)
        if engine is None:
            if shard not in self._initialized_dbs:  # Dagster's set-up, on connections of its own
                _seed_run_database(Path(self.path_for_shard(shard)))
                first = create_engine(
                    self.conn_string_for_shard(shard),
                    poolclass=NullPool,
                    connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
                )
                self._initdb(first)
                first.dispose()
                self._initialized_dbs.add(shard)
            engine = create_engine(
                self.conn_string_for_shard(shard),
                poolclass=StaticPool,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            )
            sqlalchemy_event.listen(engine, "connect", _no_sync_per_commit)
        self._engines[shard] = engine
        while len(self._engines) > OPEN_DATABASES:
            self._engines.popitem(last=False)[1].dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:
            engine = self._engine(shard)
            try:
                with engine.connect() as conn, conn.begin():
                    yield conn
            finally:
                if not self._kept_open:
                    self._engines.pop(shard, None)
                    engine.dispose()

    @contextmanager
    def connections_kept_open(self) -> Iterator[None]:
        """Within this block, keep each database's connection open from one use to the next (a run's hundreds of
        events each open, checkpoint and close it otherwise); close them all when it ends."""
        with self._db_lock:
            self._kept_open += 1
        try:
            yield
        finally:
            with self._db_lock:
                self._kept_open -= 1
            if not self._kept_open:
                self.close_databases()

    def close_databases(self) -> None:
        """Close every connection kept open (at exit, and when the instance is disposed)."""
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()

    def dispose(self) -> None:
        self.close_databases()
        super().dispose()

    def __del__(self) -> None:  # a storage dropped without dispose() closes its databases too
        engines: Any = getattr(self, "_engines", None)
        while engines:
            engines.popitem()[1].dispose()

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

_storages: weakref.WeakSet[BatchingSqliteEventLogStorage] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for storage in list(_storages):
        storage.close_databases()
