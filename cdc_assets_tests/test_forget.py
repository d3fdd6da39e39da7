"""`cdc-lakehouse forget`: a person's rows gone from every layer and from storage, against real MariaDB and MySQL.

After a forget, every table must equal the source less the forgotten keys (the source deleted them first), every
change of the raw batches must still be in its change log once, and a scan of every byte under the lakehouse and the
Dagster home (Parquet values read with pyarrow, the Delta logs' JSON, the raw batches, `_state/`, Dagster's
databases, where each forget's run keeps its config and event log: forget runs as the `forget` job) must find no value of a forgotten row: not its key, nor its distinctive e-mail. A forget killed at each of
its failpoints and run again ends the same way.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import DagsterRun, DagsterRunStatus, RunsFilter

from cdc_assets.core import failpoints
from cdc_assets.defs.keys import FORGET_JOB
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.layout import FORGOTTEN_STATE
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.exactly_once import check_exactly_once

# Tests that ask the source run on both flavours; the crash walk, S3, sinks and bad input are the lakehouse's
# alone and run on MariaDB (the suite must stay within its time).

# failpoints of a forget, each walked by test_a_forget_killed_at_each_failpoint_and_run_again_finishes
# (the Nth time it is reached: the Delta layers are the change log, current state and history, in that order)
FORGET_POINTS = (
    ("rewrite.raw_data_written", 1),
    ("rewrite.raw_manifest_switched", 1),
    ("rewrite.layer_committed", 1),
    ("rewrite.layer_vacuumed", 1),
    ("rewrite.layer_committed", 2),
    ("rewrite.layer_vacuumed", 3),
    ("forget.layers_rewritten", 1),
)


def _forget(*argv: str) -> int:
    from cdc_assets.cli import main

    return main(["forget", *argv])


def _values(value: object) -> list[str]:
    """Every scalar of a Parquet cell as text (lists and structs opened)."""
    if isinstance(value, dict):
        return [t for v in value.values() for t in _values(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _values(v)]
    return [] if value is None else [value.decode("latin-1") if isinstance(value, bytes) else str(value)]


def _needle_pattern(needle: str) -> re.Pattern[bytes]:
    """A needle as found in bytes. A number's text counts only as a whole number: a six-digit value is otherwise
    found, one run in a few dozen, as the microseconds of a logged time or inside a run's id
    (`00:23:12.735392`), which is no leak."""
    text = re.escape(needle.encode())
    return re.compile(rb"(?<![0-9A-Za-z.])" + text + rb"(?![0-9A-Za-z])" if needle.isdigit() else text)


def leaks(roots: list[Path], needles: list[str]) -> list[str]:
    """Where any of `needles` is found under `roots`: in a file's bytes (any file: Delta logs, JSON state,
    SQLite databases), or among the values of a Parquet file as pyarrow reads them (an INT key is not its text
    in a Parquet file's bytes)."""
    files = ((str(p), p.read_bytes()) for root in roots for p in sorted(root.rglob("*")) if p.is_file())
    return leaks_in(files, needles)


def leaks_in(files: Iterable[tuple[str, bytes]], needles: list[str]) -> list[str]:
    """`leaks` over (name, content) pairs: files, or the objects of an S3 bucket."""
    patterns = {n: _needle_pattern(n) for n in needles}
    found = []
    for name, data in files:
        found += [f"{name}: bytes hold {n!r}" for n, p in patterns.items() if p.search(data)]
        if name.endswith(".parquet"):
            texts = {t.encode() for row in pq.read_table(io.BytesIO(data)).to_pylist() for t in _values(row)}
            found += [f"{name}: a value is {n!r}" for n, p in patterns.items() if any(p.search(t) for t in texts)]
    return found


def test_the_scan_finds_a_number_as_a_value_not_as_the_digits_of_a_time_or_an_id() -> None:
    """The leak scan's own rule (a rewrite test once failed on a log line's microseconds, `12.735392`)."""
    logged = b'{"message": "2026-11-27 00:23:12.735392 synced", "timestamp": 1795738992.7353921, "run": "a735392b"}'
    assert leaks_in([("runs.db", logged)], ["735392"]) == []
    for held in (b'{"age": 735392}', b'"735392"', b"age=735392.", b"[735392,"):
        assert leaks_in([("runs.db", held)], ["735392"]) == ["runs.db: bytes hold '735392'"], held
    assert leaks_in([("runs.db", b"x-one-k0e9@")], ["one-k0e9"]) != []  # a text needle is found anywhere


def _forget_runs() -> list[DagsterRun]:
    from cdc_assets.commands.runs import instance

    return list(instance().get_runs(RunsFilter(job_name=FORGET_JOB)))


def _scan(cdc: CdcEnv, needles: list[str]) -> list[str]:
    return leaks([cdc.lakehouse_dir, Path(os.environ["DAGSTER_HOME"])], needles)


def _assert_equal_to_source(cdc: CdcEnv) -> None:
    results = cdc.verify()
    assert [r.describe() for r in results if not r.ok] == []
    found = check_exactly_once(initialized_resources().lakehouse.get())  # CDC_LAKEHOUSE's: a directory or S3
    assert found.ok, found.describe()


def _records(cdc: CdcEnv) -> list[dict]:
    found = [json.loads(p.read_text()) for p in (cdc.lakehouse_dir / FORGOTTEN_STATE).rglob("*.json")]
    return sorted(found, key=lambda r: (r["started_at"], r["id"]))


def _people(cdc: CdcEnv) -> None:
    cdc.execute(
        "CREATE TABLE people (id INT PRIMARY KEY, email VARCHAR(100), name VARCHAR(50))",
        "CREATE TABLE visits (person INT, day DATE, note VARCHAR(100), PRIMARY KEY (person, day))",
        "CREATE TABLE other (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO people SELECT seq, CONCAT('user', seq, '@example.com'), 'someone' FROM {cdc.numbers(50)}",
        "INSERT INTO other VALUES (1, 1), (2, 2)",
    )


def _person(cdc: CdcEnv, key: int, mark: str, was: int | None = None, visits: bool = True) -> None:
    """A person with a distinctive key and e-mail, changed a few times (versions in every layer), with visits;
    `was`: the key the row had first (a key-changing update moved it to `key`)."""
    cdc.execute(
        f"INSERT INTO people VALUES ({was or key}, 'old-{mark}@example.invalid', 'Ada')",
        f"UPDATE people SET id = {key} WHERE id = {was or key}",
        f"UPDATE people SET email = '{mark}@example.invalid', name = 'Ada {mark}' WHERE id = {key}",
        "UPDATE other SET v = v + 1",
    )
    if visits:
        cdc.execute(f"INSERT INTO visits VALUES ({key}, '2026-01-02', 'visit-{mark}'), ({key}, '2026-01-03', 'again-{mark}')")


@pytest.mark.both_sources
def test_forget_one_key_and_several_removes_them_from_every_layer_and_storage(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.people,{db}.visits")
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "20")  # several raw batches hold the person's rows
    _people(cdc)
    assert cdc.sync() == 0
    _person(cdc, 918273645, "forget-me-7f3a")
    _person(cdc, 918273646, "forget-too-91c2")
    _person(cdc, 918273647, "forget-also-5e1d", was=918273600)  # forgetting 918273647 forgets 918273600 too
    cdc.execute("UPDATE people SET name = 'changed' WHERE id <= 5", "UPDATE people SET id = 4001 WHERE id = 6")
    assert cdc.sync() == 0
    cdc.execute("UPDATE people SET email = 'newest-forget-me-7f3a@example.invalid' WHERE id = 918273645")
    assert cdc.sync() == 0
    # the person asks to be forgotten: deleted at the source (the DELETE not yet synced), then forgotten
    cdc.execute("DELETE FROM people WHERE id = 918273645", "DELETE FROM visits WHERE person = 918273645")
    assert _forget(f"{db}.people", "--key", "918273645") == 0
    assert _forget(f"{db}.visits", "--key", '[918273645, "2026-01-02"]', "--key", '[918273645, "2026-01-03"]') == 0
    _assert_equal_to_source(cdc)
    assert _scan(cdc, ["918273645", "forget-me-7f3a"]) == []
    assert _scan(cdc, ["918273646", "forget-too-91c2"]) != []  # the scan finds what is still there

    # several keys at once, one given as its JSON array, and a keys file for the composite key
    cdc.execute("DELETE FROM people WHERE id IN (918273646, 918273647)", "DELETE FROM visits WHERE person >= 918273646")
    assert cdc.sync() == 0  # this time the DELETE was synced before
    assert _forget(f"{db}.people", "--key", "918273646", "--key", "[918273647]") == 0
    keys = cdc.lakehouse_dir.parent / "keys.txt"
    keys.write_text("".join(f'[{k}, "2026-01-0{d}"]\n' for k in (918273646, 918273647) for d in (2, 3)))
    assert _forget(f"{db}.visits", "--keys-file", str(keys)) == 0
    keys.unlink()
    _assert_equal_to_source(cdc)
    needles = ["918273645", "918273646", "918273647", "918273600", "forget-me-7f3a", "forget-too-91c2", "forget-also-5e1d"]
    assert _scan(cdc, needles) == []

    # each forget was a run of the `forget` job (visible in `dagster dev`), its config naming no key
    runs = _forget_runs()
    assert len(runs) == 4 and all(r.status == DagsterRunStatus.SUCCESS for r in runs)
    assert all("keys_file" in json.dumps(r.run_config) for r in runs)  # only the path of the file holding the keys
    assert not [r for r in runs for n in needles if n in json.dumps(r.run_config)]

    # the record: what was done, with hashes and no key
    records = _records(cdc)
    assert [(r["table"], len(r["given"]), r["keys"], r["status"]) for r in records] == [
        (f"{db}.people", 1, 1, "done"), (f"{db}.visits", 2, 2, "done"), (f"{db}.people", 2, 3, "done"),
        (f"{db}.visits", 4, 4, "done"),
    ]  # fmt: skip
    layers = records[0]["layers"]  # insert, two updates, the delete: in raw batches and the change log
    assert (layers["raw"]["rows_removed"], layers["changes"]["rows_removed"]) == (4, 4)
    assert layers["current"]["rows_removed"] == 0  # the source's DELETE, taken in first, had removed it
    assert layers["history"]["rows_removed"] == 3  # its three versions

    # the pipeline goes on: later changes, a sync, the same tables equal
    cdc.execute("INSERT INTO people VALUES (7001, 'new@example.com', 'n')", "UPDATE other SET v = 0")
    assert cdc.sync() == 0
    _assert_equal_to_source(cdc)
    assert _scan(cdc, needles) == []


def _cli(*argv: str, failpoint: str, hit: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", *argv],
        env={**os.environ, failpoints.ENV: f"{failpoint}=exit@{hit}"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_forget_killed_at_each_failpoint_and_run_again_finishes(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    db = cdc.database
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{db}.people")
    _people(cdc)
    assert cdc.sync() == 0
    for n, (point, hit) in enumerate(FORGET_POINTS):
        key, mark = 918270000 + n, f"crash-{n}-c4fe"
        _person(cdc, key, mark, visits=False)
        assert cdc.sync() == 0
        cdc.execute(f"DELETE FROM people WHERE id = {key}")
        crashed = _cli("forget", f"{db}.people", "--key", str(key), failpoint=point, hit=hit)
        assert crashed.returncode == failpoints.EXIT_CODE, f"{point}: {crashed.stdout[-2000:]} {crashed.stderr[-2000:]}"
        assert cdc.sync() == 0, point  # a sync between the crash and the rerun brings nothing back and fails on nothing
        assert _forget(f"{db}.people", "--key", str(key)) == 0, point
        _assert_equal_to_source(cdc)
        assert _scan(cdc, [str(key), mark]) == [], point
    records = _records(cdc)
    assert [r["status"] for r in records] == ["done"] * len(FORGET_POINTS)


def test_bad_input_gets_one_sentence(cdc: CdcEnv, capsys: pytest.CaptureFixture[str]) -> None:
    db = cdc.database
    _people(cdc)
    assert cdc.sync() == 0
    capsys.readouterr()
    cases = [
        ((f"{db}.nope", "--key", "1"), "has no table"),
        ((f"{db}.people",), "No key given"),
        ((f"{db}.visits", "--key", "1"), "primary key has 2 columns"),
        ((f"{db}.people", "--key", "[1, 2]"), "primary key has 1 column"),
        ((f"{db}.people", "--key", "abc"), "is not a INT"),
        ((f"{db}.people", "--key", "7"), "still holds 1 of the 1 key"),
    ]
    for argv, words in cases:
        assert _forget(*argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and words in err and "\n" not in err, (argv, err)
    assert _records(cdc) == []


def test_forget_names_the_sinks_that_had_published_the_keys(
    cdc: CdcEnv, rabbitmq: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sinks cannot unsend: a real RabbitMQ sink published the person's changes, and forget says so."""
    import pika

    name = cdc.database
    with pika.BlockingConnection(pika.URLParameters(rabbitmq.url())) as connection:
        channel = connection.channel()
        channel.exchange_declare(name, "topic", durable=True)
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, name, "#")
    monkeypatch.setenv("CDC_RABBITMQ_URL", rabbitmq.url())
    monkeypatch.setenv("CDC_RABBITMQ_EXCHANGE", name)
    monkeypatch.delenv("CDC_KINESIS_STREAM", raising=False)
    try:
        _people(cdc)
        _person(cdc, 918279999, "published-4b7e", visits=False)
        assert cdc.sync() == 0  # publishes to RabbitMQ too
        cdc.execute("DELETE FROM people WHERE id = 918279999")
        capsys.readouterr()
        assert _forget(f"{cdc.database}.people", "--key", "918279999") == 0
        out = capsys.readouterr().out
        assert "sink rabbitmq: had published changes of these keys, and cannot unsend them" in out, out
        assert [r["published_by"] for r in _records(cdc)] == [["rabbitmq"]]
        _assert_equal_to_source(cdc)
        assert _scan(cdc, ["918279999", "published-4b7e"]) == []
    finally:
        with pika.BlockingConnection(pika.URLParameters(rabbitmq.url())) as connection:
            connection.channel().queue_delete(name)
            connection.channel().exchange_delete(name)


@pytest.mark.both_sources
def test_forget_by_the_clear_key_of_a_table_whose_key_column_is_hashed(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key column a column policy hashes: the user names the person by the source's key, the lakehouse holds and
    forgets its keyed hash."""
    from cdc_assets.core.column_policy import hash_text

    db, secret = cdc.database, "forget-test-secret-0123456789"
    monkeypatch.setenv("CDC_HASH_COLUMNS", f"{db}.members.id,{db}.members.email")
    monkeypatch.setenv("CDC_HASH_KEY", secret)
    cdc.execute(
        "CREATE TABLE members (id INT PRIMARY KEY, email VARCHAR(100), city VARCHAR(40))",
        f"INSERT INTO members SELECT seq, CONCAT('m', seq, '@example.com'), 'Lyon' FROM {cdc.numbers(20)}",
        "INSERT INTO members VALUES (918275555, 'hashed-6d0a@example.invalid', 'Ville-6d0a')",
    )
    assert cdc.sync() == 0
    cdc.execute("UPDATE members SET city = 'Autre-6d0a' WHERE id = 918275555", "DELETE FROM members WHERE id = 918275555")
    assert _forget(f"{db}.members", "--key", "0918275555") == 0  # as the source would read it: the INT 918275555
    _assert_equal_to_source(cdc)
    hashed = hash_text(secret.encode(), "918275555")
    assert _scan(cdc, [hashed, hash_text(secret.encode(), "hashed-6d0a@example.invalid"), "6d0a"]) == []
    assert _scan(cdc, [hash_text(secret.encode(), "7")]) != []  # a key kept is there, hashed


def test_forget_on_an_s3_lakehouse(cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> None:
    """The same on S3 (a local endpoint): raw batches rewritten, Delta tables vacuumed and their logs cut through the
    object store; every object of the bucket scanned."""
    import boto3

    from cdc_assets_tests.conftest import use_s3

    use_s3(monkeypatch, s3_endpoint)
    s3 = boto3.client("s3")
    bucket = f"forget-{cdc.server.flavour}"
    s3.create_bucket(Bucket=bucket)
    monkeypatch.setenv("CDC_LAKEHOUSE", f"s3://{bucket}/lake")
    monkeypatch.setenv("CDC_HISTORY_TABLES", f"{cdc.database}.people")
    _people(cdc)
    _person(cdc, 918276666, "on-s3-2a9c", visits=False)
    assert cdc.sync() == 0
    cdc.execute("DELETE FROM people WHERE id = 918276666")
    assert _forget(f"{cdc.database}.people", "--key", "918276666") == 0
    _assert_equal_to_source(cdc)

    def objects() -> Iterable[tuple[str, bytes]]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for found in page.get("Contents", []):
                yield found["Key"], s3.get_object(Bucket=bucket, Key=found["Key"])["Body"].read()

    assert leaks_in(objects(), ["918276666", "on-s3-2a9c"]) == []
    assert leaks_in(objects(), ["user7@example.com"]) != []
