"""Configuration from the environment (README: Configuration), parsed into plain values.

Passwords live only in memory: `MySQLUrl` never prints one.
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef, split_name

DEFAULT_SERVER_ID = 4_200_001  # the reader's replica id; the demo source uses 1
MAX_SERVER_ID = (1 << 32) - 1  # server_id is an unsigned 32-bit number; 0 is no replica's
DEFAULT_LAKEHOUSE = "./lakehouse"
DEFAULT_MAX_BATCH_ROWS = 100_000
DEFAULT_SNAPSHOT_CHUNK_ROWS = 500_000  # rows one Spark task of a snapshot reads: what a resumed snapshot may read again
DEFAULT_LOCK_WAIT_SECONDS = 120.0  # how long a stage waits for another run of the same stage to finish
DEFAULT_LOCK_TTL_SECONDS = 60.0  # an S3 lease not renewed for this long may be taken over (a killed run's)
DEFAULT_S3_MAX_ATTEMPTS = 5  # tries of one S3 request (the first and its retries), by every S3 client
DEFAULT_S3_TIMEOUT_SECONDS = 30.0  # one S3 request's connect and read timeout
DEFAULT_CAPTURE_CRON = "* * * * *"
DEFAULT_FULL_CHECK_CRON = "0 * * * *"  # every row of every table compared with the source: hourly
DEFAULT_FRESHNESS_WARN_MINUTES = 2.0
DEFAULT_FRESHNESS_FAIL_MINUTES = 5.0
DEFAULT_CURRENT_FILE_KB = 32.0  # current state's key-range files (stages/current/rows.py)
DEFAULT_PROGRESS_SECONDS = 5.0  # how often long work prints a progress line where the output is no terminal
SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def env_number(
    name: str, default: float, valid: Callable[[float], bool], meaning: str, env: Mapping[str, str] | None = None
) -> float:
    """A number from the environment (or `env`; default when unset); anything else (not a number, out of range,
    infinite or NaN) ends in one sentence with the fix."""
    text = (os.environ if env is None else env).get(name)
    try:
        value = float(text) if text else default
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not valid(value):
        raise CdcUserError(f"{name}={text!r} is not {meaning}: set it to e.g. {default:g}.")
    return value


def env_window(
    names: tuple[str, str], defaults: tuple[float, float], valid: Callable[[float], bool], meaning: str
) -> tuple[float, float]:
    """A (warn, fail) pair of thresholds from the environment, each `valid`, warn below fail."""
    warn_name, fail_name = names
    warn, fail = (env_number(n, d, valid, meaning) for n, d in zip(names, defaults, strict=True))
    if warn >= fail:
        raise CdcUserError(
            f"{warn_name} ({warn:g}) must be below {fail_name} ({fail:g}): lower the first or raise the second."
        )
    return warn, fail


@dataclass(frozen=True)
class S3Retries:
    """How every S3 client of the pipeline retries one request (boto3 for objects and leases, delta-rs for Delta
    tables, pyarrow in Spark tasks): up to `max_attempts` tries with exponential backoff on 5xx, throttling
    (SlowDown), resets and timeouts, each try cut after `timeout_seconds`. Set once (CDC_S3_MAX_ATTEMPTS,
    CDC_S3_TIMEOUT_SECONDS), so an endpoint that stays down fails every client within about the same bound."""

    max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS
    timeout_seconds: float = DEFAULT_S3_TIMEOUT_SECONDS

    @property
    def give_up_seconds(self) -> float:
        """About the longest one request takes before its client gives up: every try timing out, plus backoff."""
        return self.max_attempts * self.timeout_seconds + 2.0 * (self.max_attempts - 1)

    def boto_config(self) -> dict[str, object]:
        """botocore `Config` arguments: standard retry mode (exponential backoff with jitter, throttling and
        5xx and connection errors retried, conditional-write 412s not)."""
        return {
            "retries": {"mode": "standard", "total_max_attempts": self.max_attempts},
            "connect_timeout": self.timeout_seconds,
            "read_timeout": self.timeout_seconds,
        }

    def delta_options(self) -> dict[str, str]:
        """delta-rs (object_store) storage options with the same meaning: retries after the first try, each try's
        timeouts, and a total retry budget so it gives up within `give_up_seconds` too."""
        millis = f"{max(1, round(self.timeout_seconds * 1000))}ms"
        return {
            "max_retries": str(self.max_attempts - 1),
            "retry_timeout": f"{max(1, round(self.give_up_seconds * 1000))}ms",
            "timeout": millis,
            "connect_timeout": millis,
        }


def s3_retries_from_env() -> S3Retries:
    """CDC_S3_MAX_ATTEMPTS (a whole number, at least 1) and CDC_S3_TIMEOUT_SECONDS (above 0)."""
    attempts = env_number(
        "CDC_S3_MAX_ATTEMPTS", DEFAULT_S3_MAX_ATTEMPTS, lambda v: v >= 1 and v == int(v), "a whole number of at least 1"
    )
    timeout = env_number("CDC_S3_TIMEOUT_SECONDS", DEFAULT_S3_TIMEOUT_SECONDS, lambda v: v > 0, "a number of seconds")
    return S3Retries(int(attempts), timeout)


# Characters that end a URL's user and password part where they stand (urlparse reads what follows as the path,
# query or fragment): in a user or password they must be percent-encoded.
_URL_DELIMITERS = {"#": "%23", "/": "%2F", "?": "%3F"}


def refuse_unencoded_userinfo(url: str, variable: str, example: str) -> None:
    """A URL whose user or password holds a character that ends that part (`#`, `/`, `?`) is refused with the
    percent-encoding that fixes it, naming the character and never the password."""
    scheme, separator, rest = url.partition("://")
    if not separator or "@" not in rest:
        return
    userinfo = rest.rpartition("@")[0]
    found = [c for c in _URL_DELIMITERS if c in userinfo]
    if found:
        codes = ", ".join(f"{c} as {_URL_DELIMITERS[c]}" for c in found)
        raise CdcUserError(
            f"{variable}'s user or password holds {' and '.join(repr(c) for c in found)}, which ends that part of a URL: "
            f"percent-encode it ({codes}; also @ as %40, : as %3A and % as %25), e.g. {example}."
        )


@dataclass(frozen=True)
class MySQLUrl:
    """`mysql://user:password@host:port` of the source."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)

    @staticmethod
    def parse(url: str) -> MySQLUrl:
        refuse_unencoded_userinfo(url, "CDC_MYSQL_URL", "mysql://user:pa%23ss@host:port")
        parsed = urlparse(url)
        if parsed.scheme not in ("mysql", "mariadb") or not parsed.hostname or not parsed.username:
            raise CdcUserError("CDC_MYSQL_URL is not a valid URL: write it as mysql://user:password@host:port.")
        try:
            port = parsed.port or 3306
        except ValueError as exc:
            raise CdcUserError(
                "CDC_MYSQL_URL has an invalid port: write it as mysql://user:password@host:port."
            ) from exc
        return MySQLUrl(parsed.hostname, port, unquote(parsed.username), unquote(parsed.password or ""))

    def __str__(self) -> str:
        return f"mysql://{self.user}@{self.host}:{self.port}"

    def connection_settings(self) -> dict[str, object]:
        return {"host": self.host, "port": self.port, "user": self.user, "password": self.password}


