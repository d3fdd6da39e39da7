"""The pipeline on a real Spark standalone cluster (a master and two workers, each a JVM with its own Python
workers): every stage's reading, transforming and writing in the executors, on a local lakehouse and on S3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import boto3
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.layout import CURRENT
from cdc_assets.stages.snapshot_records import TableSnapshot, snapshots_in_progress
from cdc_assets_tests.conftest import CdcEnv, run_cli, use_s3
from cdc_assets_tests.test_spark_snapshot import create_tables, writing


def _workload(cdc: CdcEnv, round_: int) -> None:
    base = round_ * 100
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO orders (id, item, qty) VALUES (%s, %s, %s)", [(base + i, f"item {i} ✅", i) for i in range(40)])
        cur.executemany("INSERT INTO notes VALUES (%s, %s)", [(i % 3, f"n{round_}") for i in range(10)])
        cur.execute("UPDATE orders SET qty = qty + 1 WHERE id % 3 = 0")
        cur.execute("DELETE FROM orders WHERE id % 7 = 0")
        cur.execute("UPDATE orders SET id = id + 10000 WHERE id = %s", (base + 1,))
        cur.execute("DELETE FROM notes WHERE a = 1 LIMIT 2")


def _sync_on(cluster: object, cdc: CdcEnv) -> None:
    done = run_cli("sync", env={"CDC_SPARK_MASTER": cluster.master})  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _assert_equal(cdc: CdcEnv, tables: int) -> None:
    results = cdc.verify()
    assert len(results) == tables
    assert [r.describe() for r in results if not r.ok] == []


def _lakehouse_on(where: str, cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    if where == "s3":
        use_s3(monkeypatch, s3_endpoint)
        bucket = f"cluster-{cdc.database[-6:]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://{bucket}/lake")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_sync_with_ddl_and_truncate_on_the_cluster(
    cdc: CdcEnv, spark_cluster: object, where: str, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    _lakehouse_on(where, cdc, monkeypatch, s3_endpoint)
    cdc.execute(
        "CREATE TABLE orders (id INT PRIMARY KEY, item VARCHAR(40), qty SMALLINT)",
        "CREATE TABLE notes (a INT, b VARCHAR(10))",
    )
    _workload(cdc, 0)
    _sync_on(spark_cluster, cdc)
    _assert_equal(cdc, 2)
    _workload(cdc, 1)
    cdc.execute(
        "ALTER TABLE orders ADD COLUMN note VARCHAR(10) DEFAULT 'new'",
        "ALTER TABLE orders MODIFY qty INT",
        "TRUNCATE TABLE notes",
        "INSERT INTO notes VALUES (9, 'after')",
    )
    _workload(cdc, 2)
    _sync_on(spark_cluster, cdc)
    _assert_equal(cdc, 2)
    log = spark_cluster.master_log.read_text()  # type: ignore[attr-defined]
    assert "Registered app" in log  # the runs were the cluster's, not a local Spark's
    if where == "local":
        assert any(cdc.lakehouse_dir.joinpath(CURRENT, TableRef(cdc.database, "orders").path).glob("*.zstd.parquet"))


def _stopped_snapshots(timeout: float, process: subprocess.Popen) -> list[TableSnapshot]:
    """The records of the snapshot in progress once a wave of its chunks is recorded."""
    store = initialized_resources().lakehouse.get().store
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        records = snapshots_in_progress(store)
        if any(r.done for r in records):
            return records
        time.sleep(0.2)
    raise AssertionError(f"no chunk recorded (snapshot exited with {process.poll()})")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_snapshot_on_the_cluster_killed_and_resumed_under_a_writer(
    cdc: CdcEnv, spark_cluster: object, where: str, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, tmp_path
) -> None:
    _lakehouse_on(where, cdc, monkeypatch, s3_endpoint)
    create_tables(cdc)
    env = {"CDC_SPARK_MASTER": spark_cluster.master, "CDC_SNAPSHOT_CHUNK_ROWS": "250"}  # type: ignore[attr-defined]
    with writing(cdc) as writes:
        log = (tmp_path / "killed.log").open("w")
        # after its first wave is recorded the snapshot waits, and is killed there: mid-way, for certain
        armed = {**env, "CDC_FAILPOINTS": "snapshot.chunks_recorded=sleep:120"}
        killed = subprocess.Popen(
            [sys.executable, "-m", "cdc_assets.cli", "snapshot"], env={**os.environ, **armed}, stdout=log, stderr=log
        )
        try:
            stopped = _stopped_snapshots(300, killed)
        finally:
            os.kill(killed.pid, signal.SIGKILL)
            killed.wait()
        [ints] = [r for r in stopped if r.table.table == "ints"]
        assert 0 < len(ints.done) < ints.chunks
        written_before = {a["path"] for actions in ints.done.values() for a in actions}
        resumed = run_cli("snapshot", env=env)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
        assert writes[0] > 20  # the source changed throughout
    assert f"resuming its snapshot, {len(ints.done)} of {ints.chunks} chunks already read" in resumed.stdout
    assert snapshots_in_progress(initialized_resources().lakehouse.get().store) == []
    current = initialized_resources().lakehouse.get().open(CURRENT, TableRef(cdc.database, "ints"))
    assert current is not None
    assert written_before <= set(current.get_add_actions(flatten=True).column("path").to_pylist())  # not read again
    _sync_on(spark_cluster, cdc)
    _assert_equal(cdc, 3)
