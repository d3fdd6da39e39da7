"""`cdc-lakehouse`: sync, verify, status, snapshot, publish, export, forget and demo. It parses and prints; the runs are the Dagster
definitions' own (cdc_assets/commands/runs.py), on the persistent instance in DAGSTER_HOME (default
`.local/dagster_home`), so `make dev` shows them. Errors a user can fix end with one sentence and exit code 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from cdc_assets.cli_display import ProgressDisplay
from cdc_assets.core.errors import CdcUserError, unreachable_cause, unreachable_message
from cdc_assets.core.settings import DEFAULT_LAKEHOUSE, Settings
from cdc_assets.lake.layout import CHANGES, CURRENT, HISTORY, RAW
from cdc_assets.runtime import forked_capture
from cdc_assets.runtime.instance import ensure_dagster_home

if TYPE_CHECKING:
    from cdc_assets.commands.runs import RunOutcome
    from cdc_assets.verification.consistency import ConsistentComparison

# Dagster and the definitions are imported by each command when it runs (`_runs()`), not with this module: a sync
# from the command line forks its capture before (cdc_assets.runtime.forked_capture).

_IMPORTED = time.time()  # when /proc cannot say when the process started

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_NOT_COMPARED = 3  # verify: nothing differs, but a table could not be compared (it says why)
# commands that show their progress (cli_display): with -v, the run's own log lines say it instead
LONG_COMMANDS = frozenset({"sync", "repair", "snapshot", "verify", "demo"})


# The options every command takes, before or after the command's name: flag, type, help.
GLOBAL_OPTIONS: tuple[tuple[str, type, str], ...] = (
    ("--source", str, "a MySQLSource component of the Dagster project here, by name: its settings, not CDC_* variables"),
    ("--mysql-url", str, "source URL (overrides CDC_MYSQL_URL)"),
    ("--lakehouse", str, "local directory or s3://bucket/prefix (overrides CDC_LAKEHOUSE)"),
    ("--tables", str, "schema.table globs to include (overrides CDC_TABLES)"),
    ("--exclude-tables", str, "schema.table globs to exclude (overrides CDC_EXCLUDE_TABLES)"),
    ("--server-id", int, "replica server id (overrides CDC_SERVER_ID)"),
    ("--spark-master", str, "Spark master or sc:// remote (overrides CDC_SPARK_MASTER)"),
    ("--rabbitmq-url", str, "amqp://user:password@host:port/vhost: turns the RabbitMQ sink on (CDC_RABBITMQ_URL)"),
    ("--rabbitmq-exchange", str, "exchange the RabbitMQ sink publishes to (CDC_RABBITMQ_EXCHANGE)"),
    ("--rabbitmq-tables", str, "schema.table globs the RabbitMQ sink publishes (CDC_RABBITMQ_TABLES)"),
    ("--rabbitmq-exclude-tables", str, "schema.table globs it leaves out (CDC_RABBITMQ_EXCLUDE_TABLES)"),
    ("--kinesis-stream", str, "stream name: turns the Kinesis sink on (CDC_KINESIS_STREAM)"),
    ("--kinesis-tables", str, "schema.table globs the Kinesis sink publishes (CDC_KINESIS_TABLES)"),
    ("--kinesis-exclude-tables", str, "schema.table globs it leaves out (CDC_KINESIS_EXCLUDE_TABLES)"),
    ("--sink-dedup-seconds", float, "collapse repeated updates of a key (CDC_SINK_DEDUP_SECONDS)"),
    ("--sink-heartbeat-seconds", float, "heartbeat message interval (CDC_SINK_HEARTBEAT_SECONDS)"),
)


def _add_global_options(parser: argparse.ArgumentParser, *, given_after_command: bool) -> None:
    """GLOBAL_OPTIONS and -v. After the command's name, an option left out must not overwrite the value given
    before it: its default there is argparse's SUPPRESS (no attribute at all)."""
    for flag, kind, text in GLOBAL_OPTIONS:
        parser.add_argument(flag, type=kind, default=argparse.SUPPRESS if given_after_command else None, help=text)
    verbose_unset = argparse.SUPPRESS if given_after_command else False
    parser.add_argument("-v", "--verbose", action="store_true", default=verbose_unset, help="show Dagster's run log")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdc-lakehouse",
        description="MySQL binlog -> raw batches -> per-table change logs -> current-state Delta tables.",
    )
    _add_global_options(parser, given_after_command=False)
    sub = parser.add_subparsers(dest="command", required=True)
    sync = sub.add_parser("sync", help="capture to the binlog end, update change logs and current state, run checks")
    sync.add_argument("--max-batch-rows", type=int, help="row changes per raw batch (CDC_MAX_BATCH_ROWS)")
    verify = sub.add_parser("verify", help="compare current-state tables with the source row for row")
    verify.add_argument("verify_tables", nargs="*", metavar="TABLE", help="schema.table (default: every table)")
    snapshot = sub.add_parser("snapshot", help="load existing rows into current state at a consistent binlog position")
    snapshot.add_argument("snapshot_tables", nargs="*", metavar="TABLE", help="schema.table (default: every table)")
    repair = sub.add_parser(
        "repair", help="re-read from the source only the rows of tables that differ, recorded as `repair` changes"
    )
    repair.add_argument("repair_tables", nargs="+", metavar="TABLE", help="schema.table")
    publish = sub.add_parser("publish", help="publish new changes of the change logs to the sinks (default: every configured one)")
    publish.add_argument("publish_sinks", nargs="*", metavar="SINK", help="rabbitmq, kinesis (default: every configured sink)")
    run = sub.add_parser("run", help="continuous mode in the foreground: capture and apply as the binlog grows, until stopped")
    run.add_argument("--poll-seconds", type=float, help="how long an idle follower waits before it looks again (0.5)")
    sub.add_parser("stop", help="stop the continuous mode after its cycle in progress, and wait until it has")
    export = sub.add_parser("export", help="write a table as it was at a time or seq to a Parquet file")
    export.add_argument("export_table", metavar="TABLE", help="schema.table")
    export.add_argument("--as-of", required=True, help="an ISO time (UTC unless it has an offset) or seq:N")
    export.add_argument("--to", required=True, help="the Parquet file to write")
    forget = sub.add_parser(
        "forget",
        help="remove every row and version of some keys of a table from every layer and from storage; or, with "
        "--rewrite-policies, rewrite its earlier layers under column policies added since it was captured",
    )
    forget.add_argument("forget_table", metavar="TABLE", help="schema.table")
    forget.add_argument(
        "--key", action="append", dest="forget_keys", metavar="KEY",
        help="a primary key: its value, or a JSON array of the values of a composite key ('[42, \"abc\"]'); repeatable",
    )  # fmt: skip
    forget.add_argument("--keys-file", metavar="FILE", help="a file of keys, one a line, written as --key takes them")
    forget.add_argument(
        "--rewrite-policies", action="store_true",
        help="no key: apply the column policies added since the table was captured to its earlier layers",
    )  # fmt: skip
    status = sub.add_parser("status", help="checkpoint, lag, tables, last batch and freshness")
    status.add_argument("--json", action="store_true", help="print JSON")
    demo_command = sub.add_parser("demo", help="local source + live workload + sync until caught up + verify")
    demo_command.add_argument("--seconds", type=float, default=20.0, help="how long the live workload runs")
    demo_command.add_argument("--seed", type=int, default=0)
    demo_command.add_argument(
        "--sinks", action="store_true", help="also publish to a local RabbitMQ and a local Kinesis, and read them back"
    )
    for command in sub.choices.values():  # `cdc-lakehouse sync -v` as well as `cdc-lakehouse -v sync`
        _add_global_options(command, given_after_command=True)
    return parser