@dataclass(frozen=True)
class TableFilter:
    """CDC_TABLES / CDC_EXCLUDE_TABLES: comma-separated `schema.table` globs."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @staticmethod
    def parse(include: str | None, exclude: str | None) -> TableFilter:
        def split(text: str | None) -> tuple[str, ...]:
            globs = tuple(g.strip() for g in (text or "").split(",") if g.strip())
            for g in globs:
                try:
                    split_name(g)
                except CdcUserError:
                    raise CdcUserError(
                        f"Table pattern '{g}' has no schema: write CDC_TABLES and CDC_EXCLUDE_TABLES "
                        "entries as schema.table globs, e.g. shop.* or shop.orders (a name with a dot in backticks)."
                    ) from None
            return globs

        return TableFilter(split(include), split(exclude))

    def matches(self, schema: str, table: str) -> bool:
        if self.include:
            if not any(_glob_matches(g, schema, table) for g in self.include):
                return False
        elif schema in SYSTEM_SCHEMAS:
            return False
        return not any(_glob_matches(g, schema, table) for g in self.exclude)

    def matches_schema(self, schema: str) -> bool:
        """Whether any table of `schema` could match (used to keep DDL of other schemas out)."""
        if self.include:
            return any(fnmatch.fnmatchcase(schema, split_name(g)[0]) for g in self.include)
        return schema not in SYSTEM_SCHEMAS


@dataclass(frozen=True)
class TableSelection:
    """Tables a feature is on for (CDC_HISTORY_TABLES, CDC_SOFT_DELETES): comma-separated `schema.table` globs;
    none by default (unlike TableFilter, an empty selection selects nothing)."""

    globs: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str | None, variable: str) -> TableSelection:
        globs = tuple(g.strip() for g in (text or "").split(",") if g.strip())
        for g in globs:
            try:
                split_name(g)
            except CdcUserError:
                raise CdcUserError(
                    f"Table pattern '{g}' in {variable} has no schema: write its entries as schema.table globs, "
                    "e.g. shop.* or shop.orders (a name with a dot in backticks)."
                ) from None
        return TableSelection(globs)

    def __contains__(self, table: object) -> bool:
        """Whether the table (a TableRef or its `schema.table` text) is selected."""
        ref = table if isinstance(table, TableRef) else TableRef.parse(str(table))
        return any(_glob_matches(g, ref.schema, ref.table) for g in self.globs)


def _glob_matches(glob: str, schema: str, table: str) -> bool:
    """A `schema.table` glob against a table: part by part (a part in backticks may hold dots), or against the
    plain `schema.table` text as earlier versions matched it."""
    schema_glob, table_glob = split_name(glob)
    if fnmatch.fnmatchcase(schema, schema_glob) and fnmatch.fnmatchcase(table, table_glob):
        return True
    return fnmatch.fnmatchcase(f"{schema}.{table}", glob)


@dataclass(frozen=True)
class SourceSettings:
    """How the pipeline reads its source: where, as which replica, which tables, and how it cuts batches."""

    url: MySQLUrl
    server_id: int = DEFAULT_SERVER_ID
    table_filter: TableFilter = field(default_factory=TableFilter)
    max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS
    max_batches: int | None = None  # stop a capture after this many batches (None: to the binlog end)
    snapshot_chunk_rows: int = DEFAULT_SNAPSHOT_CHUNK_ROWS  # a Spark snapshot reads a table in key ranges this long
    global_read_lock: bool = False  # CDC_GLOBAL_READ_LOCK: consistent points on MySQL under FLUSH TABLES WITH READ LOCK


@dataclass(frozen=True)
class EnvSetting:
    """A resource field's environment variable, its default when unset, and whether it is a whole number."""

    variable: str
    default: object = None
    whole_number: bool = False
    minimum: int | None = None  # a whole number's bounds, both included
    maximum: int | None = None

    def value(self) -> object:
        """The variable's value (a whole number checked, in its bounds), else the default."""
        text = os.environ.get(self.variable)
        if not text:
            return self.default
        if not self.whole_number:
            return text
        try:
            number = int(text)
        except ValueError:
            number = None
        low, high = self.minimum, self.maximum
        if number is None or (low is not None and number < low) or (high is not None and number > high):
            raise CdcUserError(
                f"{self.variable}={text!r} is not {self.meaning()}: set it to one (default {self.default}), or unset it."
            )
        return number

    def meaning(self) -> str:
        """What a valid value is, in words."""
        if self.minimum is not None and self.maximum is not None:
            return f"a whole number from {self.minimum} to {self.maximum:,}"
        if self.minimum is not None:
            return f"a whole number of at least {self.minimum}"
        return "a whole number"


