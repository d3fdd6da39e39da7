"""Settings and the errors they cause, as a newcomer meets them (issue 30): every numeric setting range-checked with
one sentence, errors that name the flag when a flag gave the value, a password refused on the command line, a `#`
in a password, and another replica with the same server id, on MariaDB and on MySQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cdc_assets.capture.binlog.protocol import dump_events
from cdc_assets.cli import FLAG_VARIABLES, main, named_as_given
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl, Settings
from cdc_assets.lake.layout import RAW
from cdc_assets.lake.state import CHECKPOINT_KEY, known_tables
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source.server import binlog_files, connect
from cdc_assets.stages.current.apply import read_current
from cdc_assets_tests.conftest import CdcEnv, run_cli

CONFIGURATION = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"  # every setting, in one table


def _one_sentence(code: int, err: str, *fragments: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err  # one sentence, no traceback
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _nothing_written(cdc: CdcEnv) -> None:
    assert not (cdc.lakehouse_dir / RAW).exists()
    assert not (cdc.lakehouse_dir / CHECKPOINT_KEY).exists()


# Every numeric setting of docs/configuration.md's table, with values it must refuse. A variable documented
# there whose name says it is a number and that is missing here fails `test_every_numeric_setting_is_listed`.
NUMERIC_SETTINGS = {
    "CDC_SERVER_ID": ["-5", "0", "4294967296", "many", "1.5"],
    "CDC_MAX_BATCH_ROWS": ["-5", "0", "2.5", "lots"],
    "CDC_CURRENT_FILE_KB": ["0", "-1", "inf", "big"],
    "CDC_SPARK_MIN_ROWS": ["-1", "0.5", "nan"],
    "CDC_SNAPSHOT_CHUNK_ROWS": ["0", "-10", "1e400"],
    "CDC_CAPTURE_INTERVAL_SECONDS": ["0", "-3", "often"],
    "CDC_CHECK_INTERVAL_SECONDS": ["0", "-60", "nan"],
    "CDC_FULL_CHECK_INTERVAL_SECONDS": ["0", "-1", "inf"],
    "CDC_FRESHNESS_WARN_MINUTES": ["0.5", "-2", "x"],
    "CDC_FRESHNESS_FAIL_MINUTES": ["0", "-5", "inf"],
    "CDC_LAG_WARN_SECONDS": ["0", "-1", "nan"],
    "CDC_LAG_FAIL_SECONDS": ["0", "-1", "y"],
    "CDC_LOCK_WAIT_SECONDS": ["-1", "inf", "z"],
    "CDC_LOCK_TTL_SECONDS": ["2", "-1", "nan"],
    "CDC_S3_MAX_ATTEMPTS": ["0", "2.5", "inf"],
    "CDC_S3_TIMEOUT_SECONDS": ["0", "-1", "nan"],
    "CDC_SINK_DEDUP_SECONDS": ["-1", "nan", "inf"],
    "CDC_SINK_HEARTBEAT_SECONDS": ["-1", "nan", "inf"],
    "CDC_SINK_LAG_WARN_SECONDS": ["0", "-1", "inf"],
    "CDC_SINK_LAG_FAIL_SECONDS": ["0", "-1", "q"],
    "CDC_PROGRESS_SECONDS": ["0", "-1", "nan"],
}
NUMERIC_NAME = re.compile(r"_(SECONDS|MINUTES|ROWS|KB|ID|ATTEMPTS)$")


def test_every_numeric_setting_is_listed() -> None:
    documented = set(re.findall(r"^\| `(CDC_[A-Z0-9_]+)`", CONFIGURATION.read_text(), re.M))
    documented |= {b for pair in re.findall(r"^\| `(CDC_[A-Z0-9_]+)` / `(CDC_[A-Z0-9_]+)`", CONFIGURATION.read_text(), re.M) for b in pair}
    numeric = {name for name in documented if NUMERIC_NAME.search(name)}
    assert numeric and numeric <= set(NUMERIC_SETTINGS), numeric - set(NUMERIC_SETTINGS)


@pytest.mark.parametrize("variable", sorted(NUMERIC_SETTINGS))
def test_every_numeric_setting_is_range_checked_with_one_sentence(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check every command makes before it starts (core.settings.Settings.from_env, the one value every stage
    is then given), over every numeric setting."""
    Settings.from_env(os.environ)  # the defaults pass
    for bad in NUMERIC_SETTINGS[variable]:
        monkeypatch.setenv(variable, bad)
        with pytest.raises(CdcUserError) as refused:
            Settings.from_env(os.environ)
        sentence = str(refused.value)
        assert variable in sentence and "\n" not in sentence and sentence.endswith("."), sentence
        monkeypatch.delenv(variable)