# The flags that set a variable, by argparse's name for them: they win over the environment in the settings the
# command builds (core.settings.Settings.from_env) and passes on: to its commands, its forked child, its runs.
FLAG_VARIABLES = {
    "mysql_url": "CDC_MYSQL_URL",
    "lakehouse": "CDC_LAKEHOUSE",
    "tables": "CDC_TABLES",
    "exclude_tables": "CDC_EXCLUDE_TABLES",
    "server_id": "CDC_SERVER_ID",
    "spark_master": "CDC_SPARK_MASTER",
    "max_batch_rows": "CDC_MAX_BATCH_ROWS",
    "rabbitmq_url": "CDC_RABBITMQ_URL",
    "rabbitmq_exchange": "CDC_RABBITMQ_EXCHANGE",
    "rabbitmq_tables": "CDC_RABBITMQ_TABLES",
    "rabbitmq_exclude_tables": "CDC_RABBITMQ_EXCLUDE_TABLES",
    "kinesis_stream": "CDC_KINESIS_STREAM",
    "kinesis_tables": "CDC_KINESIS_TABLES",
    "kinesis_exclude_tables": "CDC_KINESIS_EXCLUDE_TABLES",
    "sink_dedup_seconds": "CDC_SINK_DEDUP_SECONDS",
    "sink_heartbeat_seconds": "CDC_SINK_HEARTBEAT_SECONDS",
}
# Flags whose URL may hold a password, and how the variable that takes it instead is written.
URL_FLAGS = {"mysql_url": "mysql://user:password@host:port", "rabbitmq_url": "amqp://user:password@host:port/vhost"}
_given_by_flag: dict[str, str] = {}  # variable -> the flag that gave its value in this command


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def flag_texts(args: argparse.Namespace) -> dict[str, str]:
    """The variables the flags give, as texts: they win over the environment's in the command's settings. A URL
    flag holding a password is refused: any user of the machine could read it in the process list (`ps`), and the
    runs' resources would hold it as a value rather than as the EnvVar a password must stay (defs/resources.py)."""
    _given_by_flag.clear()
    for dest, example in URL_FLAGS.items():
        value = getattr(args, dest, None)
        if value and urlparse(value).password is not None:
            variable, flag = FLAG_VARIABLES[dest], flag_name(dest)
            raise CdcUserError(
                f"{flag} holds a password, which any user of this machine can read in the process list (ps) while "
                f"the command runs: set {variable} in the environment instead (export {variable}='{example}'), or "
                f"give {flag} a URL without a password."
            )
    texts = {}
    for dest, variable in FLAG_VARIABLES.items():
        value = getattr(args, dest, None)
        if value is not None:
            texts[variable] = str(value)
            _given_by_flag[variable] = flag_name(dest)
    return texts


