"""Benchmark workloads, generated against a dedicated local MariaDB with a fresh binlog."""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_assets.local_source import server as local_server

BENCH_DIR = Path(".local") / "bench"
CLI = str(Path(sys.executable).parent / "cdc-lakehouse")  # the command of the interpreter running the benchmark
SCHEMA = "bench"


@dataclass(frozen=True)
class WorkloadSummary:
    tables: int
    bulk_rows: int
    oltp_transactions: int

    @property
    def row_changes(self) -> int:
        return self.bulk_rows + self.oltp_transactions


def workload_options(
    parser: argparse.ArgumentParser, runs: int = 3, tables: int = 200, rows_per_table: int = 1_000, oltp: int = 50_000
) -> None:
    """Workload (a)'s size as options, the same in every benchmark that generates it (smaller by default in some)."""
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--tables", type=int, default=tables)
    parser.add_argument("--rows-per-table", type=int, default=rows_per_table)
    parser.add_argument("--oltp", type=int, default=oltp)


def generated(server: local_server.LocalServer, args: argparse.Namespace, name: str = "workload (a)") -> WorkloadSummary:
    """Workload (a) of the options' size written to the server, and said so."""
    began = time.monotonic()
    workload = mixed_tables(server, args.tables, args.rows_per_table, args.oltp)
    print(
        f"{name}: {workload.row_changes} row changes ({workload.bulk_rows} bulk-inserted, "
        f"{workload.oltp_transactions} single-row transactions) across {workload.tables} tables, "
        f"generated in {time.monotonic() - began:.0f} s",
        flush=True,
    )
    return workload


def source_env(server: local_server.LocalServer, server_id: int) -> dict[str, str]:
    """The environment of a pipeline reading the benchmark's schema as replica `server_id` (each benchmark its
    own id), on the Spark master given, local[2] by default."""
    return {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_TABLES": f"{SCHEMA}.*",
        "CDC_SERVER_ID": str(server_id),
        "CDC_SPARK_MASTER": os.environ.get("CDC_SPARK_MASTER", "local[2]"),
    }


def remove_work(work: Path | str, kept_for: str | None = None) -> None:
    """A benchmark's work folder (lakehouses, Dagster homes, a 10M-row table's files: gigabytes) removed at its
    end; kept, and named, when the run failed (`kept_for` says why), for its logs."""
    if kept_for:
        print(f"{kept_for}: its work folder is kept for its logs: {work}", flush=True)
        return
    shutil.rmtree(work, ignore_errors=True)


def fresh_server(base: Path = BENCH_DIR) -> local_server.LocalServer:
    """A dedicated MariaDB whose binlog holds only what the benchmark writes next; stopped when the benchmark's
    process ends, however it ends (a stopped server stays stopped)."""
    local_server.stop(base)
    shutil.rmtree(base, ignore_errors=True)
    server = local_server.start(base)
    atexit.register(local_server.stop, base)
    return server


def mixed_tables(
    server: local_server.LocalServer,
    tables: int = 200,
    rows_per_table: int = 1_000,
    oltp_transactions: int = 50_000,
    seed: int = 42,
) -> WorkloadSummary:
    """Workload (a): bulk multi-row inserts into `tables` tables, then single-row OLTP transactions
    (40% updates, 30% inserts, 30% deletes) spread over them at random: about 250k row changes by default."""
    rng = random.Random(seed)
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        for t in range(tables):
            cur.execute(
                f"CREATE TABLE {SCHEMA}.t{t:03d} (id INT PRIMARY KEY, name VARCHAR(40), amount DECIMAL(12,2), "
                "qty INT, updated DATETIME(6), note TEXT NULL)"
            )
        for t in range(tables):
            for start in range(0, rows_per_table, 500):
                values = ", ".join(
                    f"({i}, 'name {i}', {rng.randint(0, 10**6) / 100:.2f}, {rng.randint(0, 1000)}, "
                    f"'2026-01-01 00:00:00.{i % 1000000:06d}', {'NULL' if i % 7 else repr('note ' * 5)})"
                    for i in range(start, min(start + 500, rows_per_table))
                )
                cur.execute(f"INSERT INTO {SCHEMA}.t{t:03d} VALUES {values}")
        live = {t: list(range(rows_per_table)) for t in range(tables)}
        _oltp(cur, live, rows_per_table, rng, oltp_transactions)
    return WorkloadSummary(tables, tables * rows_per_table, oltp_transactions)


def more_oltp(server: local_server.LocalServer, tables: int, transactions: int, seed: int = 7) -> None:
    """Another round of workload (a)'s single-row transactions on the tables `mixed_tables` made, as they are
    now: what a later, incremental apply takes in."""
    rng = random.Random(seed)
    with server.admin_connection() as conn, conn.cursor() as cur:
        live: dict[int, list[int]] = {}
        for t in range(tables):
            cur.execute(f"SELECT id FROM {SCHEMA}.t{t:03d} ORDER BY id")
            live[t] = [row[0] for row in cur.fetchall()]
        next_id = max((max(ids) for ids in live.values() if ids), default=0) + 1
        _oltp(cur, live, next_id, rng, transactions)


def _oltp(cur: Any, live: dict[int, list[int]], next_id: int, rng: random.Random, transactions: int) -> None:
    """Single-row autocommit transactions at random over the tables: 40% updates, 30% inserts, 30% deletes."""
    tables = len(live)
    for _ in range(transactions):
        t = rng.randrange(tables)
        table = f"{SCHEMA}.t{t:03d}"
        roll = rng.random()
        if roll < 0.4 and live[t]:
            row = rng.choice(live[t])
            cur.execute(f"UPDATE {table} SET qty = qty + 1, amount = amount * 1.01, updated = NOW(6) WHERE id = {row}")
        elif roll < 0.7 or not live[t]:
            cur.execute(f"INSERT INTO {table} VALUES ({next_id}, 'oltp', 1.00, 1, NOW(6), NULL)")
            live[t].append(next_id)
            next_id += 1
        else:
            row = live[t].pop(rng.randrange(len(live[t])))
            cur.execute(f"DELETE FROM {table} WHERE id = {row}")
