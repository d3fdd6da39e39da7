"""An S3 lakehouse behind the fault-injecting proxy (cdc_assets_tests.s3_fault_proxy, in front of moto_server):
every S3 client of the pipeline retries through 5xx, throttling, resets, timeouts and slow answers; an endpoint that
stays down ends in one sentence within a bound; nothing is lost or doubled either way."""

from __future__ import annotations

import time

import boto3
import pytest

from cdc_assets.core.names import TableRef
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.raw_batches import list_batches, read_manifest, read_rows
from cdc_assets.lake.state import load_checkpoint
from cdc_assets.lake.store import Lakehouse
from cdc_assets.verification.integrity import batch_chain_breaks, duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv, S3Faults, use_s3
from cdc_assets_tests.test_pipeline import ROW_CHANGES

# Faults on every kind of request the pipeline sends, each a few times: botocore, delta-rs (object_store) and, on
# Spark, pyarrow must each retry past them. Paths are regexes on the request path; a list is a GET with `list-type`.
MIXES = {
    "errors": [
        {"method": "PUT", "path": r"/raw/.*manifest\.json$", "action": "status:503", "times": 2},
        {"method": "PUT", "path": r"/_state/checkpoint\.json$", "action": "slowdown", "times": 2},
        {"method": "GET", "path": r"/raw/.*\.parquet$", "action": "status:500", "times": 2},
        {"method": "GET", "query": r"list-type=2", "action": "slowdown", "times": 3},
        {"method": "PUT", "path": r"/_delta_log/\d+\.json$", "header": "If-None-Match", "action": "status:503", "times": 2},
        {"method": "GET", "path": r"/_delta_log/", "action": "status:500", "times": 2},
        {"method": "PUT", "path": r"/current/.*/_delta_log/\d+\.json$", "header": "If-None-Match",
         "action": "drop_after_forward", "times": 1},
        {"method": "PUT", "path": r"/(changes|current)/.*\.parquet$", "action": "slowdown", "times": 2},
    ],
    "connections": [
        {"method": "PUT", "path": r"/raw/.*\.parquet$", "action": "reset", "times": 1},
        {"method": "PUT", "path": r"/_state/checkpoint\.json$", "action": "timeout", "times": 1},
        {"method": "GET", "path": r"/_state/checkpoint\.json$", "action": "delay:1.5", "times": 2},
        {"method": "GET", "query": r"list-type=2", "action": "reset", "times": 2},
        {"method": "PUT", "path": r"/_delta_log/\d+\.json$", "header": "If-None-Match", "action": "reset", "times": 1},
        # a commit that lands but whose answer is lost: the retry meets the commit it made itself
        {"method": "PUT", "path": r"/_delta_log/\d+\.json$", "header": "If-None-Match", "action": "drop_after_forward",
         "times": 1},
        {"method": "GET", "path": r"/_delta_log/", "action": "timeout", "times": 1},
        {"method": "PUT", "path": r"/(changes|current)/.*\.parquet$", "action": "delay:1.5", "times": 1},
    ],
}


def _s3_lake(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, endpoint: str, bucket: str) -> None:
    use_s3(monkeypatch, endpoint)
    client = boto3.client("s3")
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://{bucket}/{cdc.database}")
    monkeypatch.setenv("CDC_LOCK_TTL_SECONDS", "5")  # a killed or failed run's lease blocks the next run 5 s at most
    monkeypatch.setenv("CDC_S3_TIMEOUT_SECONDS", "1")  # a timed-out request is cut after 1 s, then retried


