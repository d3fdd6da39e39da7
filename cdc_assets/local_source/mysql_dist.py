"""Oracle MySQL for the local servers, from Debian's unstable suite, unpacked into a folder of the project's own.

Debian 12 ships only MariaDB; its unstable suite ships `mysql-server-core`. We fetch that package and the libraries
it needs with a private apt configuration (the machine's own package lists stay as they are), unpack them with
`dpkg -x` into one prefix and run `mysqld` through that prefix's own dynamic loader. Nothing of the system changes,
and the prefix is reused once complete (`.local/mysql-dist/` of the checkout, or `CDC_MYSQL_DIST`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIST_DIR = PROJECT_ROOT / ".local" / "mysql-dist"
PACKAGE = "mysql-server-core"
# What the closure lists but mysqld never loads: perl and the packaging tools (the server needs no script of theirs).
NOT_NEEDED = re.compile(r"^(perl|perl-base|perl-modules-.*|libperl.*|dpkg|debconf.*|libgdbm.*|libdb5.*)$")
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/mysql/private")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def dist_dir() -> Path:
    configured = os.environ.get("CDC_MYSQL_DIST")
    return Path(configured).resolve() if configured else DEFAULT_DIST_DIR


def _complete_marker(prefix: Path) -> Path:
    return prefix / ".complete"


def installed(prefix: Path | None = None) -> bool:
    return _complete_marker(prefix or dist_dir()).exists()


def version(prefix: Path | None = None) -> str:
    """The unpacked server's version, as `mysqld --version` prints it (e.g. `9.7.4-2`)."""
    out = subprocess.run([*mysqld_command(prefix), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"Ver (\S+)", out)
    return match.group(1) if match else out.strip()


def mysqld_command(prefix: Path | None = None) -> list[str]:
    """`mysqld`, started through the prefix's own loader and libraries, with the options that place it there."""
    prefix = (prefix or dist_dir()).resolve()
    if not installed(prefix):
        raise RuntimeError(f"MySQL is not installed under {prefix}: run `make install` (it installs it there).")
    loader = prefix / "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    library_path = ":".join(str(prefix / d) for d in LIB_DIRS)
    return [
        str(loader),
        "--library-path",
        library_path,
        str(prefix / "usr/sbin/mysqld"),
        "--no-defaults",
        f"--basedir={prefix / 'usr'}",
        f"--lc-messages-dir={prefix / 'usr/share/mysql'}",
    ]


def _debian_mirror() -> str:
    """The Debian archive the machine's own apt uses for its release (read at install time, never stored)."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for path in candidates:
        if not path.exists():
            continue
        text = path.read_text()
        for block in re.split(r"\n\s*\n", text):  # deb822 stanzas
            uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
            if uris and suites and "security" not in uris.group(1) and "-security" not in suites.group(1):
                return uris.group(1)
        for line in text.splitlines():  # one-line form
            match = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line.strip())
            if match and "security" not in match.group(1):
                return match.group(1)
    raise RuntimeError("No Debian package source found in /etc/apt: cannot fetch MySQL from Debian's unstable suite.")


def install(prefix: Path | None = None) -> Path:
    """Unpack MySQL and its library closure into `prefix`; a complete prefix is kept as it is."""
    prefix = (prefix or dist_dir()).resolve()
    if installed(prefix):
        return prefix
    shutil.rmtree(prefix, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="mysql-dist-") as tmp:
        work = Path(tmp)
        for d in ("lists/partial", "cache/archives/partial", "debs"):
            (work / d).mkdir(parents=True)
        (work / "sources.list").write_text(f"deb [signed-by={KEYRING}] {_debian_mirror()} sid main\n")
        options = [
            "-o", f"Dir::Etc::sourcelist={work / 'sources.list'}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={work / 'lists'}",
            "-o", f"Dir::Cache={work / 'cache'}",
            *(["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []),  # _apt cannot enter a private folder
        ]  # fmt: skip
        subprocess.run(["apt-get", *options, "-qq", "update"], check=True, stdout=subprocess.DEVNULL)
        closure = subprocess.run(
            ["apt-cache", *options, "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
             "--no-breaks", "--no-replaces", "--no-enhances", PACKAGE],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        packages = sorted(
            {line for line in closure.splitlines() if re.match(r"^[a-z0-9]", line) and not NOT_NEEDED.match(line)}
        )
        subprocess.run(
            ["apt-get", *options, "-qq", "download", *packages], check=True, cwd=work / "debs", stdout=subprocess.DEVNULL
        )
        staging = prefix.with_name(prefix.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for deb in sorted((work / "debs").glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        staging.rename(prefix)
    _complete_marker(prefix).write_text(", ".join(packages) + "\n")
    return prefix