def named_as_given(sentence: str, given_by_flag: dict[str, str]) -> str:
    """An error sentence with each variable whose value a flag gave named as that flag (`CDC_LAKEHOUSE=x` ->
    `--lakehouse x`): the user gave the flag, not the variable. The sentences are written once, with the
    variables' names; this is the one place they are turned into flags."""
    for variable, flag in given_by_flag.items():
        sentence = re.sub(rf"\b{variable}=", f"{flag} ", sentence)
        sentence = re.sub(rf"\b{variable}\b", flag, sentence)
    return sentence


def _say_error(sentence: str) -> None:
    print(f"error: {named_as_given(sentence, _given_by_flag)}", file=sys.stderr)


def process_started() -> float:
    """When this process started (epoch seconds), interpreter start-up and imports included: from Linux's /proc,
    the system's uptime less the process's start in clock ticks since boot (both on the boot clock, to 10 ms),
    else when this module was imported. Not /proc/stat's boot time plus the start: that boot time is whole
    seconds, and put the printed time up to a second off the wall time, either way, from one boot to the next."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        return time.time() - max(0.0, since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED


_began = _IMPORTED  # when the command began: the process's start from the command line, else main's call


def wall_seconds() -> float:
    """Seconds since the command began: what a user timing it sees."""
    return max(0.0, time.time() - _began)


def main(argv: list[str] | None = None) -> int:
    global _began
    # From the command line (no argv given), the time a command prints is the process's whole wall time.
    _began = process_started() if argv is None else time.time()
    args = _parser().parse_args(argv)
    args.from_command_line = argv is None
    environment: dict[str, str] = dict(os.environ)
    try:
        flags = flag_texts(args)
        environment |= flags
        # every setting read and range-checked once, here: a bad value ends the command before any work starts,
        # whoever would read it; the value is what every command, child and run is given
        if args.source:
            # the project's defs.yaml files; Dagster's resolver is imported only here, for a named source
            from cdc_assets.components.project import named_source_settings

            settings = named_source_settings(args.source, Path.cwd(), os.environ, flags)
            environment = dict(settings.environment)
        else:
            settings = Settings.from_env(environment)
        ensure_dagster_home(settings.lakehouse.location)  # the lakehouse's own, or a sentence before a sync forks
        with ProgressDisplay(every=settings.progress_seconds) if _shows_progress(args) else nullcontext():
            return COMMANDS[args.command](args, settings)
    except CdcUserError as exc:
        _say_error(str(exc))
        return EXIT_USER_ERROR
    except Exception as exc:  # outside a run (the lakehouse's listings before and after): the same one sentence
        reason = unreachable_cause(exc)
        if reason is None:
            raise
        lakehouse = environment.get("CDC_LAKEHOUSE") or DEFAULT_LAKEHOUSE
        _say_error(unreachable_message(lakehouse, environment.get("AWS_ENDPOINT_URL"), reason))
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted: the checkpoint holds the last complete batch; run the command again to continue.")
        return EXIT_FAILED


def _shows_progress(args: argparse.Namespace) -> bool:
    """Long commands show their progress (cli_display), but with -v, where the run's log lines say it; a snapshot
    where the output is no terminal prints its run's log lines (chunks read, rows, rows/s) as it always did."""
    if args.command not in LONG_COMMANDS or args.verbose:
        return False
    return args.command != "snapshot" or sys.stdout.isatty()