def _write(cdc: CdcEnv, first: int, count: int) -> None:
    with cdc.admin() as conn, conn.cursor() as cur:
        for i in range(first, first + count):
            cur.execute("INSERT INTO acct VALUES (%s, %s, %s)", (i, f"owner {i} ✅", i))
            if i % 3 == 0:
                cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (i // 2,))
            if i % 7 == 0:
                cur.execute("DELETE FROM acct WHERE id = %s", (i // 3,))
            conn.commit()


def _lakehouse() -> Lakehouse:
    return initialized_resources().lakehouse.get()


def _assert_equal_exactly_once(cdc: CdcEnv, lakehouse: Lakehouse) -> None:
    [result] = cdc.verify()
    assert result.ok and result.source_rows == result.lakehouse_rows, result.describe()
    assert batch_chain_breaks(lakehouse) == [] and duplicate_seqs(lakehouse) == {}
    log = lakehouse.open(CHANGES, TableRef(cdc.database, "acct"))
    assert log is not None
    changed = sorted(read_query(log, f"SELECT _cdc_seq FROM changes WHERE {ROW_CHANGES}", "changes").column(0).to_pylist())
    raw: list[int] = []
    for name in list_batches(lakehouse.store):
        raw += read_rows(lakehouse.store, read_manifest(lakehouse.store, name)).column("seq").to_pylist()
    assert changed == sorted(raw) and len(set(changed)) == len(changed)  # every change once, none missing


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_sync_through_s3_faults_retries_and_ends_equal(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, s3_faults: S3Faults, mix: str
) -> None:
    _s3_lake(cdc, monkeypatch, s3_faults.url, "faults")
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)")
    _write(cdc, 0, 30)
    assert cdc.sync() == 0  # the tables exist: the faults then hit appends and merges as well as creates
    _write(cdc, 30, 40)
    s3_faults.set(*MIXES[mix])
    began = time.monotonic()
    assert cdc.sync() == 0
    seconds = time.monotonic() - began
    injected = s3_faults.injected()
    s3_faults.clear()
    hit = {(r["method"], r["action"]) for r in injected}
    expected = {(rule["method"], rule["action"]) for rule in MIXES[mix]}
    assert hit == expected, f"not injected: {expected - hit}"
    assert len(injected) == sum(rule["times"] for rule in MIXES[mix])  # every fault of every rule was met
    print(f"{mix}: {len(injected)} faults injected, sync took {seconds:.1f} s")
    _assert_equal_exactly_once(cdc, _lakehouse())


def _sync_refused(cdc: CdcEnv, capsys: pytest.CaptureFixture[str], endpoint: str) -> tuple[str, float]:
    """A sync that must end with exit 2 and one sentence naming the endpoint; the sentence and the seconds it took."""
    capsys.readouterr()
    began = time.monotonic()
    assert cdc.sync() == 2
    seconds = time.monotonic() - began
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: The S3 endpoint {endpoint} of the lakehouse at s3://"), err
    assert "CDC_S3_MAX_ATTEMPTS" in err and "Traceback" not in err
    return err, seconds


def test_an_s3_endpoint_that_stays_down_ends_in_one_sentence_and_the_next_sync_ends_equal(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, s3_faults: S3Faults, capsys: pytest.CaptureFixture[str]
) -> None:
    _s3_lake(cdc, monkeypatch, s3_faults.url, "down")
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)")
    _write(cdc, 0, 30)

    # Down from the start, answering 503: CDC_S3_MAX_ATTEMPTS tries of the first request, then one sentence.
    for attempts in (2, 4):
        monkeypatch.setenv("CDC_S3_MAX_ATTEMPTS", str(attempts))
        s3_faults.set({"action": "status:503"})
        _, seconds = _sync_refused(cdc, capsys, s3_faults.url)
        assert len(s3_faults.injected()) == attempts and seconds < 10
        with capsys.disabled():
            print(f"503 throughout, CDC_S3_MAX_ATTEMPTS={attempts}: refused after {seconds:.1f} s")

    # Down without answering: each try is cut after CDC_S3_TIMEOUT_SECONDS (1 s here; 120 s is the proxy's silence).
    monkeypatch.setenv("CDC_S3_MAX_ATTEMPTS", "3")
    s3_faults.set({"action": "timeout"})
    _, seconds = _sync_refused(cdc, capsys, s3_faults.url)
    assert len(s3_faults.injected()) == 3 and 3 <= seconds < 15
    with capsys.disabled():
        print(f"no answer, 3 tries of 1 s: refused after {seconds:.1f} s")

    # Up for objects, down for the Delta tables: capture lands its batch and checkpoint, the change-log stage gives
    # up on its first Delta request, and nothing moves past what was written.
    s3_faults.set({"path": rf"^/down/{cdc.database}/(changes|current)/", "action": "slowdown"})
    sentence, seconds = _sync_refused(cdc, capsys, s3_faults.url)
    print(f"Delta side down: refused after {seconds:.1f} s: {sentence.strip()}")
    lakehouse = _lakehouse()
    assert load_checkpoint(lakehouse.store) is not None and list_batches(lakehouse.store)
    s3_faults.clear()
    assert lakehouse.open(CHANGES, TableRef(cdc.database, "acct")) is None  # no change log was half-created

    began = time.monotonic()
    assert cdc.sync() == 0  # recovered: the next sync takes the captured batch in
    print(f"recovered: the next sync ended in {time.monotonic() - began:.1f} s")
    _write(cdc, 30, 10)
    assert cdc.sync() == 0
    _assert_equal_exactly_once(cdc, lakehouse)
