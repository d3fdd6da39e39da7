"""Peak memory of `sync` and `verify` with one huge value: a row holding N MB in a LONGTEXT or a LONGBLOB (issue 27,
item 12).

    .venv/bin/python -m benchmarks.huge_value [--sizes 16,64,128] [--flavours mariadb,mysql] [--kinds text,blob]

For each flavour, kind and size it starts a dedicated server with a fresh binlog (under
.local/bench-huge-value-<flavour>-<kind>-<size>, on a free port; a new lakehouse reads the whole binlog) and `max_allowed_packet`
at its largest (1 GB), and in a fresh lakehouse and Dagster home: INSERTs one row whose value is N MB (text:
printable ASCII, different on every line; blob: random bytes, every byte value), runs `cdc-lakehouse sync` and
`cdc-lakehouse verify`, then UPDATEs the value (the row event holds two images of N MB) and runs `sync` again.
Each command is a process of its own; its peaks are that of its largest process (the sync's forked child
included; wait4's accounting, exact) and that of its processes' RSS summed, sampled every 0.2 s
(`benchmarks/memory.py`). Each flavour first runs the same with an empty value: the ratio is the largest
process's peak less that, over the value's size. Every command must exit 0 (sync's checks compare the row with
the source; verify compares it again), so the value arrived intact.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.memory import watch
from benchmarks.workloads import CLI, remove_work
from cdc_assets.local_source import server as local_server

SCHEMA = "huge"
MAX_ALLOWED_PACKET = 1 << 30  # the largest both flavours accept
MB = 1 << 20
READER_SERVER_ID = 4343
CREATE = {
    "text": f"CREATE TABLE {SCHEMA}.t (id INT PRIMARY KEY, v LONGTEXT CHARACTER SET utf8mb4)",
    "blob": f"CREATE TABLE {SCHEMA}.t (id INT PRIMARY KEY, v LONGBLOB)",
}


def value_of(kind: str, size_mb: int, seed: int) -> bytes | str:
    """N MB of text (printable ASCII lines) or of random bytes, deterministic for a seed."""
    rng = random.Random(seed)
    if kind == "blob":
        return rng.randbytes(size_mb * MB)
    line = bytes(range(32, 127))  # 95 printable characters and a newline: 96-byte lines
    lines = bytearray()
    while len(lines) < size_mb * MB:
        shift = rng.randrange(95)
        lines += line[shift:] + line[:shift] + b"\n"
    return lines[: size_mb * MB].decode("ascii")


def fresh_server(flavour: str, name: str) -> local_server.LocalServer:
    base = Path(".local") / f"bench-huge-value-{flavour}-{name}"  # one per measurement: none waits for the last to go
    local_server.stop(base)
    shutil.rmtree(base, ignore_errors=True)
    server = local_server.start(base, flavour=flavour)
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"SET GLOBAL max_allowed_packet = {MAX_ALLOWED_PACKET}")  # new connections take it
    return server


def write(server: local_server.LocalServer, statement: str, value: bytes | str) -> None:
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(statement, (value,))


# A parent of the command that reports the largest peak RSS of any process below it: wait4's accounting, exact
# however briefly a process lived (sampling could miss the forked child's peak just before it ends).
LARGEST_PROCESS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(f'LARGEST_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def command(env: dict[str, str], name: str) -> dict:
    """`cdc-lakehouse <name>` in a process of its own, with its peaks; it must exit 0."""
    watched = watch([sys.executable, "-c", LARGEST_PROCESS, CLI, name], env)
    if watched.code != 0:
        raise SystemExit(f"`cdc-lakehouse {name}` exited {watched.code}:\n{watched.out[-3000:]}{watched.err[-3000:]}")
    largest_kb = int(watched.err.rsplit("LARGEST_KB ", 1)[1].split()[0])
    return {"seconds": watched.seconds, "largest_mb": largest_kb / 1024, "tree_mb": watched.children_mb}


def measure(server: local_server.LocalServer, kind: str, size_mb: int, work: Path) -> list[tuple[str, dict]]:
    lakehouse = tempfile.mkdtemp(prefix="lake-", dir=work)
    home = tempfile.mkdtemp(prefix="dagster-", dir=work)
    env = {
        **os.environ,
        "CDC_MYSQL_URL": server.reader_url(),
        "CDC_LAKEHOUSE": lakehouse,
        "DAGSTER_HOME": home,
        "CDC_TABLES": f"{SCHEMA}.*",
        "CDC_SERVER_ID": str(READER_SERVER_ID),
    }
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        cur.execute(CREATE[kind])
    results = []
    write(server, f"INSERT INTO {SCHEMA}.t VALUES (1, %s)", value_of(kind, size_mb, 1))
    results.append(("sync (insert)", command(env, "sync")))
    results.append(("verify", command(env, "verify")))
    write(server, f"UPDATE {SCHEMA}.t SET v = %s WHERE id = 1", value_of(kind, size_mb, 2))
    results.append(("sync (update)", command(env, "sync")))
    shutil.rmtree(lakehouse, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    return results


def _measured(flavour: str, kind: str, size: int, work: Path) -> list[tuple[str, dict]]:
    server = fresh_server(flavour, f"{kind}-{size}")  # a binlog of this measurement's rows only: a new lakehouse reads it all
    try:
        return measure(server, kind, size, work)
    finally:
        local_server.stop(server.base_dir)
        shutil.rmtree(server.base_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,128", help="value sizes in MB, comma-separated")
    parser.add_argument("--flavours", default=",".join(local_server.FLAVOURS))
    parser.add_argument("--kinds", default="text,blob")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="cdc-huge-value-"))
    rows = []
    for flavour in args.flavours.split(","):
        # the same commands with an empty value: what a process takes whatever the value (Dagster, delta-rs, ...)
        baseline = {name: figures["largest_mb"] for name, figures in _measured(flavour, "text", 0, work)}
        for kind in args.kinds.split(","):
            for size in sizes:
                for name, figures in _measured(flavour, kind, size, work):
                    over = (figures["largest_mb"] - baseline[name]) / size
                    row = (
                        flavour, "LONGTEXT" if kind == "text" else "LONGBLOB", size, name,
                        f"{figures['largest_mb']:,.0f}", f"{figures['tree_mb']:,.0f}", f"{baseline[name]:,.0f}",
                        f"{over:.1f}", f"{figures['seconds']:.1f}",
                    )  # fmt: skip
                    rows.append(row)
                    print("  " + " ".join(str(c) for c in row), flush=True)
    print("\n| source | column | value (MB) | command | peak RSS, largest process (MB) | peak RSS, all its processes "
          "(MB) | same, empty value (MB) | (peak - empty) / value | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    remove_work(work)


if __name__ == "__main__":
    main()
