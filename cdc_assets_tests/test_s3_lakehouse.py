"""CDC_LAKEHOUSE=s3://bucket/prefix against a local S3 endpoint over HTTP (moto_server, no patched client)."""

from __future__ import annotations

import boto3

from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import load_checkpoint
from cdc_assets_tests.conftest import CdcEnv, use_s3


def test_whole_pipeline_on_s3(cdc: CdcEnv, monkeypatch, s3_endpoint: str) -> None:
    use_s3(monkeypatch, s3_endpoint)
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
    [result] = cdc.verify()
    assert result.ok and result.describe().startswith(f"{cdc.database}.o: 2 rows match at ")

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="lake", Prefix="cdc/prod/")["Contents"]]
    assert any(k.startswith("cdc/prod/raw/") and k.endswith("/manifest.json") for k in keys)
    assert "cdc/prod/_state/checkpoint.json" in keys
    assert any(k.startswith(f"cdc/prod/current/{cdc.database}/o/_delta_log/") for k in keys)
    assert any(k.startswith(f"cdc/prod/changes/{cdc.database}/o/_delta_log/") for k in keys)
    lakehouse = initialized_resources().lakehouse.get()
    assert load_checkpoint(lakehouse.store) is not None and len(list_batches(lakehouse.store)) >= 2
    assert not cdc.lakehouse_dir.exists()  # nothing landed locally
