"""Lakehouse locks with real parts: flock on a temporary directory, and a moto_server subprocess for S3 over HTTP."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import S3Retries
from cdc_assets.lake.locks import (
    LockHeld,
    LockHolder,
    LockLost,
    lakehouse_lock,
    read_holder,
)
from cdc_assets.lake.store import Lakehouse, S3Access, s3_client
from cdc_assets_tests.conftest import S3Faults

REPO = Path(__file__).resolve().parents[1]
BUCKET = "locks-test"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# A second process that takes the "capture" lock, says so, then waits for a line on stdin and reports
# whether it still holds the lock. Arguments: lakehouse location, ttl_seconds.
CHILD = """
import os, sys
os.environ["CDC_LAKEHOUSE"] = sys.argv[1]
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.locks import LockLost, lakehouse_lock

with lakehouse_lock(initialized_resources().lakehouse.get(), "capture", "capture", "child run", ttl_seconds=float(sys.argv[2])) as lease:
    print("locked", flush=True)
    sys.stdin.readline()
    try:
        lease.check()
    except LockLost as exc:
        print(f"LockLost: {exc}", flush=True)
        raise SystemExit(3) from None
    print("still held", flush=True)
"""


LOG = logging.getLogger("cdc_assets_tests.test_locks")


def _acquire_in_thread(lakehouse: Lakehouse, name: str, purpose: str, owner: str) -> BaseException | None:
    """Try the lock once from another thread (its own open file or request), and say what went wrong."""

    def attempt() -> None:
        with lakehouse_lock(lakehouse, name, purpose, owner):
            pass

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(attempt).exception(timeout=10)


def _client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_REGION"],
    )


@pytest.fixture
def s3_lake(s3_endpoint: str) -> Lakehouse:
    """A fresh prefix in the bucket for each test (moto_server from conftest)."""
    client = _client(s3_endpoint)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    return Lakehouse(f"s3://{BUCKET}/{uuid.uuid4().hex}", S3Access.of(client))


@pytest.fixture
def local_lake(tmp_path: Path) -> Lakehouse:
    return Lakehouse(str(tmp_path / "lake"))


def _start_child(location: str, ttl_seconds: float, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CHILD script in its own Python process, once it holds the lock."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, location, str(ttl_seconds)],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "locked"
    return child


def _kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)


def _counting_threads(lakehouse: Lakehouse, threads: int, increments: int) -> None:
    """Threads that each add 1 to a counter object, read-modify-write with a pause, under one lock."""
    key = "_state/counter"
    lakehouse.store.put(key, b"0")
    intervals: list[tuple[float, float]] = []

    def work(worker: int) -> None:
        for _ in range(increments):
            with lakehouse_lock(lakehouse, "capture", "capture", f"worker {worker}", wait_seconds=30):
                entered = time.monotonic()
                value = int(lakehouse.store.get(key))
                time.sleep(0.005)  # let another thread run now if the lock let it in
                lakehouse.store.put(key, str(value + 1).encode())
                intervals.append((entered, time.monotonic()))
            time.sleep(0.02)  # outside the lock, so the others' polls find it free and it changes hands

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))

    assert int(lakehouse.store.get(key)) == threads * increments
    ordered = sorted(intervals)
    assert len(ordered) == threads * increments
    for (_, exited), (entered, _) in zip(ordered, ordered[1:], strict=False):
        assert exited <= entered, "two holders were inside the lock at once"


# --- local ------------------------------------------------------------------------------------------------


def test_local_second_acquirer_gets_lock_held_naming_the_holder(local_lake: Lakehouse) -> None:
    assert read_holder(local_lake, "capture") is None
    with lakehouse_lock(local_lake, "capture", "capture", "dagster run 1a2b3c4d") as lease:
        holder = read_holder(local_lake, "capture")
        assert holder == lease.holder()
        assert holder is not None and holder.owner == "dagster run 1a2b3c4d" and holder.pid == os.getpid()
        error = _acquire_in_thread(local_lake, "capture", "capture", "cli")
        assert isinstance(error, LockHeld)
        message = str(error)
        assert message.startswith("Another capture is running (dagster run 1a2b3c4d on host ")
        assert f"pid {os.getpid()}" in message and "CDC_LOCK_WAIT_SECONDS" in message
        lease.check()  # a local lock cannot be lost
    assert read_holder(local_lake, "capture") is None
    assert (local_lake.root / "_state/locks/capture.lock").read_bytes() == b""  # emptied, not deleted


def test_a_thread_takes_its_own_lock_again_for_the_same_owner_only(local_lake: Lakehouse) -> None:
    """The continuous mode holds the stage locks and calls the stage functions, which take them again."""
    with lakehouse_lock(local_lake, "capture", "capture", "continuous mode (dagster run 1a2b3c4d)") as outer:
        with lakehouse_lock(local_lake, "capture", "capture", "continuous mode (dagster run 1a2b3c4d)") as inner:
            assert inner is outer
        assert read_holder(local_lake, "capture") == outer.holder()  # still held: the outer block releases it
        with pytest.raises(LockHeld):  # another owner in the same thread waits like another process
            with lakehouse_lock(local_lake, "capture", "capture", "a sync"):
                pass
        assert isinstance(_acquire_in_thread(local_lake, "capture", "capture", "continuous mode (dagster run 1a2b3c4d)"), LockHeld)
    assert read_holder(local_lake, "capture") is None


def test_local_waiter_gets_the_lock_right_after_release(
    local_lake: Lakehouse, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    got: list[tuple[float, LockHolder]] = []

    def wait_for_it() -> None:
        with lakehouse_lock(local_lake, "capture", "capture", "waiter", wait_seconds=5, log=LOG) as lease:
            got.append((time.monotonic(), lease.holder()))

    with lakehouse_lock(local_lake, "capture", "capture", "first run"):
        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(0.5)
        assert not got
    released = time.monotonic()
    waiter.join(timeout=10)
    assert got and got[0][1].owner == "waiter"
    assert got[0][0] - released < 0.5
    waiting = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert len(waiting) == 1 and "first run" in waiting[0]


def test_local_locks_exclude_each_other_under_contention(local_lake: Lakehouse) -> None:
    _counting_threads(local_lake, threads=4, increments=20)


def test_local_lock_of_a_killed_process_is_free(local_lake: Lakehouse) -> None:
    child = _start_child(str(local_lake.root), 60)
    try:
        holder = read_holder(local_lake, "capture")
        assert holder is not None and holder.owner == "child run" and holder.pid == child.pid
        with pytest.raises(LockHeld, match="child run"):
            with lakehouse_lock(local_lake, "capture", "capture", "parent"):
                pass
    finally:
        _kill(child)
    assert read_holder(local_lake, "capture") is None
    with lakehouse_lock(local_lake, "capture", "capture", "parent") as lease:
        assert read_holder(local_lake, "capture") == lease.holder()


def test_local_lock_on_an_unwritable_lakehouse_is_a_user_error(local_lake: Lakehouse) -> None:
    local_lake.root.mkdir(parents=True)
    (local_lake.root / "_state").write_text("a file where the state directory should be")
    with pytest.raises(CdcUserError, match="Cannot write the capture lock in the lakehouse at .*CDC_LAKEHOUSE"):
        with lakehouse_lock(local_lake, "capture", "capture", "run"):
            pass


# --- S3 ---------------------------------------------------------------------------------------------------


def test_s3_lock_held_and_read_holder(s3_lake: Lakehouse) -> None:
    assert read_holder(s3_lake, "capture") is None
    with lakehouse_lock(s3_lake, "capture", "capture", "dagster run 1a2b3c4d") as lease:
        assert read_holder(s3_lake, "capture") == lease.holder()
        error = _acquire_in_thread(s3_lake, "capture", "capture", "cli")
        assert isinstance(error, LockHeld)
        assert str(error).startswith("Another capture is running (dagster run 1a2b3c4d on host ")
        assert "CDC_LOCK_WAIT_SECONDS" in str(error)
        assert s3_lake.store.exists("_state/locks/capture.json")
    assert read_holder(s3_lake, "capture") is None
    assert not s3_lake.store.exists("_state/locks/capture.json")  # released leases are deleted


def test_s3_locks_exclude_each_other_under_contention(s3_lake: Lakehouse) -> None:
    _counting_threads(s3_lake, threads=4, increments=10)


def test_s3_expired_lease_of_a_killed_process_is_taken_over(
    s3_lake: Lakehouse, s3_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    child = _start_child(s3_lake.location, 1, {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint})
    try:
        time.sleep(1.2)  # longer than the TTL: only the child's heartbeat keeps the lease alive
        holder = read_holder(s3_lake, "capture")
        assert holder is not None and holder.owner == "child run" and holder.pid == child.pid
        with pytest.raises(LockHeld, match="child run"):
            with lakehouse_lock(s3_lake, "capture", "capture", "parent"):
                pass
    finally:
        _kill(child)
    started = time.monotonic()
    with lakehouse_lock(s3_lake, "capture", "capture", "parent", wait_seconds=5, log=LOG) as lease:
        assert time.monotonic() - started < 2.5  # within about one TTL of the last heartbeat
        assert read_holder(s3_lake, "capture") == lease.holder()
    assert any("Took over the capture lock from child run" in r.getMessage() for r in caplog.records)


def test_s3_lease_taken_over_after_expiry_is_lost(s3_lake: Lakehouse, s3_endpoint: str) -> None:
    """The child is frozen (SIGSTOP) past its TTL, as a stalled machine would be; the parent takes the lease
    over; when the child runs again its heartbeat finds the lease gone and Lease.check() raises LockLost."""
    child = _start_child(s3_lake.location, 1, {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint})
    assert child.stdin is not None and child.stdout is not None
    try:
        child.send_signal(signal.SIGSTOP)
        with lakehouse_lock(s3_lake, "capture", "capture", "parent", wait_seconds=5) as lease:
            child.send_signal(signal.SIGCONT)
            time.sleep(1.0)  # three heartbeat intervals of the child
            child.stdin.write("go\n")
            child.stdin.flush()
            report = child.stdout.readline()
            assert child.wait(timeout=10) == 3
            assert report.startswith("LockLost: This capture lost its capture lock: it was taken over by parent")
            assert read_holder(s3_lake, "capture") == lease.holder()  # the child did not delete our lease
            lease.check()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            _kill(child)
    assert read_holder(s3_lake, "capture") is None


def test_s3_block_that_lost_its_lease_raises_lock_lost(s3_lake: Lakehouse) -> None:
    """A lease overwritten by another writer (as a taker's conditional PUT would) is lost, and release
    leaves the other writer's object alone."""
    other = LockHolder("other run", "elsewhere", 4242, time.time())
    with pytest.raises(LockLost, match="taken over by other run on host elsewhere, pid 4242"):
        with lakehouse_lock(s3_lake, "capture", "capture", "this run", ttl_seconds=0.6) as lease:
            s3_lake.store.put("_state/locks/capture.json", other.to_json(expires_at=time.time() + 60))
            time.sleep(0.5)  # more than one heartbeat interval (0.2 s)
            with pytest.raises(LockLost):
                lease.check()
    assert read_holder(s3_lake, "capture") == other


def test_s3_renewal_whose_answer_was_lost_keeps_the_lease(s3_faults: S3Faults) -> None:
    """S3 applies a conditional renewal but its answer never arrives; botocore sends it again, and the retry
    gets 412 because the first attempt already changed the ETag. The lease is still ours, not lost."""
    client = _client(s3_faults.url)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    lake = Lakehouse(f"s3://{BUCKET}/{uuid.uuid4().hex}", S3Access.of(client))
    s3_faults.set({"method": "PUT", "path": r"/_state/locks/capture\.json$", "header": "If-Match",
                   "action": "drop_after_forward", "times": 2})  # fmt: skip
    with lakehouse_lock(lake, "capture", "capture", "this run", ttl_seconds=1.5) as lease:
        time.sleep(2.5)  # five heartbeats: two answers lost, then normal renewals, past the first TTL
        lease.check()
        assert read_holder(lake, "capture") == lease.holder()
    assert [r["action"] for r in s3_faults.injected()] == ["drop_after_forward"] * 2
    assert read_holder(lake, "capture") is None


def test_s3_acquire_whose_answer_was_lost_holds_the_lease_at_once(s3_faults: S3Faults) -> None:
    """The same for the first, create-only write: its retry meets 412 against its own lease and must not wait
    for that lease to expire."""
    client = _client(s3_faults.url)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    lake = Lakehouse(f"s3://{BUCKET}/{uuid.uuid4().hex}", S3Access.of(client))
    s3_faults.set({"method": "PUT", "path": r"/_state/locks/capture\.json$", "header": "If-None-Match",
                   "action": "drop_after_forward", "times": 1})  # fmt: skip
    began = time.monotonic()
    with lakehouse_lock(lake, "capture", "capture", "this run", wait_seconds=0, ttl_seconds=30) as lease:
        assert read_holder(lake, "capture") == lease.holder()
    assert time.monotonic() - began < 10
    assert len(s3_faults.injected()) == 1


def test_s3_renewals_failing_with_503_keep_the_lease_while_in_time_then_lose_it_cleanly(
    s3_faults: S3Faults, s3_endpoint: str
) -> None:
    """Renewals answered 503 (each through CDC_S3_MAX_ATTEMPTS=2 tries) for less than the TTL: a later renewal lands
    and the lease is still ours. For longer than the TTL: check() says the lease is lost, another run (with a healthy
    path to S3) takes it over, the loser's block ends in LockLost and its release leaves the new lease alone."""
    retries = S3Retries(max_attempts=2, timeout_seconds=1)
    connection = {"region": CREDENTIALS["AWS_REGION"], "access_key_id": "testing", "secret_access_key": "testing"}
    client = s3_client(retries, endpoint_url=s3_faults.url, **connection)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    location = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    lake = Lakehouse(location, S3Access.of(client, retries=retries, endpoint_url=s3_faults.url, **connection))
    healthy = Lakehouse(location, S3Access.of(_client(s3_endpoint), endpoint_url=s3_endpoint, **connection))
    renewal = {"method": "PUT", "path": r"/_state/locks/capture\.json$", "header": "If-Match", "action": "status:503"}
    taken = threading.Event()
    done = threading.Event()
    holders: list[LockHolder] = []

    def take_over() -> None:
        with lakehouse_lock(healthy, "capture", "capture", "next run", wait_seconds=5, ttl_seconds=30) as lease:
            holders.append(lease.holder())
            taken.set()
            done.wait(10)

    with pytest.raises(LockLost, match="could not renew its capture lock before it expired"):
        with lakehouse_lock(lake, "capture", "capture", "this run", ttl_seconds=3) as lease:
            s3_faults.set({**renewal, "times": 3})  # one heartbeat fails (2 tries), the next lands on its second try
            time.sleep(3.5)  # past the first TTL: only a renewal that landed keeps the lease
            lease.check()
            assert read_holder(lake, "capture") == lease.holder() and len(s3_faults.injected()) == 3
            s3_faults.set(renewal)  # from now on every renewal fails
            taker = threading.Thread(target=take_over)
            taker.start()
            assert taken.wait(10)  # once the lease expired, within about one TTL
            with pytest.raises(LockLost, match="could not renew"):
                lease.check()
    assert read_holder(healthy, "capture") == holders[0]  # the loser's release left the new holder's lease alone
    done.set()
    taker.join(timeout=10)
    assert read_holder(healthy, "capture") is None