def _runs() -> ModuleType:
    from cdc_assets.commands import runs

    return runs


def _print_sync(outcome: RunOutcome, seconds: float | None = None) -> None:
    from cdc_assets.defs.assets.metadata import policy_warnings_of
    from cdc_assets.defs.keys import CHANGES_TABLE_PREFIX, CURRENT_TABLE_PREFIX, RAW_ASSET

    raw = outcome.of(RAW_ASSET)
    changes = outcome.totals(CHANGES_TABLE_PREFIX, "changes")
    current = outcome.totals(CURRENT_TABLE_PREFIX, "changes_in")
    print(
        f"captured {raw.get('batches', 0)} raw batches ({raw.get('rows', 0)} row changes, "
        f"{raw.get('table_count', 0)} tables) up to {raw.get('last_position', '?')}"
    )
    print(
        f"change logs: {changes.get('changes', 0)} changes appended to {changes.get('tables_changed', 0)} tables "
        f"({changes.get('inserts', 0)} inserts, {changes.get('updates', 0)} updates, {changes.get('deletes', 0)} deletes)"
    )
    print(
        f"current state: {current.get('tables_changed', 0)} tables updated ({current.get('rows_inserted', 0)} rows inserted, "
        f"{current.get('rows_updated', 0)} updated, {current.get('rows_deleted', 0)} deleted)"
    )
    _print_sinks(outcome)
    for sentence in outcome.quarantined:
        print(f"quarantined: {sentence}")
    for problem in outcome.failed_checks:
        print(f"failed: {problem}")
    for warning in [*policy_warnings_of(raw.get("policy_warnings")), *outcome.warnings]:  # a column policy added
        print(f"warning: {warning}")
    took = outcome.seconds if seconds is None else seconds
    print(f"sync {'succeeded' if outcome.success else 'FAILED'} in {took:.1f}s")


def _print_sinks(outcome: RunOutcome) -> None:
    from cdc_assets.defs.keys import SINK_KEY_PREFIX

    for name, values in sorted(outcome.metadata.items()):
        if not name.startswith(f"{SINK_KEY_PREFIX}/"):
            continue
        print(
            f"sink {name.split('/', 1)[1]}: {values.get('messages', 0)} messages ({values.get('bytes', 0):,} bytes) "
            f"acknowledged by {values.get('destination', '?')}, up to seq {values.get('last_seq', 0)}, "
            f"{values.get('pending_changes', 0)} changes pending"
        )


def _exit_code(outcome: RunOutcome) -> int:
    """2 when a sink could not publish (its sentence on stderr; the rest of the work is done), else 0 or 1."""
    for sentence in outcome.user_errors:
        _say_error(sentence)
    if outcome.user_errors:
        return EXIT_USER_ERROR
    return EXIT_OK if outcome.success else EXIT_FAILED


def cmd_sync(args: argparse.Namespace, settings: Settings) -> int:
    run_id = str(uuid.uuid4())
    if args.from_command_line:  # a process of its own: its capture starts now, in a child, beside Dagster's import
        forked_capture.start(run_id, settings)
    outcome = _runs().run_sync(settings, args.verbose, run_id)
    _print_sync(outcome, wall_seconds())
    return _exit_code(outcome)


def cmd_publish(args: argparse.Namespace, settings: Settings) -> int:
    outcome = _runs().run_publish(settings, args.publish_sinks or None, args.verbose)
    _print_sinks(outcome)
    for problem in outcome.failed_checks:
        print(f"failed: {problem}")
    # the command's wall time, and its runs' own (what benchmarks/sinks.py rates the publishing by)
    print(f"publish {'succeeded' if outcome.success else 'FAILED'} in {wall_seconds():.1f}s (runs {outcome.seconds:.1f}s)")
    return _exit_code(outcome)