# The one list of the variables the source's and the lakehouse's settings come from, by the name of the
# resource field each fills (BinlogResource, LakehouseResource). Dagster's resources take them as EnvVars; the
# capture a `sync` forks before Dagster is imported reads their values here. A setting added to a resource and
# not here fails test_settings.
SOURCE_ENV = {
    "mysql_url": EnvSetting("CDC_MYSQL_URL"),
    "server_id": EnvSetting("CDC_SERVER_ID", DEFAULT_SERVER_ID, whole_number=True, minimum=1, maximum=MAX_SERVER_ID),
    "tables": EnvSetting("CDC_TABLES"),
    "exclude_tables": EnvSetting("CDC_EXCLUDE_TABLES"),
    "max_batch_rows": EnvSetting("CDC_MAX_BATCH_ROWS", DEFAULT_MAX_BATCH_ROWS, whole_number=True, minimum=1),
}
LAKEHOUSE_ENV = {
    "location": EnvSetting("CDC_LAKEHOUSE", DEFAULT_LAKEHOUSE),
    "history_tables": EnvSetting("CDC_HISTORY_TABLES"),
    "soft_deletes": EnvSetting("CDC_SOFT_DELETES"),
}


def source_values_from_env() -> dict[str, object]:
    """The source's settings as the environment gives them, by BinlogResource field (`max_batches` is no
    variable: it is a run's own)."""
    return {name: setting.value() for name, setting in SOURCE_ENV.items()} | {
        "snapshot_chunk_rows": snapshot_chunk_rows(),
        "global_read_lock": global_read_lock(),
    }


def lakehouse_values_from_env() -> dict[str, object]:
    """A local lakehouse's settings as the environment gives them, by LakehouseResource field (the S3 ones are
    S3Resource's and the retries')."""
    return {name: setting.value() for name, setting in LAKEHOUSE_ENV.items()} | {
        "lock_wait_seconds": lock_wait_seconds(),
        "lock_ttl_seconds": lock_ttl_seconds(),
    }


