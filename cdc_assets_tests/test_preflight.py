"""Preflight refusals a real server cannot be talked into here: a server without a binary log (a second,
dedicated server of each flavour started without one) and versions too old to read (the version gate itself)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cdc_assets.cli import main
from cdc_assets.core.errors import CdcUserError
from cdc_assets.local_source import server as local_server
from cdc_assets.source.server import supported_flavor
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_cli import _assert_user_error, _nothing_written


@pytest.fixture(scope="module")
def without_binlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], local_server.LocalServer]]:
    """A server of a flavour started without a binary log, started when first asked for."""
    started: dict[str, local_server.LocalServer] = {}

    def server(flavour: str) -> local_server.LocalServer:
        if flavour not in started:
            base = tmp_path_factory.mktemp(f"{flavour}_no_binlog")
            started[flavour] = local_server.start(base, binlog=False, flavour=flavour)
        return started[flavour]

    yield server
    for each in started.values():
        local_server.stop(each.base_dir)


@pytest.mark.both_sources
def test_binlog_off(cdc: CdcEnv, without_binlog: Callable[[str], local_server.LocalServer], monkeypatch, capsys) -> None:
    monkeypatch.setenv("CDC_MYSQL_URL", without_binlog(cdc.server.flavour).reader_url())
    code = main(["sync"])
    _, err = capsys.readouterr()
    _assert_user_error(code, err, "Binary logging is off on the source (log_bin=OFF)", "--log-bin")
    _nothing_written(cdc)


@pytest.mark.parametrize(
    ("version", "fix"),
    [
        ("10.4.32-MariaDB", "upgrade it to MariaDB 10.5 or later"),
        ("10.1.48-MariaDB-0+deb9u2", "upgrade it to MariaDB 10.5 or later"),
        ("5.6.51-log", "upgrade it to MySQL 5.7 or later"),
    ],
)
def test_unsupported_server_versions_are_refused(version: str, fix: str) -> None:
    with pytest.raises(CdcUserError, match=f"which is not supported: {fix}"):
        supported_flavor(version)


@pytest.mark.parametrize(
    ("version", "flavor"),
    [("10.11.6-MariaDB-0+deb12u1", "mariadb"), ("10.5.0-MariaDB", "mariadb"), ("8.0.36", "mysql"), ("8.4.3", "mysql")],
)
def test_supported_server_versions(version: str, flavor: str) -> None:
    assert supported_flavor(version) == flavor


def test_a_connection_lost_during_preflight_is_one_sentence(cdc: CdcEnv, monkeypatch, capsys) -> None:
    """The source's server restarting just as a command starts: preflight's connection is killed by the server
    between its connect and its queries (CI once hit it in test_source_faults' restart), and the command ends
    with the lost connection's sentence, exit 2, not a traceback, having written nothing."""
    from cdc_assets.source import server as source

    connect = source.connect

    def connected_then_killed(url, **kwargs):  # noqa: ANN001, ANN202 - source.connect's own signature
        conn = connect(url, **kwargs)
        with cdc.server.admin_connection() as admin, admin.cursor() as cur:
            cur.execute(f"KILL CONNECTION {conn.thread_id()}")  # the real server ends the real connection
        return conn

    monkeypatch.setattr(source, "connect", connected_then_killed)
    code = main(["sync"])
    _, err = capsys.readouterr()
    _assert_user_error(code, err, "was lost mid-way", "run the command again")
    _nothing_written(cdc)
