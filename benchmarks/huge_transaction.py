"""Peak memory and time of each stage for one huge transaction: a 1M-row UPDATE (issue: full fidelity, item 5).

    .venv/bin/python -m benchmarks.huge_transaction [--rows 1000000] [--batch-rows 50000]

Starts its own MariaDB (under .local/bench-huge, on a free port), loads a table of `--rows` rows,
syncs it, then UPDATEs every row in ONE transaction and runs each stage in a child process of its
own, printing that process's peak RSS (and the Spark JVM's, which is a process apart) and seconds.
Finally it verifies the current-state table against the source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.workloads import CLI
from cdc_assets.local_source import server as local_server

STAGES = {
    "capture": (
        "import os\n"
        "from cdc_assets.capture.run import capture\n"
        "from cdc_assets.core.settings import MySQLUrl, SourceSettings, TableFilter\n"
        "from cdc_assets.lake.store import Lakehouse\n"
        "url = MySQLUrl.parse(os.environ['CDC_MYSQL_URL'])\n"
        "settings = SourceSettings(url, table_filter=TableFilter(('huge.*',)), max_batch_rows={batch_rows})\n"
        "report = capture(settings, Lakehouse(os.environ['CDC_LAKEHOUSE']))\n"
        "out = {{'batches': len(report.batches), 'rows': report.rows}}\n"
    ),
    "changes": (
        "from cdc_assets.stages.changes.run import process_new_batches\n"
        "from cdc_assets.defs.resources import initialized_resources\n"
        "resources = initialized_resources()\n"
        "report = process_new_batches(resources.lakehouse.get(), resources.transforms.for_changes)\n"
        "out = {{'rows_out': report.rows_out}}\n"
    ),
    "current": (
        "from cdc_assets.stages.current.run import apply_pending\n"
        "from cdc_assets.defs.resources import initialized_resources\n"
        "resources = initialized_resources()\n"
        "report = apply_pending(resources.lakehouse.get(), resources.transforms.for_changes)\n"
        "out = {{'changes_in': sum(r.changes_in for r in report.applied)}}\n"
    ),
}
EPILOGUE = (
    "import resource, pathlib\n"
    "out['python_peak_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
    "jvm = 0\n"
    "for status in pathlib.Path('/proc').glob('[0-9]*/status'):\n"
    "    try:\n"
    "        text = status.read_text()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if 'PPid:\\t%d\\n' % __import__('os').getpid() in text and 'VmHWM' in text:\n"
    "        jvm = max(jvm, int(text.split('VmHWM:')[1].split()[0]) / 1024)\n"
    "out['jvm_peak_mb'] = jvm\n"
    "print('RESULT ' + __import__('json').dumps(out))\n"
)


def _stage(name: str, env: dict[str, str], batch_rows: int) -> dict:
    code = STAGES[name].format(batch_rows=batch_rows) + EPILOGUE
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"{name} did not finish in 20 minutes:\n{(exc.stderr or b'')[-3000:]!r}") from exc
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.rsplit("RESULT ", 1)[1])
    result["seconds"] = round(time.monotonic() - began, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-rows", type=int, default=50_000)
    args = parser.parse_args()

    base = Path(".local") / "bench-huge"
    local_server.stop(base)
    shutil.rmtree(base, ignore_errors=True)  # a fresh binlog: the figures are for this run's rows only
    server = local_server.start(base)
    lakehouse = Path(tempfile.mkdtemp(prefix="cdc-huge-"))
    env = {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_LAKEHOUSE": str(lakehouse),
        "CDC_TABLES": "huge.*",
        "CDC_SPARK_MASTER": os.environ.get("CDC_SPARK_MASTER", "local[2]"),
    }
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS huge")
        cur.execute("CREATE DATABASE huge")
        cur.execute("CREATE TABLE huge.t (id INT PRIMARY KEY, v BIGINT, note VARCHAR(40))")
        cur.execute("USE huge")  # the sequence engine's seq_1_to_N lives in the current database
        cur.execute(f"INSERT INTO huge.t SELECT seq, seq, CONCAT('row ', seq) FROM seq_1_to_{args.rows}")
    print(f"loaded {args.rows} rows; lakehouse {lakehouse}", flush=True)
    for name in STAGES:  # the load itself: one transaction of args.rows inserts
        print(f"  load   {name:8s} {_stage(name, env, args.batch_rows)}", flush=True)
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("UPDATE huge.t SET v = v + 1, note = CONCAT(note, ' updated')")  # one transaction
    print(f"updated {args.rows} rows in one transaction")
    for name in STAGES:
        print(f"  update {name:8s} {_stage(name, env, args.batch_rows)}", flush=True)
    verify = subprocess.run([CLI, "verify"], env=env, capture_output=True, text=True)
    print(verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr[-2000:])
    local_server.stop(base)


if __name__ == "__main__":
    main()