def snapshot_chunk_rows() -> int:
    """CDC_SNAPSHOT_CHUNK_ROWS: a positive whole number (read here, not as an EnvVar, to check it first)."""
    valid = lambda v: v >= 1 and v == int(v)  # noqa: E731
    return int(env_number("CDC_SNAPSHOT_CHUNK_ROWS", DEFAULT_SNAPSHOT_CHUNK_ROWS, valid, "a positive whole number"))


def global_read_lock() -> bool:
    """CDC_GLOBAL_READ_LOCK: `on` takes consistent points on MySQL under a moment of FLUSH TABLES WITH READ LOCK
    (needs RELOAD; RDS and Aurora refuse it); `off`, the default, takes them without a lock."""
    text = (os.environ.get("CDC_GLOBAL_READ_LOCK") or "off").strip().lower()
    if text in ("on", "true", "1", "yes"):
        return True
    if text in ("off", "false", "0", "no"):
        return False
    raise CdcUserError(f"CDC_GLOBAL_READ_LOCK={text!r} is not on or off: set it to on, or unset it.")


def lock_wait_seconds() -> float:
    return env_number("CDC_LOCK_WAIT_SECONDS", DEFAULT_LOCK_WAIT_SECONDS, lambda v: v >= 0, "a number of seconds")


