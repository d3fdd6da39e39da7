"""`cdc-lakehouse`: sync, verify, status, snapshot and demo, driving the same Dagster definitions as the UI.

Runs go to the persistent instance in DAGSTER_HOME (default `.local/dagster_home`), so `make dev`
shows them. Errors a user can fix end with one sentence and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
DEMO_TRANSACTIONS_PER_SECOND = 40


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdc-lakehouse",
        description="MySQL binlog -> raw batches -> per-table change logs -> current-state Delta tables.",
    )
    parser.add_argument("--mysql-url", help="source URL (overrides CDC_MYSQL_URL)")
    parser.add_argument("--lakehouse", help="local directory or s3://bucket/prefix (overrides CDC_LAKEHOUSE)")
    parser.add_argument("--tables", help="schema.table globs to include (overrides CDC_TABLES)")
    parser.add_argument("--exclude-tables", help="schema.table globs to exclude (overrides CDC_EXCLUDE_TABLES)")
    parser.add_argument("--server-id", type=int, help="replica server id (overrides CDC_SERVER_ID)")
    parser.add_argument("--spark-master", help="Spark master or sc:// remote (overrides CDC_SPARK_MASTER)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Dagster's run log")
    sub = parser.add_subparsers(dest="command", required=True)
    sync = sub.add_parser("sync", help="capture to the binlog end, update change logs and current state, run checks")
    sync.add_argument("--max-batch-rows", type=int, help="row changes per raw batch (CDC_MAX_BATCH_ROWS)")
    verify = sub.add_parser("verify", help="compare current-state tables with the source row for row")
    verify.add_argument("verify_tables", nargs="*", metavar="TABLE", help="schema.table (default: every table)")
    snapshot = sub.add_parser("snapshot", help="load existing rows into current state at a consistent binlog position")
    snapshot.add_argument("snapshot_tables", nargs="*", metavar="TABLE", help="schema.table (default: every table)")
    status = sub.add_parser("status", help="checkpoint, lag, tables, last batch and freshness")
    status.add_argument("--json", action="store_true", help="print JSON")
    demo = sub.add_parser("demo", help="local source + live workload + sync until caught up + verify")
    demo.add_argument("--seconds", type=float, default=20.0, help="how long the live workload runs")
    demo.add_argument("--seed", type=int, default=0)
    return parser


def _apply_overrides(args: argparse.Namespace) -> None:
    """CLI flags win over the environment; they are passed as environment so they never enter run config."""
    for flag, env in (
        ("mysql_url", "CDC_MYSQL_URL"),
        ("lakehouse", "CDC_LAKEHOUSE"),
        ("tables", "CDC_TABLES"),
        ("exclude_tables", "CDC_EXCLUDE_TABLES"),
        ("server_id", "CDC_SERVER_ID"),
        ("spark_master", "CDC_SPARK_MASTER"),
        ("max_batch_rows", "CDC_MAX_BATCH_ROWS"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            os.environ[env] = str(value)


def _dagster_home() -> Path:
    from cdc_assets.instance import ensure_dagster_home

    return ensure_dagster_home()


_instances: dict[str, object] = {}


def _instance() -> object:
    """The persistent Dagster instance of DAGSTER_HOME, opened once per process and kept open."""
    from dagster import DagsterInstance

    home = str(_dagster_home())
    if home not in _instances:
        _instances[home] = DagsterInstance.get()
    return _instances[home]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _apply_overrides(args)
    from cdc_assets.errors import CdcUserError

    try:
        return COMMANDS[args.command](args)
    except CdcUserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted: the checkpoint holds the last complete batch; run the command again to continue.")
        return EXIT_FAILED


# -- sync ----------------------------------------------------------------------------------------------


@dataclass
class SyncOutcome:
    success: bool
    metadata: dict[str, dict[str, object]]
    failed_checks: list[str]
    seconds: float


def _user_error_message(error: object) -> str | None:
    """The sentence of the CdcUserError behind a Dagster step failure (walking the error's causes)."""
    from cdc_assets.errors import CdcUserError

    def subclasses(cls: type) -> set[str]:
        return {cls.__name__}.union(*(subclasses(c) for c in cls.__subclasses__()))

    user_errors = subclasses(CdcUserError)
    while error is not None:
        if getattr(error, "cls_name", None) in user_errors:
            message = str(getattr(error, "message", "")).strip()
            prefixes = tuple(user_errors) + ("cdc_assets.",)
            return message.split(": ", 1)[1] if message.startswith(prefixes) else message
        error = getattr(error, "cause", None) or getattr(error, "context", None)
    return None


def run_job(
    job_name: str,
    verbose: bool = False,
    op_config: dict[str, object] | None = None,
    tags: dict[str, str] | None = None,
    partition_key: str | None = None,
) -> SyncOutcome:
    """One run of a job of the definitions on the persistent instance; raises CdcUserError for what a user can fix."""
    from dagster import DagsterEventType

    from cdc_assets.definitions import build_definitions, initialized_resources
    from cdc_assets.errors import CdcUserError

    _dagster_home()
    resources = initialized_resources()
    resources["binlog"].preflight()  # type: ignore[attr-defined]
    resources["lakehouse"].get().check_writable()  # type: ignore[attr-defined]
    job = build_definitions().resolve_job_def(job_name)
    began = time.monotonic()
    run_config: dict[str, object] = {
        "loggers": {"console": {"config": {"log_level": "INFO" if verbose else "CRITICAL"}}}
    }
    if op_config:
        run_config["ops"] = op_config
    result = job.execute_in_process(
        instance=_instance(),  # type: ignore[arg-type]
        run_config=run_config,
        raise_on_error=False,
        tags={"cdc/trigger": "cli", **(tags or {})},
        partition_key=partition_key,
    )
    failures = []
    for event in result.all_events:
        if event.event_type == DagsterEventType.STEP_FAILURE:
            error = event.step_failure_data.error
            user_message = _user_error_message(error)
            if user_message:
                raise CdcUserError(user_message)
            failures.append(f"{event.step_key}: {error.message.strip() if error else 'failed'}")
    metadata = {}
    for event in result.all_events:
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            metadata[materialization.asset_key.to_user_string()] = {
                k: getattr(v, "value", v) for k, v in materialization.metadata.items()
            }
    failed_checks = [
        f"{e.asset_key.to_user_string()}:{e.check_name}" for e in result.get_asset_check_evaluations() if not e.passed
    ]
    success = result.success and not failed_checks
    return SyncOutcome(success, metadata, failed_checks + failures, time.monotonic() - began)


def run_sync(verbose: bool = False) -> SyncOutcome:
    """Capture, then one apply run per consecutive range of the tables with new changes, each with its checks."""
    from cdc_assets.definitions import APPLY_JOB_NAME, CAPTURE_JOB_NAME, initialized_resources
    from cdc_assets.partitions import TABLES_PARTITIONS_NAME, touched_ranges
    from cdc_assets.sensors import apply_run_request
    from cdc_assets.stages import CURRENT_STAGE
    from cdc_assets.state import known_tables, tables_behind

    outcome = run_job(CAPTURE_JOB_NAME, verbose)
    if not outcome.success:
        return outcome
    lakehouse = initialized_resources()["lakehouse"].get()  # type: ignore[attr-defined]
    instance = _instance()
    existing = list(instance.get_dynamic_partitions(TABLES_PARTITIONS_NAME))  # type: ignore[attr-defined]
    new = [t for t in known_tables(lakehouse.store) if t not in existing]
    if new:
        instance.add_dynamic_partitions(TABLES_PARTITIONS_NAME, new)  # type: ignore[attr-defined]
    pending = set(tables_behind(lakehouse.store, CURRENT_STAGE))  # captured, not yet in current state
    for first, last in touched_ranges(existing + new, pending):
        request = apply_run_request(first, last, run_key="cli")
        applied = run_job(APPLY_JOB_NAME, verbose, tags=dict(request.tags), partition_key=request.partition_key)
        outcome = _combine(outcome, applied)
        if not applied.success:
            break
    return outcome


def _combine(a: SyncOutcome, b: SyncOutcome) -> SyncOutcome:
    """Two runs' outcomes as one: numbers added, per-table details merged."""
    metadata = {k: dict(v) for k, v in a.metadata.items()}
    for asset, values in b.metadata.items():
        merged = metadata.setdefault(asset, {})
        for key, value in values.items():
            old = merged.get(key)
            if isinstance(value, dict) and isinstance(old, dict):
                merged[key] = {**old, **value}
            elif isinstance(value, int | float) and isinstance(old, int | float) and not isinstance(value, bool):
                merged[key] = old + value
            else:
                merged[key] = value
    return SyncOutcome(a.success and b.success, metadata, a.failed_checks + b.failed_checks, a.seconds + b.seconds)


def _print_sync(outcome: SyncOutcome) -> None:
    raw = outcome.metadata.get("raw_binlog_batches", {})
    changes = outcome.metadata.get("table_changes", {})
    current = outcome.metadata.get("current_tables", {})
    print(
        f"captured {raw.get('batches', 0)} raw batches ({raw.get('rows', 0)} row changes, "
        f"{raw.get('table_count', 0)} tables) up to {raw.get('last_position', '?')}"
    )
    print(
        f"change logs: {changes.get('rows_out', 0)} changes appended to {changes.get('tables_changed', 0)} tables "
        f"({changes.get('inserts', 0)} inserts, {changes.get('updates', 0)} updates, {changes.get('deletes', 0)} deletes)"
    )
    print(
        f"current state: {current.get('tables_changed', 0)} tables updated ({current.get('rows_inserted', 0)} rows inserted, "
        f"{current.get('rows_updated', 0)} updated, {current.get('rows_deleted', 0)} deleted)"
    )
    for problem in outcome.failed_checks:
        print(f"failed: {problem}")
    print(f"sync {'succeeded' if outcome.success else 'FAILED'} in {outcome.seconds:.1f}s")


def cmd_sync(args: argparse.Namespace) -> int:
    outcome = run_sync(args.verbose)
    _print_sync(outcome)
    return EXIT_OK if outcome.success else EXIT_FAILED


# -- snapshot ------------------------------------------------------------------------------------------


def cmd_snapshot(args: argparse.Namespace) -> int:
    from cdc_assets.definitions import SNAPSHOT_JOB_NAME

    outcome = run_job(
        SNAPSHOT_JOB_NAME, args.verbose, {"snapshot_tables": {"config": {"tables": args.snapshot_tables}}}
    )
    current = outcome.metadata.get("current_tables", {})
    per_table = current.get("per_table") or {}
    for table, rows in sorted(per_table.items()):  # type: ignore[union-attr]
        print(f"{table}: {rows} rows loaded")
    for problem in outcome.failed_checks:
        print(f"failed: {problem}")
    print(
        f"snapshot {'succeeded' if outcome.success else 'FAILED'} at {current.get('snapshot_position', '?')} "
        f"({current.get('tables', 0)} tables, {current.get('rows', 0)} rows) in {outcome.seconds:.1f}s"
    )
    return EXIT_OK if outcome.success else EXIT_FAILED


# -- verify --------------------------------------------------------------------------------------------


def run_verify(tables: list[str] | None = None) -> list:
    import pymysql

    from cdc_assets import source
    from cdc_assets.definitions import initialized_resources
    from cdc_assets.verify import verify_consistent

    resources = initialized_resources()
    url = resources["binlog"].url()  # type: ignore[attr-defined]
    try:
        return verify_consistent(resources["binlog"], resources["lakehouse"].get(), tables)  # type: ignore[arg-type, attr-defined]
    except pymysql.err.MySQLError as exc:  # e.g. no SELECT privilege
        raise source.describe_error(exc, url) from exc


def cmd_verify(args: argparse.Namespace) -> int:
    diffs = run_verify(args.verify_tables or None)
    if not diffs:
        print("no tables to verify yet: run `cdc-lakehouse sync` first")
        return EXIT_OK
    for diff in diffs:
        print(("ok       " if diff.ok else "DIFFERS  ") + diff.describe())
    bad = [d for d in diffs if not d.ok]
    print(f"{len(diffs) - len(bad)} of {len(diffs)} tables match the source")
    if bad:
        behind = collect_status()["lag_bytes"]
        if behind:
            print(f"note: the lakehouse is {behind} bytes of binlog behind the source; run `cdc-lakehouse sync` first")
    return EXIT_FAILED if bad else EXIT_OK


# -- status --------------------------------------------------------------------------------------------


def collect_status() -> dict[str, object]:
    from dagster import AssetKey

    from cdc_assets.definitions import initialized_resources
    from cdc_assets.freshness import freshness_windows
    from cdc_assets.lag import capture_lag, table_lags
    from cdc_assets.raw_batch import list_batches
    from cdc_assets.state import known_tables

    _dagster_home()
    resources = initialized_resources()
    lakehouse = resources["lakehouse"].get()  # type: ignore[attr-defined]
    now = time.time()
    lag = capture_lag(resources["binlog"], lakehouse, now)  # type: ignore[arg-type]
    checkpoint = lag.checkpoint
    batches = list_batches(lakehouse.store)
    freshness = {}
    instance = _instance()
    for key in ("raw_binlog_batches", "table_changes", "current_tables"):
        event = instance.get_latest_materialization_event(AssetKey(key))  # type: ignore[attr-defined]
        freshness[key] = None if event is None else round(time.time() - event.timestamp, 1)
    return {
        "lakehouse": str(lakehouse),
        "checkpoint": str(checkpoint.position) if checkpoint else None,
        "binlog_end": str(lag.binlog_end),
        "lag_bytes": lag.lag_bytes,
        "lag_seconds": round(lag.seconds, 1) if checkpoint else 0.0,
        "next_seq": checkpoint.next_seq if checkpoint else None,
        "gtid": checkpoint.gtid if checkpoint else None,
        "tables": known_tables(lakehouse.store),
        "table_lag_seconds": {t: round(v, 1) for t, v in table_lags(lakehouse, lag.seconds, now).items()},
        "freshness_windows_minutes": dict(zip(("warn", "fail"), freshness_windows(), strict=True)),
        "raw_batches": len(batches),
        "last_batch": batches[-1] if batches else None,
        "seconds_since_materialized": freshness,
    }


def cmd_status(args: argparse.Namespace) -> int:
    status = collect_status()
    if args.json:
        print(json.dumps(status, indent=1))
        return EXIT_OK
    print(f"lakehouse:   {status['lakehouse']}")
    print(f"checkpoint:  {status['checkpoint'] or 'none (next sync starts at the oldest binlog)'}")
    print(f"binlog end:  {status['binlog_end']}")
    print(f"lag:         {status['lag_bytes']} bytes, {status['lag_seconds']} s")
    print(f"raw batches: {status['raw_batches']} (last: {status['last_batch'] or '-'})")
    tables = status["tables"]
    print(f"tables:      {len(tables)}" + (f" ({', '.join(tables)})" if tables else ""))  # type: ignore[arg-type]
    windows = status["freshness_windows_minutes"]
    fresh = status["seconds_since_materialized"]
    for key, age in fresh.items():  # type: ignore[union-attr]
        print(f"freshness:   {key} " + ("never materialized" if age is None else f"materialized {age:.0f}s ago"))
    print(f"             (warn after {windows['warn']:g} min, fail after {windows['fail']:g} min)")  # type: ignore[index]
    for table, lag in status["table_lag_seconds"].items():  # type: ignore[union-attr]
        print(f"lag:         {table} {lag:.0f} s behind")
    return EXIT_OK


# -- demo ----------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from cdc_assets.local_source import Workload, load_sample_schema, server
    from cdc_assets.settings import LOCAL_SOURCE_DIR

    began = time.monotonic()
    local = server.start(Path.cwd() / LOCAL_SOURCE_DIR)
    os.environ["CDC_MYSQL_URL"] = local.reader_url()
    print(f"source: local MariaDB with ROW binlog on 127.0.0.1:{local.port}")
    with local.admin_connection(autocommit=False) as conn:
        load_sample_schema(conn)
        workload = Workload(conn, seed=args.seed + int(time.time()))
        workload.seed()
    _guard_demo_lakehouse(local)

    stop = threading.Event()
    writer = threading.Thread(target=_live_workload, args=(local, args.seed, stop), daemon=True)
    writer.start()
    print(f"live workload running for {args.seconds:.0f}s while the pipeline syncs")
    syncs = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        outcome = run_sync(args.verbose)
        syncs += 1
        _print_progress(outcome)
        if not outcome.success:
            _print_sync(outcome)
            return EXIT_FAILED
    stop.set()
    writer.join()
    print("workload stopped; catching up")
    outcome = run_sync(args.verbose)
    syncs += 1
    _print_sync(outcome)
    if not outcome.success:
        return EXIT_FAILED
    diffs = run_verify()
    for diff in diffs:
        print(("verified " if diff.ok else "DIFFERS  ") + diff.describe())
    return _demo_summary(diffs, syncs, time.monotonic() - began)


def _print_progress(outcome: SyncOutcome) -> None:
    raw = outcome.metadata.get("raw_binlog_batches", {})
    current = outcome.metadata.get("current_tables", {})
    print(
        f"  sync: {raw.get('rows', 0)} row changes captured, {current.get('changes_in', 0)} applied "
        f"to {current.get('tables', 0)} tables in {outcome.seconds:.1f}s"
    )


def _live_workload(local: object, seed: int, stop: threading.Event) -> None:
    from cdc_assets.local_source import Workload

    with local.admin_connection(autocommit=False) as conn:  # type: ignore[attr-defined]
        Workload(conn, seed=seed + 1).run_until(stop, pause_s=1.0 / DEMO_TRANSACTIONS_PER_SECOND)


def _guard_demo_lakehouse(local: object) -> None:
    """A lakehouse built from an earlier, since deleted, demo server would resume at a wrong position."""
    from cdc_assets.definitions import initialized_resources
    from cdc_assets.errors import CdcUserError
    from cdc_assets.lakehouse import STATE, MissingObject

    lakehouse = initialized_resources()["lakehouse"].get()  # type: ignore[attr-defined]
    instance = (local.base_dir / "instance_id").read_text().strip()  # type: ignore[attr-defined]
    key = f"{STATE}/demo_source_instance"
    try:
        recorded = lakehouse.store.get(key).decode().strip()
    except MissingObject:
        recorded = None
    if recorded is None:
        from cdc_assets.state import load_checkpoint

        if load_checkpoint(lakehouse.store) is not None:
            raise CdcUserError(
                f"The lakehouse at {lakehouse} was built from another source: remove it or set "
                "CDC_LAKEHOUSE to a new directory for the demo."
            )
        lakehouse.store.put(key, instance.encode())
    elif recorded != instance:
        raise CdcUserError(
            f"The lakehouse at {lakehouse} was built from an earlier demo server that no longer exists: remove it "
            "(rm -rf lakehouse) or set CDC_LAKEHOUSE to a new directory."
        )


def _demo_summary(diffs: list, syncs: int, seconds: float) -> int:
    from cdc_assets.definitions import initialized_resources
    from cdc_assets.lakehouse import CHANGES, CURRENT
    from cdc_assets.state import load_checkpoint

    lakehouse = initialized_resources()["lakehouse"].get()  # type: ignore[attr-defined]
    checkpoint = load_checkpoint(lakehouse.store)
    changes = (checkpoint.next_seq - 1) if checkpoint else 0
    ok = all(d.ok for d in diffs)
    rows = sum(d.source_rows for d in diffs)
    print()
    print("summary")
    print(f"  tables:   {len(diffs)} ({sum(d.ok for d in diffs)} verified equal to the source)")
    print(f"  rows:     {rows} in current state")
    print(f"  changes:  {changes} row changes captured in total ({syncs} syncs this run)")
    print(f"  seconds:  {seconds:.1f}")
    print(f"  delta:    {lakehouse}/{CURRENT}/<schema>/<table> (current state)")
    print(f"            {lakehouse}/{CHANGES}/<schema>/<table> (change logs), raw batches in {lakehouse}/raw/")
    print("  UI:       run `make dev`, then open http://127.0.0.1:3000 (assets, lineage and these runs)")
    return EXIT_OK if ok else EXIT_FAILED


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "sync": cmd_sync,
    "verify": cmd_verify,
    "status": cmd_status,
    "snapshot": cmd_snapshot,
    "demo": cmd_demo,
}


if __name__ == "__main__":
    sys.exit(main())
