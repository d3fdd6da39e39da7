"""The `cdc-lakehouse` command: errors a user can fix, verify's differences, status, and secrets."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_assets.cli import main
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.lake.delta import open_table, read_query
from cdc_assets.lake.layout import ARCHIVE, CHANGES, CURRENT, RAW, STATE
from cdc_assets.lake.raw_batches import DATA_FILE, MANIFEST_FILE, list_batches
from cdc_assets.lake.state import CHECKPOINT_KEY, Checkpoint, save_checkpoint
from cdc_assets.local_source.server import free_port
from cdc_assets.source.server import binlog_end
from cdc_assets.verification.integrity import batch_chain_breaks
from cdc_assets_tests.conftest import CdcEnv, run_cli


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_user_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err  # one sentence, no traceback
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def _nothing_written(cdc: CdcEnv) -> None:
    assert not (cdc.lakehouse_dir / RAW).exists()
    assert not (cdc.lakehouse_dir / CHECKPOINT_KEY).exists()


@contextmanager
def _global(cdc: CdcEnv, name: str, value: str) -> Iterator[None]:
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(f"SELECT @@GLOBAL.{name}")
        previous = cur.fetchone()[0]
        cur.execute(f"SET GLOBAL {name} = %s", (value,))
    try:
        yield
    finally:
        with cdc.server.admin_connection() as conn, conn.cursor() as cur:
            cur.execute(f"SET GLOBAL {name} = %s", (previous,))


@pytest.mark.both_sources
def test_bad_url(cdc: CdcEnv, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CDC_MYSQL_URL", "postgres://nobody")
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "CDC_MYSQL_URL", "mysql://user:password@host:port")
    _nothing_written(cdc)


@pytest.mark.both_sources
def test_unreachable_server(cdc: CdcEnv, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CDC_MYSQL_URL", f"mysql://someone:secret@127.0.0.1:{free_port()}")
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "Cannot reach the MySQL server", "CDC_MYSQL_URL")
    _nothing_written(cdc)


@pytest.mark.both_sources
def test_wrong_password_in_a_real_process(cdc: CdcEnv, monkeypatch) -> None:
    url = cdc.server.reader_url()
    wrong = url.replace("@127.0.0.1", "x-wrong-pw@127.0.0.1")
    monkeypatch.setenv("CDC_MYSQL_URL", wrong)
    done = subprocess.run(
        [sys.executable, "-m", "cdc_assets.cli", "sync"], env=dict(os.environ), capture_output=True, text=True
    )
    _assert_user_error(done.returncode, done.stderr, "rejected user 'cdc_reader'", "fix the credentials")
    assert "x-wrong-pw" not in done.stderr + done.stdout
    _nothing_written(cdc)


@pytest.mark.both_sources
def test_missing_replication_privilege(cdc: CdcEnv, monkeypatch, capsys) -> None:
    cdc.execute(
        "DROP USER IF EXISTS 'reader_no_repl'@'127.0.0.1'",
        "CREATE USER 'reader_no_repl'@'127.0.0.1' IDENTIFIED BY 'pw'",
        "GRANT SELECT ON *.* TO 'reader_no_repl'@'127.0.0.1'",
    )
    monkeypatch.setenv("CDC_MYSQL_URL", f"mysql://reader_no_repl:pw@127.0.0.1:{cdc.server.port}")
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "cannot read the binlog", "GRANT REPLICATION SLAVE")
    _nothing_written(cdc)


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("binlog_format", "STATEMENT", "binlog_format=ROW"),
        ("binlog_row_image", "MINIMAL", "binlog_row_image=FULL"),
        ("binlog_row_metadata", "MINIMAL", "binlog_row_metadata=FULL"),
    ],
)
@pytest.mark.both_sources
def test_server_not_set_up_for_cdc(cdc: CdcEnv, capsys, variable: str, value: str, fragment: str) -> None:
    with _global(cdc, variable, value):
        code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, fragment)
    _nothing_written(cdc)


@pytest.mark.both_sources
def test_server_id_clash(cdc: CdcEnv, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CDC_SERVER_ID", "1")
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "CDC_SERVER_ID=1", "server_id")
    _nothing_written(cdc)


@pytest.mark.both_sources
def test_purged_checkpoint(cdc: CdcEnv, capsys) -> None:
    save_checkpoint(cdc.lakehouse.store, Checkpoint(BinlogPosition("mysql-bin.000000", 4)))
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "no longer on the source", "re-initialise")
    assert "run `cdc-lakehouse snapshot`" in err
    assert not (cdc.lakehouse_dir / RAW).exists()


@pytest.mark.both_sources
def test_following_the_purged_checkpoint_sentence(cdc: CdcEnv, monkeypatch, capsys) -> None:
    """The sentence of a purged checkpoint, followed word for word, leads to a clean sync (issue 27, item 13): the
    folders it names removed, `cdc-lakehouse snapshot`, then `sync` exits 0 and verify finds the tables equal. The
    earlier raw batches stay in raw/ when a user follows it; the first capture of the new lakehouse moves them to
    archive/, whole: in raw/ they made the next sync fail on raw_batches_contiguous."""
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "2")  # an earlier chain of several batches
    cdc.execute("CREATE TABLE k (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO k VALUES (1, 'a'), (2, 'b')")
    cdc.execute("INSERT INTO k VALUES (3, 'c')", "UPDATE k SET v = 'bb' WHERE id = 2", "DELETE FROM k WHERE id = 1")
    assert cdc.sync() == 0
    earlier = list_batches(cdc.lakehouse.store)
    assert len(earlier) > 1
    save_checkpoint(cdc.lakehouse.store, Checkpoint(BinlogPosition("mysql-bin.000000", 4)))  # as a purge leaves it
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "no longer on the source", "run `cdc-lakehouse snapshot`")
    folders = re.search(r"remove its ([^)]*)\)", err)
    assert folders is not None, err
    for folder in re.findall(r"([\w.-]+)/", folders.group(1)):
        shutil.rmtree(cdc.lakehouse_dir / folder)
    code, out, err = _run(["snapshot"], capsys)
    assert code == 0, out + err
    cdc.execute("INSERT INTO k VALUES (4, 'd')", "UPDATE k SET v = 'cc' WHERE id = 3")
    code, out, err = _run(["sync"], capsys)
    assert code == 0, out + err
    assert all(r.ok for r in cdc.verify())
    assert batch_chain_breaks(cdc.lakehouse) == []
    archived = sorted(p.parent.name for p in (cdc.lakehouse_dir / ARCHIVE).rglob(MANIFEST_FILE))
    assert archived == earlier  # nothing lost: every batch of the earlier chain, with its data
    assert all((p.parent / DATA_FILE).exists() for p in (cdc.lakehouse_dir / ARCHIVE).rglob(MANIFEST_FILE))


def test_unwritable_lakehouse(cdc: CdcEnv, monkeypatch, capsys, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CDC_LAKEHOUSE", str(blocker / "lakehouse"))
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "Cannot write to the lakehouse", "CDC_LAKEHOUSE")


@pytest.mark.parametrize("damage", ["corrupt", "missing", "manifest"])
def test_corrupt_or_missing_batch(cdc: CdcEnv, capsys, damage: str) -> None:
    cdc.execute("CREATE TABLE k (id INT PRIMARY KEY)", "INSERT INTO k VALUES (1), (2)")
    assert cdc.sync() == 0
    store = cdc.lakehouse.store
    changes_version = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "k")), None).version()
    # Processing starts over from the first batch, which has been damaged.
    shutil.rmtree(cdc.lakehouse_dir / STATE / "progress")
    data = cdc.lakehouse_dir / RAW / list_batches(store)[-1] / DATA_FILE
    if damage == "corrupt":
        data.write_bytes(data.read_bytes()[:-10] + b"0123456789")
    elif damage == "manifest":  # cut short, as a copy interrupted by hand would leave it
        manifest = data.parent / "manifest.json"
        manifest.write_bytes(manifest.read_bytes()[:100])
    else:
        data.unlink()
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "restore raw/")
    assert {"corrupt": "is corrupt", "missing": "missing its data file", "manifest": "manifest"}[damage] in err
    after = open_table(cdc.lakehouse.table_uri(CHANGES, TableRef(cdc.database, "k")), None).version()
    assert after == changes_version  # nothing half-written


@pytest.mark.both_sources
def test_verify_reports_differing_keys(cdc: CdcEnv, capsys) -> None:
    cdc.execute(
        "CREATE TABLE p (a INT, b VARCHAR(10), note TEXT, PRIMARY KEY (a, b))",
        "INSERT INTO p VALUES (1, 'x', 'one'), (2, 'y', 'two'), (3, 'z', 'three')",
    )
    assert cdc.sync() == 0
    code, out, _ = _run(["verify"], capsys)
    assert code == 0
    assert f"ok           {cdc.database}.p: 3 rows match" in out

    # Changes not in the lakehouse yet are left out on both sides, never reported as differences.
    cdc.execute(
        "UPDATE p SET note = 'changed' WHERE a = 2", "DELETE FROM p WHERE a = 3", "INSERT INTO p VALUES (4, 'w', '')"
    )
    code, out, _ = _run(["verify", f"{cdc.database}.p"], capsys)
    assert code == 0, out
    assert "3 keys changed in flight left out" in out
    assert cdc.sync() == 0

    # A lakehouse changed behind the pipeline's back is reported key by key.
    cdc.execute("INSERT INTO p VALUES (5, 'v', 'five'), (6, 'u', 'six')")
    assert cdc.sync() == 0
    current = DeltaTable(cdc.lakehouse.table_uri(CURRENT, TableRef(cdc.database, "p")))
    current.delete("a = 5")
    current.update(predicate="a = 2", updates={"note": "'tampered'"})
    write_deltalake(current, current_rows_like(current, a=7, b="t"), mode="append")
    code, out, _ = _run(["verify"], capsys)
    assert code == 1
    assert "1 missing: (5, 'v')" in out
    assert "1 extra: (7, 't')" in out
    assert "1 different: (2, 'y')" in out


def current_rows_like(table: DeltaTable, **values: object) -> pa.Table:
    """One row for a current-state table: the given values, NULL elsewhere, a `_cdc_seq` of 0."""
    schema = pa.schema(table.schema().to_arrow())
    row = {f.name: [values.get(f.name, 0 if f.name == "_cdc_seq" else None)] for f in schema}
    return pa.table(row).cast(schema)




@pytest.mark.both_sources
def test_status_reports_checkpoint_and_lag(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE st (id INT PRIMARY KEY)", "INSERT INTO st VALUES (1)")
    assert cdc.sync() == 0
    capsys.readouterr()
    code, out, _ = _run(["status", "--json"], capsys)
    assert code == 0
    status = json.loads(out)
    assert status["lag_bytes"] == 0
    assert status["checkpoint"] == status["binlog_end"]
    assert f"{cdc.database}.st" in status["tables"]
    assert status["seconds_since_materialized"][f"current/{cdc.database}/st"] is not None
    assert status["table_lag_seconds"] == {f"{cdc.database}.st": 0.0}
    assert status["freshness_windows_minutes"] == {"warn": 2.0, "fail": 5.0}
    cdc.execute("INSERT INTO st VALUES (2)")
    code, out, _ = _run(["status", "--json"], capsys)
    assert json.loads(out)["lag_bytes"] > 0


def test_no_password_in_lakehouse_or_dagster_storage(cdc: CdcEnv) -> None:
    password = cdc.server.reader_password_file.read_text().strip()
    dagster_home = Path(os.environ["DAGSTER_HOME"])  # the lakehouse's own (conftest's cdc)
    cdc.execute(
        "CREATE TABLE sec (id INT PRIMARY KEY)",
        "CREATE OR REPLACE USER 'app_user'@'127.0.0.1' IDENTIFIED BY 'AppSecret-123'",
        "INSERT INTO sec VALUES (1)",
    )
    assert cdc.sync() == 0
    assert any(dagster_home.rglob("*.db"))  # the runs are there
    for root in (cdc.lakehouse_dir, dagster_home):
        for path in root.rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                assert password.encode() not in content, path
                assert b"AppSecret-123" not in content, path


def test_a_lakehouse_from_the_earlier_layout_is_refused(cdc: CdcEnv, capsys) -> None:
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    (cdc.lakehouse_dir / STATE).mkdir(parents=True)
    old_catalog = {f"{cdc.database}.t": {"id": 0, "schema": cdc.database, "table": "t", "columns": [], "primary_key": []}}
    (cdc.lakehouse_dir / STATE / "tables.json").write_text(json.dumps(old_catalog))
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "written by an earlier cdc-lakehouse", "CDC_LAKEHOUSE")
    assert not (cdc.lakehouse_dir / CHECKPOINT_KEY).exists()


@pytest.mark.parametrize("command", [["sync"], ["status", "--json"], ["verify"]])
def test_a_lakehouse_that_is_a_file(cdc: CdcEnv, monkeypatch, capsys, tmp_path: Path, command: list[str]) -> None:
    blocker = tmp_path / "lakehouse-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CDC_LAKEHOUSE", str(blocker))
    code, _, err = _run(command, capsys)
    _assert_user_error(code, err, "is a file, not a directory", "CDC_LAKEHOUSE")


@pytest.mark.parametrize(
    "content",
    [
        "{}",
        "[]",
        '{"position": {"file": "mysql-bin.000001", "pos": "x"}}',
        '{"position": {"file": "x", "pos": 4}}',
        '{"position": {"file": "mysql-bin.0000',  # truncated
    ],
)
def test_a_corrupt_checkpoint(cdc: CdcEnv, capsys, content: str) -> None:
    cdc.execute("CREATE TABLE c (id INT PRIMARY KEY)", "INSERT INTO c VALUES (1)")
    (cdc.lakehouse_dir / STATE).mkdir(parents=True)
    (cdc.lakehouse_dir / CHECKPOINT_KEY).write_text(content)
    for command in (["sync"], ["status"]):
        code, _, err = _run(command, capsys)
        _assert_user_error(code, err, "checkpoint _state/checkpoint.json in the lakehouse is corrupt", "backup")
    assert not (cdc.lakehouse_dir / RAW).exists()


@pytest.mark.both_sources
def test_a_checkpoint_past_the_binlog_end_is_not_called_purged(cdc: CdcEnv, capsys) -> None:
    with cdc.server.admin_connection() as conn:
        log_file = binlog_end(conn).log_file
    number = int(log_file.rsplit(".", 1)[1])
    for position in (BinlogPosition(log_file, 1 << 40), BinlogPosition(f"mysql-bin.{number + 5:06d}", 4)):
        save_checkpoint(cdc.lakehouse.store, Checkpoint(position))
        code, _, err = _run(["sync"], capsys)
        _assert_user_error(code, err, "past the end of the source's binlog", "CDC_MYSQL_URL")
        assert "purged" not in err
    assert not (cdc.lakehouse_dir / RAW).exists()


@pytest.mark.parametrize("content", ["[]", '{"s.t": []}', "7"])
def test_a_corrupt_table_registry(cdc: CdcEnv, capsys, content: str) -> None:
    cdc.execute("CREATE TABLE r (id INT PRIMARY KEY)", "INSERT INTO r VALUES (1)")
    (cdc.lakehouse_dir / STATE).mkdir(parents=True)
    (cdc.lakehouse_dir / STATE / "tables.json").write_text(content)
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "table registry _state/tables.json", "corrupt")
    assert not (cdc.lakehouse_dir / CHECKPOINT_KEY).exists()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs (the suite runs as root, as `make test` installs system packages): a disk that fills up."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("full", ["lakehouse", "spool"])
def test_a_full_disk_is_one_sentence_and_the_next_sync_after_freeing_space_ends_equal(
    cdc: CdcEnv, monkeypatch, capsys, small_disk: Path, tmp_path: Path, full: str
) -> None:
    """The lakehouse, or the local spool capture writes a batch to before uploading it (TMPDIR), on a disk that
    fills up: one sentence, nothing half-visible, and after space is freed the next sync ends equal."""
    if full == "lakehouse":
        monkeypatch.setenv("CDC_LAKEHOUSE", str(small_disk / "lakehouse"))
    else:
        (small_disk / "spool").mkdir()
        monkeypatch.setenv("TMPDIR", str(small_disk / "spool"))
        monkeypatch.setattr(tempfile, "tempdir", str(small_disk / "spool"))  # read once per process, and cached
    cdc.execute("CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(200))")
    with cdc.admin() as conn, conn.cursor() as cur:
        rows = [(i, os.urandom(90).hex()) for i in range(30_000)]  # incompressible: several MB of raw batch
        cur.executemany("INSERT INTO big VALUES (%s, %s)", rows)
    code, _, err = _run(["sync"], capsys)
    _assert_user_error(code, err, "No space left", "CDC_LAKEHOUSE", "TMPDIR")
    lakehouse = small_disk / "lakehouse" if full == "lakehouse" else cdc.lakehouse_dir
    for manifest in (lakehouse / RAW).glob("*/manifest.json"):  # nothing half-visible
        assert (manifest.parent / DATA_FILE).is_file()
    assert not list(lakehouse.rglob(".*.tmp"))
    subprocess.run(["mount", "-o", "remount,size=256m", str(small_disk)], check=True)
    assert cdc.sync() == 0
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 30_000


def test_a_change_log_removed_by_hand_is_rebuilt_from_the_raw_batches(cdc: CdcEnv) -> None:
    """`rm -rf changes/<schema>/<table>` once passed in silence: the next sync, with no new change, now rebuilds the
    change log from the raw batches, each change exactly once, and current state stays equal."""
    cdc.execute("CREATE TABLE h (id INT PRIMARY KEY, v INT)", "INSERT INTO h VALUES (1, 1), (2, 2)")
    assert cdc.sync() == 0
    cdc.execute("UPDATE h SET v = 20 WHERE id = 2", "DELETE FROM h WHERE id = 1")
    assert cdc.sync() == 0
    table = TableRef(cdc.database, "h")

    def logged() -> list[tuple[int, str]]:
        log = open_table(cdc.lakehouse.table_uri(CHANGES, table), None)
        assert log is not None
        rows = read_query(log, "SELECT _cdc_seq, _cdc_op FROM changes ORDER BY _cdc_seq", "changes")
        return list(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), strict=True))

    before = logged()
    shutil.rmtree(cdc.lakehouse.table_uri(CHANGES, table))
    assert cdc.sync() == 0
    assert logged() == before and len(before) == 5  # create, 2 inserts, update, delete: once each
    [result] = cdc.verify()
    assert result.ok and result.compared_rows == 1


def test_commands_print_no_noise_and_sync_prints_its_wall_time(cdc: CdcEnv) -> None:
    """A normal sync, a sync with nothing to do, status and verify, each a process of its own as a user runs them:
    nothing on stderr (no traceback, no warning), and the time sync prints is the process's wall time, interpreter
    start-up and imports included."""
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    for changes in (True, False):
        began = time.monotonic()
        done = run_cli("sync")
        measured = time.monotonic() - began
        assert done.returncode == 0 and done.stderr == "", done.stderr
        printed = float(re.search(r"^sync succeeded in ([\d.]+)s$", done.stdout, re.MULTILINE).group(1))
        # printed to 0.1 s; measured also holds the process's spawn and what follows the print (the exit, which no
        # longer tears the interpreter's modules down: that was ~0.4 s), and this process's wake-up on a busy machine
        assert measured - 0.3 <= printed <= measured + 0.05, (printed, measured)
        assert ("2 rows inserted" in done.stdout) == changes
    for command in ("status", "verify"):
        done = run_cli(command)
        assert done.returncode == 0 and done.stderr == "", (command, done.stderr)


def test_the_global_options_are_taken_after_the_command_too(cdc: CdcEnv, tmp_path: Path) -> None:
    """`cdc-lakehouse sync -v --lakehouse DIR`, typed as users type it (issue 44: `sync -v` was refused): an option
    after the command's name is the same option as before it, and one given only before the name still holds."""
    cdc.execute("CREATE TABLE g (id INT PRIMARY KEY, v VARCHAR(8))", "INSERT INTO g VALUES (1, 'a'), (2, 'b')")
    elsewhere = tmp_path / "elsewhere"
    quiet = run_cli("sync", "--lakehouse", str(elsewhere))
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    cdc.execute("UPDATE g SET v = 'c' WHERE id = 1")
    verbose = run_cli("sync", "--lakehouse", str(elsewhere), "-v")
    assert verbose.returncode == 0, verbose.stderr[-2000:]
    # -v: the run's own log lines, which a sync without it leaves to its summary
    assert "1 of 1 tables equal to the source" in verbose.stdout and "equal to the source" not in quiet.stdout
    # and where the sync's time went, part by part (issue 45)
    [split] = [line for line in verbose.stdout.splitlines() if "where the time went: " in line]
    parts = dict(re.findall(r"(capture|change logs|current state|checks against the source|Dagster events) ([0-9.]+) s", split))
    assert {"capture", "change logs", "current state", "checks against the source", "Dagster events"} <= parts.keys(), split
    # and the work in each part by kind: one table touched is one commit per layer, each in its own step's part,
    # however many steps and processes took part
    work: dict[str, int] = {}
    for kind, n in re.findall(r"([a-zA-Z -]+) ([0-9,]+) \([0-9.]+ s\)", split):
        work[kind.strip()] = work.get(kind.strip(), 0) + int(n.replace(",", ""))
    assert work["change-log commits"] == 1 and work["current-state commits"] == 1, split
    assert work["locks taken"] >= 1 and work["Delta tables opened"] >= 2 and work["state and batch file operations"] >= 1, split
    kinds_before = r"(?:[a-zA-Z -]+ [0-9,]+ \([0-9.]+ s\), )*"  # the kinds listed before it in the same part
    assert re.search(rf"change logs [0-9.]+ s \({kinds_before}change-log commits 1 \(", split), split
    assert re.search(rf"current state [0-9.]+ s \({kinds_before}current-state commits 1 \(", split), split
    # the checks read the tables the run's writes kept open, brought up to date, instead of opening each afresh
    [checks] = re.findall(r"checks against the source [0-9.]+ s \(([^()]*(?:\([^()]*\)[^()]*)*)\)", split)
    assert "Delta tables kept open and brought up to date" in checks and "Delta tables opened" not in checks, split
    assert "where the time went" not in quiet.stdout
    assert (elsewhere / CURRENT / TableRef(cdc.database, "g").path).is_dir()
    assert not (cdc.lakehouse_dir / CURRENT).exists()  # CDC_LAKEHOUSE's lakehouse was not the one synced
    status = run_cli("--lakehouse", str(elsewhere), "status", "--json")
    assert status.returncode == 0 and f"{cdc.database}.g" in json.loads(status.stdout)["tables"]
