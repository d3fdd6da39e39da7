"""Issue 45's measure: what a sync costs as the same changes spread over more tables.

    .venv/bin/python -m benchmarks.table_count [--tables 20,200,1000] [--rows-per-table 100] [--changes 8000]

For each table count N, on a fresh MariaDB (its binlog holds only this N's work): N tables of `--rows-per-table`
rows each; a first `cdc-lakehouse sync` from an empty lakehouse, with the tutorial baseline's capture of the same
binlog beside it; then `--changes` single-row autocommit transactions (workload (a)'s mix: 40% UPDATE, 30% INSERT,
30% DELETE) spread at random over the N tables, and an incremental `sync -v`, which also says where its time went.
Each sync and the baseline are whole processes, timed by a parent (interpreter start-up included), on the default
settings: Arrow, a local lakehouse.
`verify` then confirms each lakehouse equal to its source. The ratios are each N's against the smallest N's, taken
in this one invocation. The issue's targets: an incremental sync over 1,000 tables at most 2.0x the same over 20,
over 10,000 at most 5x, and a first sync of 1,000 tables no slower than the baseline.

`--s3` also runs each sync into a second lakehouse on S3 (moto_server over HTTP, as the tests use it), reading the
same binlog as another replica, right after the local one: its seconds beside the local sync's (the target: at most
2x), and the S3 requests each sync made (counted by the S3 server, benchmarks/counted_s3.py), in all and per table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from benchmarks.counted_s3 import COUNTS_PATH
from benchmarks.run import BASELINE, child, timed
from benchmarks.workloads import CLI, fresh_server, mixed_tables, more_oltp, remove_work, source_env
from cdc_assets.local_source.processes import free_port, listening

READER_SERVER_ID = 4250
S3_READER_SERVER_ID = 4251
BUCKET = "bench"


@dataclass
class LocalS3:
    """moto's S3 counting its requests (benchmarks/counted_s3.py): the AWS_* settings that reach it."""

    env: dict[str, str]

    def requests(self) -> Counter[str]:
        """The requests answered so far, by HTTP method."""
        with urllib.request.urlopen(f"{self.env['AWS_ENDPOINT_URL']}{COUNTS_PATH}", timeout=30) as answer:
            return Counter(json.loads(answer.read()))


@contextmanager
def local_s3() -> Iterator[LocalS3]:
    import boto3

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.counted_s3", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the local S3 (benchmarks.counted_s3) did not start")
            time.sleep(0.1)
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
        }  # fmt: skip
        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)  # fmt: skip
        yield LocalS3(env)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _on_s3(s3: LocalS3, env: dict[str, str], flags: tuple[str, ...]) -> tuple[float, Counter[str]]:
    """A sync into the S3 lakehouse: its seconds and the S3 requests it made, by method and what they reached."""
    before = s3.requests()
    seconds, _ = timed_sync(env, *flags)
    return seconds, s3.requests() - before


def timed_sync(env: dict[str, str], *flags: str) -> tuple[float, str]:
    """A sync's wall seconds, and the line of `sync -v` that says where its time went (empty without -v)."""
    done = timed(env, CLI, "sync", *flags)
    if done["code"] != 0:
        raise SystemExit(f"sync failed:\n{done['out']}{done['err']}")
    split = [line for line in done["out"].splitlines() if "where the time went: " in line]
    return float(done["seconds"]), split[-1].split("where the time went: ", 1)[1] if split else ""


