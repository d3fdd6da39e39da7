"""CDC_LAKEHOUSE=s3://bucket/prefix against a local S3 endpoint over HTTP (moto_server, no patched client)."""

from __future__ import annotations

import boto3

from cdc_assets.cli import main
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.raw_batches import list_batches
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.verification.integrity import batch_chain_breaks
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


def test_a_lakehouse_reinitialised_on_s3_archives_its_earlier_raw_batches(cdc: CdcEnv, monkeypatch, s3_endpoint: str) -> None:
    """Re-initialised as a purged checkpoint's sentence says (its _state/, changes/ and current/ removed, then
    `cdc-lakehouse snapshot`), an S3 lakehouse's first capture moves the earlier raw batches to archive/ (a copy on
    the server, then the delete) and the next sync is clean."""
    use_s3(monkeypatch, s3_endpoint)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="again")
    monkeypatch.setenv("CDC_LAKEHOUSE", "s3://again/cdc")
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "1")  # an earlier chain of several batches
    cdc.execute("CREATE TABLE r (id INT PRIMARY KEY)", "INSERT INTO r VALUES (1)", "INSERT INTO r VALUES (2)")
    assert cdc.sync() == 0
    store = initialized_resources().lakehouse.get().store
    earlier = list_batches(store)
    assert len(earlier) > 1
    for folder in ("_state", "changes", "current"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="again", Prefix=f"cdc/{folder}/"):
            for found in page.get("Contents", []):
                s3.delete_object(Bucket="again", Key=found["Key"])
    assert main(["snapshot"]) == 0
    cdc.execute("INSERT INTO r VALUES (3)")
    assert cdc.sync() == 0
    assert all(r.ok for r in cdc.verify())
    assert batch_chain_breaks(initialized_resources().lakehouse.get()) == []
    archived = [o["Key"] for o in s3.list_objects_v2(Bucket="again", Prefix="cdc/archive/")["Contents"]]
    assert sorted(k.split("/")[-2] for k in archived if k.endswith("/manifest.json")) == earlier
    assert sum(k.endswith("/changes.parquet") for k in archived) == len(earlier)  # whole: data and manifest