def lock_ttl_seconds() -> float:
    """CDC_LOCK_TTL_SECONDS: at least 3 s, as the lease is renewed every third of it."""
    return env_number("CDC_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS, lambda v: v >= 3, "a number of seconds of at least 3")


def spark_min_rows(master: str, local_default: int) -> int:
    """CDC_SPARK_MIN_ROWS: runs with at least this many changes go to Spark. By default `local_default` on a local
    master (a Spark job's fixed cost exceeds smaller runs' work), 0 on a cluster or a Spark Connect server: every run
    there is Spark's, as a user who points the pipeline at a cluster expects."""
    default = 0 if master.startswith(("spark://", "sc://")) else local_default
    return int(env_number("CDC_SPARK_MIN_ROWS", default, lambda v: v >= 0 and v == int(v), "a whole number"))


# Numbers read where they are used (the stages, the continuous mode, sensors, freshness, the sinks, the CLI's
# progress): each one's rule is here, so `check_numeric_settings` can refuse a bad value before any work starts.


def check_interval() -> float:
    """CDC_CHECK_INTERVAL_SECONDS: how often the continuous mode compares the tables it changed with the source."""
    return env_number("CDC_CHECK_INTERVAL_SECONDS", 60, lambda s: s > 0, "a positive number of seconds")


def full_check_interval() -> float:
    """CDC_FULL_CHECK_INTERVAL_SECONDS: how often the continuous mode compares every table with the source."""
    return env_number("CDC_FULL_CHECK_INTERVAL_SECONDS", 3600, lambda s: s > 0, "a positive number of seconds")


def capture_interval() -> float | None:
    """CDC_CAPTURE_INTERVAL_SECONDS: how often the binlog sensor looks for new changes (None: capture on the cron)."""
    if not os.environ.get("CDC_CAPTURE_INTERVAL_SECONDS"):
        return None
    return env_number("CDC_CAPTURE_INTERVAL_SECONDS", 10, lambda s: s >= 1, "a number of seconds of at least 1")


def current_file_kb() -> float:
    """CDC_CURRENT_FILE_KB: the size of current state's key-range files, in KB (at least 1)."""
    return env_number("CDC_CURRENT_FILE_KB", DEFAULT_CURRENT_FILE_KB, lambda kb: kb >= 1, "a size in KB of at least 1")


def freshness_windows() -> tuple[float, float]:
    """(warn, fail) in minutes from CDC_FRESHNESS_WARN_MINUTES / CDC_FRESHNESS_FAIL_MINUTES."""
    return env_window(
        ("CDC_FRESHNESS_WARN_MINUTES", "CDC_FRESHNESS_FAIL_MINUTES"),
        (DEFAULT_FRESHNESS_WARN_MINUTES, DEFAULT_FRESHNESS_FAIL_MINUTES),
        lambda minutes: minutes >= 1,
        "a number of minutes of at least 1 (Dagster's shortest freshness window)",
    )


FRESHNESS_TABLES_ENV = "CDC_FRESHNESS_TABLES"


def table_freshness_rules(env: Mapping[str, str] | None = None) -> list[tuple[str, float, float]]:
    """CDC_FRESHNESS_TABLES: comma-separated `schema.table=WARN/FAIL` (minutes), each glob's freshness windows,
    the first glob a table matches winning; the other tables keep CDC_FRESHNESS_WARN/FAIL_MINUTES."""
    text = (os.environ if env is None else env).get(FRESHNESS_TABLES_ENV) or ""
    rules = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        glob, _, windows = entry.rpartition("=")
        warn_text, _, fail_text = windows.partition("/")
        try:
            split_name(glob.strip())
            warn, fail = float(warn_text), float(fail_text)
        except (CdcUserError, ValueError):
            raise CdcUserError(
                f"{FRESHNESS_TABLES_ENV} entry '{entry}' is not schema.table=WARN/FAIL: write e.g. shop.orders=1/3 "
                "(warn after 1 minute, fail after 3)."
            ) from None
        if not (math.isfinite(warn) and math.isfinite(fail) and 1 <= warn < fail):
            raise CdcUserError(
                f"{FRESHNESS_TABLES_ENV} entry '{entry}' needs a warn window of at least 1 minute below its fail "
                "window: write e.g. shop.orders=1/3."
            )
        rules.append((glob.strip(), warn, fail))
    return rules


def table_freshness_windows(table: str, rules: list[tuple[str, float, float]] | None = None) -> tuple[float, float]:
    """(warn, fail) in minutes for one `schema.table`: the first CDC_FRESHNESS_TABLES glob it matches, else the
    global windows."""
    ref = TableRef.parse(table)
    for glob, warn, fail in table_freshness_rules() if rules is None else rules:
        if _glob_matches(glob, ref.schema, ref.table):
            return warn, fail
    return freshness_windows()


def lag_thresholds() -> tuple[float, float]:
    """(warn, fail) in seconds for the per-table lag check: CDC_LAG_WARN_SECONDS / CDC_LAG_FAIL_SECONDS, by
    default the freshness windows, so the check names the tables behind when freshness warns or fails."""
    warn_minutes, fail_minutes = freshness_windows()
    return env_window(
        ("CDC_LAG_WARN_SECONDS", "CDC_LAG_FAIL_SECONDS"),
        (warn_minutes * 60, fail_minutes * 60),
        lambda seconds: seconds > 0,
        "a positive number of seconds",
    )


def sink_lag_thresholds() -> tuple[float, float]:
    """(warn, fail) in seconds for each sink's lag check: CDC_SINK_LAG_WARN_SECONDS / CDC_SINK_LAG_FAIL_SECONDS,
    by default the freshness windows."""
    warn_minutes, fail_minutes = freshness_windows()
    return env_window(
        ("CDC_SINK_LAG_WARN_SECONDS", "CDC_SINK_LAG_FAIL_SECONDS"),
        (warn_minutes * 60, fail_minutes * 60),
        lambda seconds: seconds > 0,
        "a positive number of seconds",
    )


def sink_seconds(env: Mapping[str, str], name: str) -> float:
    """CDC_SINK_DEDUP_SECONDS, CDC_SINK_HEARTBEAT_SECONDS (from `env`): a number of seconds, 0 (the default) off."""
    return env_number(name, 0.0, lambda s: s >= 0, "a number of seconds (0: off)", env)


def progress_seconds() -> float:
    """CDC_PROGRESS_SECONDS: how often long work prints a progress line where the output is no terminal."""
    return env_number("CDC_PROGRESS_SECONDS", DEFAULT_PROGRESS_SECONDS, lambda s: s > 0, "a positive number of seconds")


def check_numeric_settings() -> None:
    """Every numeric setting read once, so a bad value ends a command with its sentence before any work starts,
    whichever stage would read it first (or never, in this command). Dagster-free: a `sync` checks them before it
    forks its capture."""
    for setting in (*SOURCE_ENV.values(), *LAKEHOUSE_ENV.values()):
        setting.value()
    snapshot_chunk_rows()
    lock_wait_seconds()
    lock_ttl_seconds()
    s3_retries_from_env()
    spark_min_rows(os.environ.get("CDC_SPARK_MASTER") or "local[*]", 0)
    check_interval()
    full_check_interval()
    capture_interval()
    current_file_kb()
    lag_thresholds()
    table_freshness_rules()
    sink_lag_thresholds()
    for name in ("CDC_SINK_DEDUP_SECONDS", "CDC_SINK_HEARTBEAT_SECONDS"):
        sink_seconds(os.environ, name)
    progress_seconds()
    from cdc_assets.core.column_policy import policy_from_env  # core/column_policy builds on these settings' globs

    policy_from_env()  # a bad column glob, or hashing without a key
