"""CDC_LAKEHOUSE=s3://bucket/prefix against a local S3 endpoint over HTTP (moto_server, no patched client)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from cdc_assets.lakehouse import Lakehouse
from cdc_assets.local_source.server import free_port
from cdc_assets.raw_batch import list_batches
from cdc_assets.state import load_checkpoint
from cdc_assets_tests.conftest import CdcEnv


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in its own process: delta-rs holds the GIL while it waits on some requests, so an
    in-process (threaded) server could not answer them."""
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline and server.poll() is None, "moto_server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=10)


def test_whole_pipeline_on_s3(cdc: CdcEnv, monkeypatch, s3_endpoint: str) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3").create_bucket(Bucket="lake")
    monkeypatch.setenv("CDC_LAKEHOUSE", "s3://lake/cdc/prod")
    cdc.execute(
        "CREATE TABLE o (id BIGINT UNSIGNED PRIMARY KEY, note VARCHAR(30), at DATETIME(6))",
        "INSERT INTO o VALUES (18446744073709551615, 'max 🚀', '2024-01-01 00:00:00.000001'), (1, NULL, NULL)",
        "UPDATE o SET id = 2 WHERE id = 1",
    )
    assert cdc.sync() == 0
    cdc.execute("DELETE FROM o WHERE id = 2", "INSERT INTO o VALUES (3, 'three', NOW(6))")
    assert cdc.sync() == 0
    assert [d.describe() for d in cdc.verify()] == [f"{cdc.database}.o: 2 rows match"]

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="lake", Prefix="cdc/prod/")["Contents"]]
    assert any(k.startswith("cdc/prod/raw/") and k.endswith("/manifest.json") for k in keys)
    assert "cdc/prod/_state/checkpoint.json" in keys
    assert any(k.startswith(f"cdc/prod/current/{cdc.database}/o/_delta_log/") for k in keys)
    assert any(k.startswith(f"cdc/prod/changes/{cdc.database}/o/_delta_log/") for k in keys)
    lakehouse = Lakehouse("s3://lake/cdc/prod")
    assert load_checkpoint(lakehouse.store) is not None and len(list_batches(lakehouse.store)) >= 2
    assert not cdc.lakehouse_dir.exists()  # nothing landed locally
