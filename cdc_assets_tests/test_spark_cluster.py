"""The pipeline on a real Spark standalone cluster (a master and two workers, each a JVM with its own Python
workers): every stage's reading, transforming and writing in the executors, on a local lakehouse and on S3. On S3,
a snapshot on the cluster SIGKILLed mid-way under a writer resumes with only its missing chunks once the killed
run's leases expire (its kill and resumption on a local lakehouse are test_spark_snapshot's, on local Spark); on a
local lakehouse the tables come from the binlog alone. A sync of schema changes, key changes and a TRUNCATE follows
on the cluster; it ends with every table equal to the source. Each Spark application on the cluster costs this
2-core machine about half a minute: each variant starts as few as it needs."""

from __future__ import annotations

import json

import boto3
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.layout import CURRENT
from cdc_assets.stages.snapshot.records import snapshots_in_progress
from cdc_assets_tests.conftest import CdcEnv, run_cli, use_s3
from cdc_assets_tests.test_spark_snapshot import (
    assert_resumed,
    committed_files,
    create_tables,
    killed_mid_snapshot,
    writing,
)
from spark_resources.session import QUICK_JIT


def _workload(cdc: CdcEnv) -> None:
    """Changes to every kind of table, and then to every table's shape: columns added and widened, a TRUNCATE."""
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO ints VALUES (%s, %s, 'more ✅')", [(100_000 + i, i) for i in range(40)])
        cur.execute("UPDATE ints SET n = n + 1 WHERE id % 3 = 0")
        cur.execute("DELETE FROM ints WHERE id % 7 = 0")
        cur.execute("UPDATE ints SET id = 5000000 WHERE id = 100001")
        cur.execute("DELETE FROM bag WHERE a = 1 LIMIT 2")
        cur.execute("ALTER TABLE ints ADD COLUMN tag VARCHAR(10) DEFAULT 'new'")
        cur.execute("ALTER TABLE texts MODIFY qty DECIMAL(12,3)")
        cur.execute("UPDATE texts SET qty = qty / 3 WHERE region = 'r1'")
        cur.execute("TRUNCATE TABLE bag")
        cur.executemany("INSERT INTO bag VALUES (%s, %s)", [(i % 2, "after") for i in range(6)])
        cur.executemany("INSERT INTO ints (id, n, note) VALUES (%s, %s, 'last')", [(200_000 + i, i) for i in range(20)])


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
        monkeypatch.setenv("CDC_LOCK_TTL_SECONDS", "5")  # the killed snapshot's leases block the resumed one only briefly


@pytest.mark.parametrize("where", ["local", "s3"])
def test_syncs_with_ddl_and_truncate_on_the_cluster_after_a_snapshot_killed_and_resumed_under_a_writer(
    cdc: CdcEnv, spark_cluster: object, where: str, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str, tmp_path
) -> None:
    """On S3, the tables are loaded by a snapshot on the cluster that is killed mid-way and resumed; on a local
    lakehouse, by the sync alone, from the binlog. Then one sync on the cluster takes in what the source did since:
    rows, key changes, an added and a widened column, a TRUNCATE. Each Spark application costs this 2-core machine
    about half a minute, so each variant starts as few as it needs."""
    _lakehouse_on(where, cdc, monkeypatch, s3_endpoint)
    create_tables(cdc)
    on_cluster = {"CDC_SPARK_MASTER": spark_cluster.master, "CDC_SNAPSHOT_CHUNK_ROWS": "250"}  # type: ignore[attr-defined]
    if where == "s3":
        # each executor's Python worker stalls after recording its second chunk: the kill lands mid-way, for certain
        failpoint = {"spark.executorEnv.CDC_FAILPOINTS": "snapshot.chunk_written=sleep:600@2"}
        stalls = {**on_cluster, "CDC_SPARK_CONF": json.dumps(failpoint)}
        with writing(cdc) as writes:
            stopped = killed_mid_snapshot(stalls, tmp_path / "killed.log")
            resumed = run_cli("snapshot", env=on_cluster)
            assert resumed.returncode == 0, resumed.stdout + resumed.stderr[-3000:]
            assert writes[0] > 20  # the source changed throughout
        assert_resumed(stopped, resumed.stdout, committed_files(cdc))
        assert snapshots_in_progress(initialized_resources().lakehouse.get().store) == []
    _workload(cdc)
    _sync_on(spark_cluster, cdc)
    _assert_equal(cdc, 3)
    log = spark_cluster.master_log.read_text()  # type: ignore[attr-defined]
    assert "Registered app" in log  # the runs were the cluster's, not a local Spark's
    # the sync's executors, on this machine, ran with the JIT's first tier only (spark_resources.session.QUICK_JIT)
    newest = max(spark_cluster.state_dir.glob("worker-*/app-*"), key=lambda app: app.name)  # type: ignore[attr-defined]
    commands = [f.read_text().split("\n", 1)[0] for f in newest.glob("*/stderr")]
    assert commands and all("Spark Executor Command" in c and QUICK_JIT in c for c in commands), commands
    if where == "local":
        assert any(cdc.lakehouse_dir.joinpath(CURRENT, TableRef(cdc.database, "ints").path).glob("*.zstd.parquet"))