def cmd_repair(args: argparse.Namespace, settings: Settings) -> int:
    from cdc_assets.defs.keys import RAW_ASSET

    outcome = _runs().run_repair(settings, args.repair_tables, args.verbose)
    found = outcome.of_observation(RAW_ASSET, "repair")
    for line in (found.get("repaired") or {}).values():
        print(f"repair: {line}")
    if found.get("position"):
        print(f"repair: written at {found['position']}")
    _print_sync(outcome, wall_seconds())
    return _exit_code(outcome)


def cmd_snapshot(args: argparse.Namespace, settings: Settings) -> int:
    from cdc_assets.defs.keys import CURRENT_TABLE_PREFIX

    outcome = _runs().run_snapshot(settings, args.snapshot_tables, not _shows_progress(args))
    loaded = {
        metadata.get("source_table", key): metadata
        for key, metadata in outcome.metadata.items()
        if key.startswith(f"{CURRENT_TABLE_PREFIX}/") and "snapshot_rows" in metadata
    }
    for table, metadata in sorted(loaded.items()):
        print(f"{table}: {metadata['snapshot_rows']} rows loaded")
    if _shows_progress(args):  # else the run's log lines said it already
        for _, metadata in sorted(loaded.items()):
            if metadata.get("history_gap"):
                print(f"warning: {metadata['history_gap']}")
    for problem in outcome.failed_checks:
        print(f"failed: {problem}")
    position = next((m["snapshot_position"] for m in loaded.values()), "?")
    rows = sum(m["snapshot_rows"] for m in loaded.values())
    print(
        f"snapshot {'succeeded' if outcome.success else 'FAILED'} at {position} "
        f"({len(loaded)} tables, {rows} rows) in {wall_seconds():.1f}s"
    )
    return EXIT_OK if outcome.success else EXIT_FAILED


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    diffs = _runs().run_verify(settings, args.verify_tables or None)
    if not diffs:
        print("no tables to verify yet: run `cdc-lakehouse sync` first")
        return EXIT_OK
    code = _print_comparisons(diffs, "ok")
    differ, unseen = sum(d.differs or bool(d.clear_left) for d in diffs), sum(bool(d.not_compared) for d in diffs)
    print(
        f"{sum(d.ok and not d.clear_left for d in diffs)} of {len(diffs)} tables match the source"
        + (f", {differ} differ" if differ else "")
        + (f", {unseen} not compared" if unseen else "")
    )
    if code != EXIT_OK:
        behind = _runs().collect_status(settings).lag_bytes
        if behind:
            print(f"note: the lakehouse is {behind} bytes of binlog behind the source; run `cdc-lakehouse sync` first")
    return code


def _print_comparisons(diffs: list[ConsistentComparison], ok_word: str) -> int:
    """One line a table, led by its verdict; the exit code: 1 when one differs, else 3 when one could not be
    compared (it never counts as equal), else 0."""
    label = {"ok": ok_word, "differs": "DIFFERS", "not compared": "NOT COMPARED"}
    for diff in diffs:  # clear values a policy added since still covers differ from today's source (not a check's failure)
        print(f"{label['differs' if diff.clear_left else diff.status]:13s}{diff.describe()}")
    if any(d.differs or d.clear_left for d in diffs):
        return EXIT_FAILED
    return EXIT_NOT_COMPARED if any(d.not_compared for d in diffs) else EXIT_OK


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    rows = _runs().run_export(settings, args.export_table, args.as_of, args.to)
    print(f"{args.export_table} as of {args.as_of}: {rows} rows written to {args.to}")
    return EXIT_OK


def cmd_forget(args: argparse.Namespace, settings: Settings) -> int:
    from cdc_assets.commands.forget import run_forget

    if args.rewrite_policies:
        return _rewrite_policies(args, settings)
    record, outcome = run_forget(settings, args.forget_table, args.forget_keys, args.keys_file)
    if record is None:
        return _run_failed(outcome)
    layers = record.layers
    raw = layers[RAW]
    print(
        f"forgot {len(record.key_hashes)} key{'s' if len(record.key_hashes) != 1 else ''} of {record.table}: "
        f"{raw.rows_removed} row changes in {raw.files_rewritten} raw batches, "
        + ", ".join(f"{layers[layer].rows_removed} rows of {layer}/" for layer in (CHANGES, CURRENT, HISTORY))
        + f"; {sum(c.files_purged for c in layers.values())} files of older versions removed from storage"
    )
    print(f"recorded in {record.key} (hashes of the keys, never a key)")
    for sink in record.published_by:
        print(
            f"sink {sink}: had published changes of these keys, and cannot unsend them: ask its consumers to "
            "forget them too"
        )
    print("note: the source's binary logs hold these rows until they are purged (PURGE BINARY LOGS on the source)")
    return EXIT_OK