@pytest.mark.both_sources
def test_a_negative_batch_size_is_refused_before_anything_is_written(cdc: CdcEnv, monkeypatch, capsys) -> None:
    """`CDC_MAX_BATCH_ROWS=-5` wrote 2,257 one-transaction batches; now the sync refuses it, and names the flag when
    the flag gave it."""
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    monkeypatch.setenv("CDC_MAX_BATCH_ROWS", "-5")
    code = main(["sync"])
    _one_sentence(code, capsys.readouterr().err, "CDC_MAX_BATCH_ROWS='-5' is not a whole number of at least 1")
    _nothing_written(cdc)
    monkeypatch.delenv("CDC_MAX_BATCH_ROWS")
    code = main(["sync", "--max-batch-rows", "0"])
    line = _one_sentence(code, capsys.readouterr().err, "--max-batch-rows '0' is not a whole number of at least 1")
    assert "CDC_MAX_BATCH_ROWS" not in line
    _nothing_written(cdc)


@pytest.mark.parametrize("text", ["localhost:3000", "ftp://dagster", "http://:3000", "http://dagster:port", "http://dagster:3000?x=1"])
def test_a_webserver_address_that_is_no_url_is_refused_before_anything_is_written(
    text: str, cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_WEBSERVER", text)
    _one_sentence(main(["sync"]), capsys.readouterr().err, "CDC_DAGSTER_WEBSERVER", "http://localhost:3000")
    _nothing_written(cdc)


def test_a_webserver_address_is_where_the_reload_is_asked() -> None:
    from cdc_assets.core.settings import WebserverAddress

    assert Settings.from_env({}).cadence.webserver is None  # the sensor then says to reload by hand
    local = Settings.from_env({"CDC_DAGSTER_WEBSERVER": "http://127.0.0.1:3000"}).cadence.webserver
    assert local == WebserverAddress("127.0.0.1", 3000) and str(local) == "http://127.0.0.1:3000"
    hosted = WebserverAddress.parse("https://dagster.example.com/prefix/")
    assert hosted == WebserverAddress("dagster.example.com", None, True, "/prefix")


def test_errors_name_the_flag_that_gave_the_value() -> None:
    given = {"CDC_LAKEHOUSE": "--lakehouse", "CDC_TABLES": "--tables"}
    assert named_as_given("CDC_LAKEHOUSE=/x is a file: point CDC_LAKEHOUSE at a directory.", given) == (
        "--lakehouse /x is a file: point --lakehouse at a directory."
    )
    # a variable the flag did not give, or one whose name holds another's, stays as it is
    assert named_as_given("set CDC_EXCLUDE_TABLES or CDC_RABBITMQ_TABLES", given) == "set CDC_EXCLUDE_TABLES or CDC_RABBITMQ_TABLES"
    assert set(FLAG_VARIABLES.values()) <= {v for v in re.findall(r"`(CDC_[A-Z_]+)`", CONFIGURATION.read_text())}


def test_a_lakehouse_given_by_flag_is_named_as_the_flag(cdc: CdcEnv, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = main(["--lakehouse", str(blocker), "sync"])
    line = _one_sentence(code, capsys.readouterr().err, f"--lakehouse {blocker} is a file, not a directory")
    assert "CDC_LAKEHOUSE" not in line


def test_flags_reach_the_forked_child_and_the_run_without_the_environment(cdc: CdcEnv, tmp_path: Path) -> None:
    """The CLI writes no environment: its flags go into the settings it builds and passes on. A sync from the command
    line given --lakehouse and --tables captures (in its forked child), applies and checks (in its run) only the
    flagged table, into the flagged lakehouse; the environment's lakehouse is never made."""
    cdc.execute("CREATE TABLE a (id INT PRIMARY KEY)", "CREATE TABLE b (id INT PRIMARY KEY)")
    cdc.execute("INSERT INTO a VALUES (1), (2)", "INSERT INTO b VALUES (3)")
    flagged = tmp_path / "flagged"
    done = run_cli("--lakehouse", str(flagged), "--tables", f"{cdc.database}.a", "sync")
    assert done.returncode == 0, done.stderr
    assert "sync succeeded" in done.stdout and "failed:" not in done.stdout
    house = Lakehouse(str(flagged))
    assert known_tables(house.store) == [f"{cdc.database}.a"]
    assert read_current(house, TableRef(cdc.database, "a")).column("id").to_pylist() == [1, 2]
    assert not cdc.lakehouse_dir.exists()


@pytest.mark.both_sources
def test_a_password_on_the_command_line_is_refused_and_never_shown(cdc: CdcEnv, monkeypatch) -> None:
    """A password in `--mysql-url` would show in `ps` for the whole run: it is refused, pointing to the environment
    (docs/configuration.md: passwords are read from the environment only); a URL without a password is taken."""
    url = cdc.server.reader_url()
    password = MySQLUrl.parse(url).password
    monkeypatch.delenv("CDC_MYSQL_URL")
    done = run_cli("--mysql-url", url, "status")
    line = _one_sentence(done.returncode, done.stderr, "--mysql-url holds a password", "ps", "CDC_MYSQL_URL")
    assert password not in done.stdout + done.stderr and password not in line
    done = run_cli("--rabbitmq-url", "amqp://guest:s3cret-pw@127.0.0.1:5672/%2F", "publish")
    _one_sentence(done.returncode, done.stderr, "--rabbitmq-url holds a password", "CDC_RABBITMQ_URL")
    assert "s3cret-pw" not in done.stdout + done.stderr
    _nothing_written(cdc)
    # the same URL from the environment works; a flag without a password is taken (and then the server refuses it)
    monkeypatch.setenv("CDC_MYSQL_URL", url)
    assert run_cli("status").returncode == 0
    without = url.replace(f":{password}@", "@")
    done = run_cli("--mysql-url", without, "status")
    _one_sentence(done.returncode, done.stderr, "rejected user", "fix the credentials in --mysql-url")


@pytest.mark.both_sources
def test_a_hash_in_a_password_names_its_percent_encoding(cdc: CdcEnv, monkeypatch, capsys) -> None:
    """`#` ends a URL's user and password part: the sentence says to write it %23, and that URL then works."""
    cdc.execute(
        "DROP USER IF EXISTS 'hash_reader'@'127.0.0.1'",
        "CREATE USER 'hash_reader'@'127.0.0.1' IDENTIFIED BY 'pa#ss/wo?rd'",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'hash_reader'@'127.0.0.1'",
    )
    if cdc.server.flavour == "mariadb":
        cdc.execute("GRANT BINLOG MONITOR ON *.* TO 'hash_reader'@'127.0.0.1'")
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    monkeypatch.setenv("CDC_MYSQL_URL", f"mysql://hash_reader:pa#ss/wo?rd@127.0.0.1:{cdc.server.port}")
    code = main(["sync"])
    line = _one_sentence(code, capsys.readouterr().err, "CDC_MYSQL_URL's user or password holds", "%23", "%2F", "%3F")
    assert "pa#ss" not in line
    _nothing_written(cdc)
    monkeypatch.setenv("CDC_MYSQL_URL", f"mysql://hash_reader:pa%23ss%2Fwo%3Frd@127.0.0.1:{cdc.server.port}")
    assert main(["sync"]) == 0
    assert all(d.ok for d in cdc.verify())


@pytest.mark.both_sources
def test_another_replica_with_the_same_server_id_is_named_with_the_fix(cdc: CdcEnv, tmp_path: Path) -> None:
    """A replica that connects with the sync's server id makes the source end the sync's binlog stream (MySQL: error
    1236; MariaDB: 4052, or a reset connection when the stream was mid-packet): the sync ends with one sentence naming
    the clash and the flag that set the id, and the lakehouse keeps its last complete batch."""
    cdc.execute("CREATE TABLE t (id INT PRIMARY KEY, pad TEXT)")
    # The lakehouse begins here, not at the start of the server's binlog, which the worker's other tests share: the
    # sync below reads only this test's changes, whatever ran before it
    assert main(["sync"]) == 0
    begun = (cdc.lakehouse_dir / CHECKPOINT_KEY).read_bytes()
    # About 24 MB of binlog in transactions of 1 MB, so the server is still sending when the rival connects: a batch
    # ends only between transactions, and what the kernel may buffer for a sync that sleeps grows with what it read
    # (to 32 MB here: net.ipv4.tcp_rmem). In CI, under load, this sync once ended with 0 and nothing printed when its
    # first batch was a 6 MB transaction read after the worker's other tests' binlog (not reproduced alone)
    one_mb = f"INSERT INTO t SELECT seq + (SELECT COALESCE(MAX(id), 0) FROM t), REPEAT('x', 1000) FROM {cdc.numbers(1000)}"
    cdc.execute(*[one_mb] * 24)
    server_id = "4200777"
    env = {"CDC_SYNC_FORK": "0", "CDC_MAX_BATCH_ROWS": "1000", "CDC_FAILPOINTS": "capture.checkpoint_saved=sleep:3"}
    sync = subprocess.Popen(
        [sys.executable, "-m", "cdc_assets.cli", "--server-id", server_id, "sync"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while (cdc.lakehouse_dir / CHECKPOINT_KEY).read_bytes() == begun:  # the first batch is durable, capture sleeps
        assert time.monotonic() < deadline and sync.poll() is None, sync.stderr.read() if sync.stderr else ""
        time.sleep(0.05)
    url = MySQLUrl.parse(cdc.server.reader_url())
    rival = connect(url)
    first = binlog_files(rival)[0][0]
    read = threading.Thread(target=lambda: sum(1 for _ in dump_events(rival, int(server_id), BinlogPosition(first, 4))))
    read.start()
    out, err = sync.communicate(timeout=300)
    read.join(timeout=120)
    rival.close()
    assert sync.returncode != 0, f"the sync never saw the rival; it printed {out!r}"
    _one_sentence(sync.returncode, err, "same server id", "--server-id")
    assert "CDC_SERVER_ID" not in err
    # what was durable stays: the checkpoint at the end of the last complete batch, and a later sync goes on from it
    assert main(["sync"]) == 0
    assert all(d.ok for d in cdc.verify())
