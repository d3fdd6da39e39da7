"""Preflight refusals a real server cannot be talked into here: a server without a binary log (a second,
dedicated MariaDB started without one) and versions too old to read (the version gate itself)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_assets.cli import main
from cdc_assets.core.errors import CdcUserError
from cdc_assets.local_source import server as local_server
from cdc_assets.source.server import supported_flavor
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.test_cli import _assert_user_error, _nothing_written


@pytest.fixture(scope="module")
def server_without_binlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_server.LocalServer]:
    base: Path = tmp_path_factory.mktemp("mariadb_no_binlog")
    started = local_server.start(base, binlog=False)
    yield started
    local_server.stop(base)


def test_binlog_off(cdc: CdcEnv, server_without_binlog: local_server.LocalServer, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CDC_MYSQL_URL", server_without_binlog.reader_url())
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