def measure(tables: int, rows_per_table: int, changes: int, work: str, s3: LocalS3 | None = None) -> dict[str, float]:
    """One table count's figures: the first sync, the baseline's capture of the same binlog, the incremental sync;
    with `s3`, the same syncs into a lakehouse on S3, and their requests."""
    server = fresh_server()
    began = time.monotonic()
    mixed_tables(server, tables, rows_per_table, 0)
    print(f"{tables} tables of {rows_per_table} rows generated in {time.monotonic() - began:.0f} s", flush=True)
    env = {
        **source_env(server, READER_SERVER_ID),
        "CDC_LAKEHOUSE": tempfile.mkdtemp(prefix=f"lake-{tables}-", dir=work),
        "DAGSTER_HOME": tempfile.mkdtemp(prefix=f"dh-{tables}-", dir=work),
    }
    began = time.monotonic()  # the baseline's whole process, as the sync's: like with like
    child(BASELINE.format(server_id=READER_SERVER_ID), {**env, "OUT_DIR": tempfile.mkdtemp(dir=work)})
    baseline = time.monotonic() - began
    on_s3 = None if s3 is None else {
        **env, **s3.env, "CDC_LAKEHOUSE": f"s3://{BUCKET}/lake-{tables}", "CDC_SERVER_ID": str(S3_READER_SERVER_ID),
        "DAGSTER_HOME": tempfile.mkdtemp(prefix=f"dh-s3-{tables}-", dir=work),
    }  # fmt: skip
    first, _ = timed_sync(env)
    s3_first = _on_s3(s3, on_s3, ()) if s3 is not None and on_s3 is not None else None
    began = time.monotonic()
    more_oltp(server, tables, changes)
    print(f"{changes} single-row transactions over {tables} tables written in {time.monotonic() - began:.0f} s", flush=True)
    incremental, split = timed_sync(env, "-v")  # -v: the same sync, which also says where its time went
    s3_incremental = _on_s3(s3, on_s3, ("-v",)) if s3 is not None and on_s3 is not None else None
    for where in (env, on_s3) if on_s3 is not None else (env,):
        verified = timed(where, CLI, "verify")
        if verified["code"] != 0:
            raise SystemExit(f"verify failed after the syncs of {tables} tables:\n{verified['out']}{verified['err']}")
    figures = {"first": first, "baseline": baseline, "incremental": incremental}
    if s3_first is not None and s3_incremental is not None:
        first_requests, requests = sum(s3_first[1].values()), sum(s3_incremental[1].values())
        figures |= {"s3_first": s3_first[0], "s3_first_requests": first_requests}
        figures |= {"s3_incremental": s3_incremental[0], "s3_incremental_requests": requests}
        by_kind = ", ".join(f"{kind} {n / tables:.1f}" for kind, n in s3_incremental[1].most_common())
        print(
            f"  {tables} tables on S3: first sync {s3_first[0]:.1f} s, {first_requests} requests; incremental sync "
            f"{s3_incremental[0]:.1f} s, {requests} requests ({requests / tables:.1f} a table touched: {by_kind})",
            flush=True,
        )
    print(
        f"  {tables} tables: first sync {first:.1f} s (baseline capture {figures['baseline']:.1f} s), "
        f"incremental sync of {changes} changes {incremental:.1f} s; verify: equal\n"
        f"    where the incremental sync's time went: {split}",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", default="20,200,1000", help="comma-separated table counts, smallest first")
    parser.add_argument("--rows-per-table", type=int, default=100)
    parser.add_argument("--changes", type=int, default=8_000)
    parser.add_argument("--s3", action="store_true", help="also each sync into a lakehouse on S3 (moto_server)")
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.tables.split(","))
    work = tempfile.mkdtemp(prefix="cdc-bench-tables-")
    kept_for = None
    try:
        with local_s3() if args.s3 else nullcontext() as s3:
            results = {n: measure(n, args.rows_per_table, args.changes, work, s3) for n in counts}
    except BaseException:
        kept_for = "a run failed"
        raise
    finally:
        remove_work(work, kept_for)
    smallest = results[counts[0]]
    print()
    print(f"| tables | first sync (s) | baseline capture (s) | first / baseline | incremental sync, {args.changes} changes (s) | incremental / {counts[0]} tables |")
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        print(
            f"| {n:,} | {r['first']:.1f} | {r['baseline']:.1f} | {r['first'] / r['baseline']:.2f} | "
            f"{r['incremental']:.1f} | {r['incremental'] / smallest['incremental']:.2f}x |"
        )
    if args.s3:
        print()
        print("| tables | first sync on S3 (s) | / local | S3 requests | incremental sync on S3 (s) | / local | S3 requests | per table touched |")
        print("|---|---|---|---|---|---|---|---|")
        for n, r in results.items():
            print(
                f"| {n:,} | {r['s3_first']:.1f} | {r['s3_first'] / r['first']:.2f}x | {r['s3_first_requests']:,} | "
                f"{r['s3_incremental']:.1f} | {r['s3_incremental'] / r['incremental']:.2f}x | "
                f"{r['s3_incremental_requests']:,} | {r['s3_incremental_requests'] / n:.1f} |"
            )
    print(f"\nmachine: {os.cpu_count()} cores; each figure one run")


if __name__ == "__main__":
    main()
