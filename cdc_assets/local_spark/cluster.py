"""A Spark standalone cluster on this machine, from the pyspark wheel alone: a master and its workers, each
a JVM of its own (and each worker's executors start their own Python workers). For the tests, the benchmarks
and users who want the cluster engine locally (`make spark-cluster-start`).

`CDC_SPARK_MASTER=spark://127.0.0.1:<port>` then sends every stage to it. The executors run Python as
PYSPARK_PYTHON: this machine's project interpreter (a real cluster needs the project installed on its
workers' Python: see docs/spark.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

from cdc_assets.local_source.processes import free_port, listening

DEFAULT_STATE_DIR = Path(".local") / "spark_cluster"
DEFAULT_PORT = 7077


@dataclass(frozen=True)
class Cluster:
    port: int
    state_dir: Path

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def master_log(self) -> Path:
        return self.state_dir / "master.log"




def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_HOME=str(Path(pyspark.__file__).parent), SPARK_LOCAL_IP="127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def _spark_class(*args: str, log: Path) -> subprocess.Popen[bytes]:
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", str(spark_class), *args], env=_environment(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _registered_workers(log: Path) -> int:
    return log.read_text(errors="replace").count("Registering worker") if log.exists() else 0


def start(state_dir: Path, workers: int = 2, port: int | None = None, worker_memory: str = "1g", timeout_s: float = 90.0) -> Cluster:
    """Start a master on 127.0.0.1 and `workers` workers of one core each, and wait until they registered."""
    state_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(port or free_port(), state_dir)
    cluster.master_log.unlink(missing_ok=True)
    pids = []
    master = _spark_class(
        "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(cluster.port),
        "--webui-port", str(free_port()), log=cluster.master_log,
    )  # fmt: skip
    pids.append(master.pid)
    deadline = time.monotonic() + timeout_s
    while not listening(cluster.port):
        if time.monotonic() > deadline or master.poll() is not None:
            raise RuntimeError(f"The Spark master did not start: see {cluster.master_log}")
        time.sleep(0.2)
    for n in range(workers):
        work = state_dir / f"worker-{n}"
        work.mkdir(exist_ok=True)
        worker = _spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory", worker_memory,
            "--webui-port", str(free_port()), "--work-dir", str(work), cluster.master, log=state_dir / f"worker-{n}.log",
        )  # fmt: skip
        pids.append(worker.pid)
    (state_dir / "pids").write_text(" ".join(str(p) for p in pids))
    (state_dir / "master").write_text(cluster.master)
    while _registered_workers(cluster.master_log) < workers:
        if time.monotonic() > deadline:
            stop(state_dir)
            raise RuntimeError(f"The Spark workers did not register with the master: see {state_dir}")
        time.sleep(0.3)
    return cluster


def stop(state_dir: Path) -> None:
    """Stop the master and the workers by their process ids (their process groups: the JVMs under bash)."""
    pids = state_dir / "pids"
    if not pids.exists():
        return
    for pid in pids.read_text().split():
        try:
            os.killpg(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    pids.unlink()


def main(argv: list[str] | None = None) -> int:
    """`python -m cdc_assets.local_spark cluster start|stop [--workers N]`: prints the master's URL."""
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_spark cluster")
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    state_dir = DEFAULT_STATE_DIR.resolve()
    if args.command == "stop":
        stop(state_dir)
        return 0
    if (state_dir / "pids").exists() and listening(args.port):
        print((state_dir / "master").read_text())
        return 0
    print(start(state_dir, args.workers, args.port).master)
    return 0