def _run_failed(outcome: RunOutcome) -> int:
    """A forget run that failed on something no sentence names: what failed (the full error is in the run)."""
    for problem in outcome.failed_checks or ["the run failed"]:
        print(f"failed: {problem}")
    return EXIT_FAILED


def _rewrite_policies(args: argparse.Namespace, settings: Settings) -> int:
    """`forget TABLE --rewrite-policies`: the column policies added since capture applied to the earlier layers."""
    from cdc_assets.commands.forget import run_rewrite_policies

    if args.forget_keys or args.keys_file:
        raise CdcUserError("--rewrite-policies takes no key: run it alone, and forget keys with a run of their own.")
    record, outcome = run_rewrite_policies(settings, args.forget_table)
    if not outcome.success:
        return _run_failed(outcome)
    if record is None:
        print(f"{args.forget_table}: no column policy was added to it since it was captured: nothing to rewrite")
        return EXIT_OK
    layers, words = record.layers, {"exclude": "excluded", "hash": "hashed", "mask": "masked"}
    columns = ", ".join(f"{name} ({words[rule]})" for name, rule in sorted(record.columns.items()))
    print(
        f"rewrote {record.table} under the column policies on {columns}: {layers[RAW].files_rewritten} raw batches, "
        + ", ".join(f"{layers[layer].files_rewritten} files of {layer}/" for layer in (CHANGES, CURRENT, HISTORY))
        + f"; {sum(c.files_purged for c in layers.values())} files of older versions removed from storage"
    )
    print(f"recorded in {record.key}")
    print("note: sinks cannot unsend the clear values they published before the policy, and the source's binary logs "
          "hold them until they are purged (PURGE BINARY LOGS on the source)")
    return EXIT_OK


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    if args.poll_seconds is not None and args.poll_seconds <= 0:
        raise CdcUserError(f"--poll-seconds {args.poll_seconds:g} is not a positive number of seconds: use e.g. 0.5.")
    # SIGTERM as Ctrl-C (Dagster does the same while the run goes): the follower ends its cycle, then the run stops
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    print("continuous mode: following the binlog; stop it with Ctrl-C, `cdc-lakehouse stop` or the UI", flush=True)
    outcome = _runs().run_continuous(settings, args.poll_seconds, args.verbose)
    for problem in outcome.failures:
        print(f"failed: {problem}")
    if not outcome.stopped:
        print(f"continuous mode FAILED after {outcome.seconds:.1f}s (run {outcome.run_id[:8]})")
        return EXIT_FAILED
    print(f"{_runs().STOPPED} after {outcome.seconds:.1f}s (run {outcome.run_id[:8]}); the next start goes on from the checkpoint")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace, settings: Settings) -> int:
    print(_runs().stop_continuous(settings))
    return EXIT_OK


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    status = _runs().collect_status(settings)
    if args.json:
        print(json.dumps(status.to_json(), indent=1))
        return EXIT_OK
    tables, windows = status.tables, status.freshness_windows_minutes
    print(f"lakehouse:   {status.lakehouse}")
    print(f"checkpoint:  {status.checkpoint or 'none (next sync starts at the oldest binlog)'}")
    if status.gtid:  # MySQL: the executed GTID set up to the checkpoint; MariaDB: the last GTID of each domain
        print(f"GTIDs:       {status.gtid}")
    print(f"binlog end:  {status.binlog_end}")
    print(f"lag:         {status.lag_bytes} bytes, {status.lag_seconds} s")
    print(f"raw batches: {status.raw_batches} (last: {status.last_batch or '-'})")
    print(f"tables:      {len(tables)}" + (f" ({', '.join(tables)})" if tables else ""))
    for key, age in status.seconds_since_materialized.items():
        print(f"freshness:   {key} " + ("never materialized" if age is None else f"materialized {age:.0f}s ago"))
    print(f"             (warn after {windows['warn']:g} min, fail after {windows['fail']:g} min)")
    for table, lag in status.table_lag_seconds.items():
        print(f"lag:         {table} {lag:.0f} s behind")
    for name, sink in status.sinks.items():
        print(
            f"sink:        {name} -> {sink['destination']}: up to seq {sink['last_seq']}, {sink['messages']} messages, "
            f"{sink['pending_changes']} changes pending, {sink['lag_seconds']:.0f} s behind"
        )
    for table, done in status.snapshots_in_progress.items():
        print(
            f"snapshot:    {table} stopped after {done['chunks_read']} of {done['chunks']} chunks "
            f"({done['rows']:,} rows): run `cdc-lakehouse snapshot {table}` to resume it"
        )
    for sentence in status.quarantined.values():
        print(f"quarantined: {sentence}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from cdc_assets.commands import demo  # the local brokers' and source's clients: only the demo pays for them

    began = time.monotonic()
    result = demo.run_demo(
        settings, args.seconds, args.seed, args.verbose, say=print, synced=_print_progress, sinks=args.sinks
    )
    _print_sync(result.last)
    if not result.last.success:
        return _exit_code(result.last)
    code = _print_comparisons(result.comparisons, "verified")
    _demo_summary(result.settings or settings, result.comparisons, result.syncs, time.monotonic() - began)
    for sink, delivery in result.deliveries.items():
        print(f"  {sink + ':':9s} read back: {delivery.describe()}")
    if result.sample is not None:
        print("  a message as consumers get it (RabbitMQ routing key " + str(result.sample.routing_key) + "):")
        print("    " + json.dumps(result.sample.body, ensure_ascii=False))
    if not all(d.ok for d in result.deliveries.values()):
        return EXIT_FAILED
    return code


def _print_progress(outcome: RunOutcome) -> None:
    from cdc_assets.defs.keys import CURRENT_TABLE_PREFIX, RAW_ASSET

    raw = outcome.of(RAW_ASSET)
    current = outcome.totals(CURRENT_TABLE_PREFIX, "changes_in")
    print(
        f"  sync: {raw.get('rows', 0)} row changes captured, {current.get('changes_in', 0)} applied "
        f"to {current.get('tables', 0)} tables in {outcome.seconds:.1f}s"
    )


def _demo_summary(settings: Settings, diffs: list[ConsistentComparison], syncs: int, seconds: float) -> None:
    from cdc_assets.commands import demo

    lakehouse = demo.lakehouse_location(settings)
    print()
    print("summary")
    print(f"  tables:   {len(diffs)} ({sum(d.ok for d in diffs)} verified equal to the source)")
    print(f"  rows:     {sum(d.source_rows for d in diffs)} in current state")
    print(f"  changes:  {demo.changes_captured(settings)} row changes captured in total ({syncs} syncs this run)")
    print(f"  seconds:  {seconds:.1f}")
    print(f"  delta:    {lakehouse}/{CURRENT}/<schema>/<table> (current state)")
    print(f"            {lakehouse}/{CHANGES}/<schema>/<table> (change logs), raw batches in {lakehouse}/{RAW}/")
    if settings.name is None:  # the `demo` source: make dev's Dagster home is its lakehouse's, with these runs
        print("  UI:       run `make dev`, then open http://127.0.0.1:3000 (assets, lineage and these runs)")
    else:  # a second demo source: make dev shows its assets and the runs it launches, in the first demo's home
        flavour = settings.source.demo_flavour
        print(f"  UI:       run `make dev SOURCE={flavour}`, then open http://127.0.0.1:3000 ({settings.name}'s assets and lineage)")


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "sync": cmd_sync,
    "verify": cmd_verify,
    "status": cmd_status,
    "run": cmd_run,
    "stop": cmd_stop,
    "snapshot": cmd_snapshot,
    "repair": cmd_repair,
    "publish": cmd_publish,
    "export": cmd_export,
    "forget": cmd_forget,
    "demo": cmd_demo,
}


def run() -> None:
    """The `cdc-lakehouse` command: `main`, then the exit a normal one makes (other threads joined, atexit
    handlers run, output flushed) without the interpreter's teardown of every module after it. That teardown (the
    imported Dagster, pyarrow, deltalake and their native runtimes) took ~0.4 s after the command had printed its
    time; the operating system frees the same memory at once."""
    import atexit
    import threading

    code = main()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
