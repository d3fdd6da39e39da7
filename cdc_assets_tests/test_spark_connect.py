"""CDC_SPARK_MASTER=sc://…: the same pipeline through a Spark Connect server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_assets.local_source.server import free_port
from cdc_assets.local_spark import connect_server
from cdc_assets_tests.conftest import CdcEnv


@pytest.fixture(scope="module")
def spark_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[connect_server.ConnectServer]:
    server = connect_server.start(Path(tmp_path_factory.mktemp("spark-connect")), free_port())
    yield server
    connect_server.stop(server)


def test_sync_through_spark_connect(cdc: CdcEnv, monkeypatch, spark_connect: connect_server.ConnectServer) -> None:
    monkeypatch.setenv("CDC_SPARK_MASTER", spark_connect.remote)
    cdc.execute(
        "CREATE TABLE c (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(9,2))",
        "INSERT INTO c VALUES (1, 'ä', 1.50), (2, '🚀', NULL), (3, 'c', 3.00)",
        "UPDATE c SET id = 4 WHERE id = 3",
        "DELETE FROM c WHERE id = 1",
    )
    # A process is either a Spark Connect client or a local driver (this test process is one), so the
    # sync runs as its own `cdc-lakehouse` process, as a user runs it.
    done = subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", "sync"], env=dict(os.environ), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sync succeeded" in done.stdout
    diffs = cdc.verify()
    assert [(str(d.table), d.ok, d.compared_rows) for d in diffs] == [(f"{cdc.database}.c", True, 2)]
