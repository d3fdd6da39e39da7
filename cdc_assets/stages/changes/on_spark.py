"""The change-log stage on Spark: tasks read the raw batches, key, type and write each table's new change-log
files (cdc_assets/stages/changes/spark_tasks.py); this process only plans from the manifests and commits each table's
files in one Delta commit. Imported only when a run takes Spark, so an Arrow run never loads pyspark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import MAX_SEQ_KEY, file_paths, max_seq, table_configuration
from cdc_assets.lake.files import add_actions, commit_files
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.locks import Lease
from cdc_assets.lake.raw_batches import BatchManifest
from cdc_assets.lake.state import TableProgress
from cdc_assets.lake.store import Lakehouse
from cdc_assets.stages.changes.log import CHANGE_LOG_FILE_BYTES, AppendResult
from cdc_assets.stages.changes.plan import ChangesReport, plan_piece, record_progress
from cdc_assets.stages.changes.rows import change_log_schema, conform_to_log, log_target_schema, unified_schema
from cdc_assets.stages.changes.spark_tasks import ChangeLogTargets, write_change_logs
from spark_resources.files_job import compact_tables, rewrite_files


def process_on_spark(
    lakehouse: Lakehouse,
    session: Callable[[], Any],
    manifests: list[BatchManifest],
    starts: dict[str, str | None],
    progress: dict[str, TableProgress],
    report: ChangesReport,
    lease: Lease,
    log: Any | None,
) -> None:
    """The whole run on Spark: tasks read the raw batches, key, type and write each table's new change-log
    files; this process only plans (from the manifests) and commits each table's files in one Delta commit.
    A column whose type changed makes the tasks rewrite the table's older files too (the same commit)."""
    store = lakehouse.store
    newest: dict[str, TableShape] = {}
    plan = plan_piece([(m, None, (None, None)) for m in manifests], starts, progress, newest)
    tables = sorted({str(shape.table) for shape in plan.versions.values()})
    opened = dict(zip(tables, for_each_table(tables, lambda t: lakehouse.open(CHANGES, TableRef.parse(t))), strict=True))
    schemas: dict[str, pa.Schema] = {}
    rewrite: set[str] = set()
    for table in tables:
        versions = [(key, shape) for key, shape in plan.versions.items() if str(shape.table) == table]
        incoming = unified_schema([change_log_schema(shape, key in plan.ddl) for key, shape in versions])
        existing = opened[table]
        current = pa.schema(existing.schema().to_arrow()) if existing is not None else None
        schemas[table], retyped = log_target_schema(current, incoming)
        if retyped:
            rewrite.add(table)
    if tables:
        access = lakehouse.file_access()
        spark = session()
        targets = ChangeLogTargets(access, {t: max_seq(opened[t]) for t in tables}, schemas, plan.versions, plan.ddl)
        keys = plan.table_keys()
        batches = [(m.name, m.data_file, m.data_sha256) for m, _ in plan.reads]
        statement_rows = pa.concat_tables(plan.statement_rows) if plan.statement_rows else None
        written = write_change_logs(spark, batches, starts, statement_rows, keys, targets)
        report.rows_in += sum(m.rows for m, _ in plan.reads) + len(plan.statement_rows)

        def commit(table: str) -> AppendResult | None:
            ref, existing = TableRef.parse(table), opened[table]
            files = [w for w in written if w["table"] == table]
            key = lakehouse.table_key(CHANGES, ref)
            rewritten: list[dict] = []
            if table in rewrite and existing is not None:  # a MODIFY COLUMN: the older rows take the new type
                target = schemas[table]
                paths = [[p] for p in file_paths(existing)]
                rewritten = rewrite_files(spark, access, key, table, paths, lambda rows: conform_to_log(rows, target))
            if not files and not rewritten:
                return None
            lease.check()  # a lease lost to another run means: commit nothing more
            new_max = max([w["max_seq"] for w in files] or [targets.watermarks[table] or 0])
            commit_files(
                existing, lakehouse.table_uri(CHANGES, ref), lakehouse.storage_options(), key, schemas[table],
                add_actions(files + rewritten), [], MAX_SEQ_KEY, new_max, table_configuration(schemas[table]),
                overwrite=bool(rewritten),
            )  # fmt: skip
            return AppendResult(
                ref, sum(w["rows"] for w in files), sum(w["inserts"] for w in files),
                sum(w["updates"] for w in files), sum(w["deletes"] for w in files), new_max,
            )  # fmt: skip

        for result in for_each_table(tables, commit):
            if result is not None:
                report.appended[str(result.table)] = result
        appended = [TableRef.parse(t) for t in sorted(report.appended)]
        compact_tables(lakehouse, spark, CHANGES, appended, CHANGE_LOG_FILE_BYTES, MAX_SEQ_KEY)  # one job for all
    if manifests:
        lease.check()
        record_progress(store, starts, progress, newest, manifests[-1].name)
        report.batches.extend(m.name for m in manifests)
    if log is not None:
        appended = sum(r.appended for r in report.appended.values())
        log.info(f"change logs on spark: {appended} changes appended to {len(report.appended)} tables")
