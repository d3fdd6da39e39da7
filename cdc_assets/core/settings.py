"""Configuration (docs/configuration.md) as one typed value, `Settings`, read from an environment's texts (a
`Mapping[str, str]`: the process's, with the CLI's flags over it) once, range-checked at once, and passed down.
No function here reads the process's environment: whoever builds the value says which one.

Passwords live only in memory: `MySQLUrl` never prints one.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse, urlsplit

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef, split_name

if TYPE_CHECKING:
    from cdc_assets.core.column_policy import ColumnPolicy

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
DEFAULT_CHECK_INTERVAL_SECONDS = 60.0  # the continuous mode compares the tables it changed this often
DEFAULT_FULL_CHECK_INTERVAL_SECONDS = 3600.0  # and every table this often
DEFAULT_SPARK_MASTER = "local[*]"  # spark_resources.session's too
DEFAULT_SPARK_MIN_ROWS = 1_000_000  # on a local master; spark_resources.engine's too (test_settings holds them equal)
SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def env_number(
    name: str, default: float, valid: Callable[[float], bool], meaning: str, env: Mapping[str, str]
) -> float:
    """A number from `env` (default when unset); anything else (not a number, out of range, infinite or NaN) ends
    in one sentence with the fix."""
    text = env.get(name)
    try:
        value = float(text) if text else default
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not valid(value):
        raise CdcUserError(f"{name}={text!r} is not {meaning}: set it to e.g. {default:g}.")
    return value


def env_window(
    names: tuple[str, str],
    defaults: tuple[float, float],
    valid: Callable[[float], bool],
    meaning: str,
    env: Mapping[str, str],
) -> tuple[float, float]:
    """A (warn, fail) pair of thresholds from `env`, each `valid`, warn below fail."""
    warn_name, fail_name = names
    warn, fail = (env_number(n, d, valid, meaning, env) for n, d in zip(names, defaults, strict=True))
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


def s3_retries_from_env(env: Mapping[str, str]) -> S3Retries:
    """CDC_S3_MAX_ATTEMPTS (a whole number, at least 1) and CDC_S3_TIMEOUT_SECONDS (above 0)."""
    attempts = env_number(
        "CDC_S3_MAX_ATTEMPTS", DEFAULT_S3_MAX_ATTEMPTS, lambda v: v >= 1 and v == int(v), "a whole number of at least 1",
        env,
    )  # fmt: skip
    timeout = env_number("CDC_S3_TIMEOUT_SECONDS", DEFAULT_S3_TIMEOUT_SECONDS, lambda v: v > 0, "a number of seconds", env)
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
        if not self.host:  # DEMO_SOURCE, not looked up yet
            return "the local demo server"
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


def _no_policy() -> ColumnPolicy:
    from cdc_assets.core.column_policy import ColumnPolicy  # pyarrow: loaded by what polices rows, not by every import

    return ColumnPolicy()


# CDC_MYSQL_URL unset: the local demo server's URL, looked up where the source is first needed
# (source.server.resolved_source), so that settings are built where no source runs (the UI's code location).
DEMO_SOURCE = MySQLUrl("", 0, "", "")
# The local demo servers a source without a URL reads (CDC_DEMO_SOURCE, a component's `demo_source`): MariaDB (the
# default) or Oracle MySQL, each under `.local/<flavour>` (local_source.server).
DEMO_FLAVOURS = ("mariadb", "mysql")


@dataclass(frozen=True)
class SourceSettings:
    """How the pipeline reads its source: where, as which replica, which tables, how it cuts batches, and the
    column policies its rows are kept under (core/column_policy: capture, snapshots, verify and repair apply them)."""

    url: MySQLUrl
    server_id: int = DEFAULT_SERVER_ID
    table_filter: TableFilter = field(default_factory=TableFilter)
    max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS
    max_batches: int | None = None  # stop a capture after this many batches (None: to the binlog end)
    snapshot_chunk_rows: int = DEFAULT_SNAPSHOT_CHUNK_ROWS  # a Spark snapshot reads a table in key ranges this long
    global_read_lock: bool = False  # CDC_GLOBAL_READ_LOCK: consistent points on MySQL under FLUSH TABLES WITH READ LOCK
    column_policy: ColumnPolicy = field(default_factory=_no_policy)  # CDC_EXCLUDE/HASH/MASK_COLUMNS, CDC_HASH_KEY
    demo_flavour: str = DEMO_FLAVOURS[0]  # CDC_DEMO_SOURCE: which local demo server DEMO_SOURCE stands for


def lakehouse_identity(location: str) -> str:
    """What names a lakehouse across processes and working directories: an s3:// URL as it is, a directory as an
    absolute path."""
    if "://" in location:
        return location.rstrip("/")
    return str(Path(location).resolve())


@dataclass(frozen=True)
class LakehouseSettings:
    """Where the lakehouse is and how every stage treats it: the tables with history or soft deletes, how long a
    stage waits for another run of itself and how long a killed run's lease lives (S3), how S3 requests are retried,
    and the size of current state's key-range files. `lake.store.lakehouse_from` makes the Lakehouse of them."""

    location: str = DEFAULT_LAKEHOUSE
    history: TableSelection = field(default_factory=TableSelection)  # CDC_HISTORY_TABLES
    soft_deletes: TableSelection = field(default_factory=TableSelection)  # CDC_SOFT_DELETES
    lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS
    lock_ttl_seconds: float = DEFAULT_LOCK_TTL_SECONDS
    s3_retries: S3Retries = field(default_factory=S3Retries)
    current_file_kb: float = DEFAULT_CURRENT_FILE_KB  # CDC_CURRENT_FILE_KB (stages/current/rows.py)

    @property
    def current_piece_bytes(self) -> int:
        """The size of current state's key-range files, in bytes. Larger files cost a merge more per changed key
        and a whole-table reader fewer files."""
        return int(self.current_file_kb * 1024)


@dataclass(frozen=True)
class EngineSettings:
    """Which engine a stage run takes (spark_resources.engine): the Spark master or Connect server, from how many
    changes a run goes to Spark, and the user's own Spark settings on top of the pipeline's."""

    spark_master: str = DEFAULT_SPARK_MASTER
    spark_min_rows: int = DEFAULT_SPARK_MIN_ROWS
    spark_conf: Mapping[str, str] = field(default_factory=dict)  # CDC_SPARK_CONF


WEBSERVER_ENV = "CDC_DAGSTER_WEBSERVER"


@dataclass(frozen=True)
class WebserverAddress:
    """Where the Dagster webserver that serves the source's code location answers (CDC_DAGSTER_WEBSERVER,
    `http://host:port[/prefix]`): the new-tables sensor asks it, through Dagster's GraphQL client, to reload the code
    location once tables were captured that have no assets yet, so they appear without a manual reload."""

    host: str
    port: int | None = None
    use_https: bool = False
    path_prefix: str = ""

    @classmethod
    def parse(cls, text: str) -> WebserverAddress | None:
        """None for an empty text; a text that is no http(s) URL with a host raises one sentence with the fix."""
        text = text.strip()
        if not text:
            return None
        parsed = urlsplit(text)
        try:
            port = parsed.port
        except ValueError:
            port = -1
        if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1 or parsed.query:
            raise CdcUserError(
                f"{WEBSERVER_ENV}={text} is not the address of a Dagster webserver: write e.g. "
                "http://localhost:3000 (or https://dagster.example.com/prefix)."
            )
        return cls(parsed.hostname, port, parsed.scheme == "https", parsed.path.rstrip("/"))

    def __str__(self) -> str:
        port = f":{self.port}" if self.port else ""
        return f"{'https' if self.use_https else 'http'}://{self.host}{port}{self.path_prefix}"


@dataclass(frozen=True)
class CadenceSettings:
    """How often and how late, for the definitions (schedules, sensors, freshness, the checks' thresholds) and the
    continuous mode: read once when the code location loads (or the CLI starts), then passed to what builds them."""

    capture_cron: str | None = None  # CDC_CAPTURE_CRON: the schedule mode's cron (None: the automation captures)
    capture_interval_seconds: float | None = None  # CDC_CAPTURE_INTERVAL_SECONDS: the binlog sensor's (None: off)
    full_check_cron: str = DEFAULT_FULL_CHECK_CRON
    continuous: bool = False  # CDC_CONTINUOUS: the continuous sensor starts switched on
    check_interval_seconds: float = DEFAULT_CHECK_INTERVAL_SECONDS
    full_check_interval_seconds: float = DEFAULT_FULL_CHECK_INTERVAL_SECONDS
    freshness_warn_minutes: float = DEFAULT_FRESHNESS_WARN_MINUTES
    freshness_fail_minutes: float = DEFAULT_FRESHNESS_FAIL_MINUTES
    freshness_tables: tuple[tuple[str, float, float], ...] = ()  # CDC_FRESHNESS_TABLES: (glob, warn, fail), in order
    lag_warn_seconds: float = DEFAULT_FRESHNESS_WARN_MINUTES * 60
    lag_fail_seconds: float = DEFAULT_FRESHNESS_FAIL_MINUTES * 60
    sink_lag_warn_seconds: float = DEFAULT_FRESHNESS_WARN_MINUTES * 60
    sink_lag_fail_seconds: float = DEFAULT_FRESHNESS_FAIL_MINUTES * 60
    asset_owners: tuple[str, ...] = ()  # CDC_ASSET_OWNERS
    webserver: WebserverAddress | None = None  # CDC_DAGSTER_WEBSERVER: where new tables' reload is asked for

    @property
    def freshness_windows(self) -> tuple[float, float]:
        """(warn, fail) in minutes: every table's but those CDC_FRESHNESS_TABLES gives others, the capture's, the sinks'."""
        return self.freshness_warn_minutes, self.freshness_fail_minutes

    def table_freshness_windows(self, table: str) -> tuple[float, float]:
        """(warn, fail) in minutes for one `schema.table`: the first CDC_FRESHNESS_TABLES glob it matches, else the
        global windows."""
        ref = TableRef.parse(table)
        for glob, warn, fail in self.freshness_tables:
            if _glob_matches(glob, ref.schema, ref.table):
                return warn, fail
        return self.freshness_windows

    @property
    def lag_thresholds(self) -> tuple[float, float]:
        """(warn, fail) in seconds of the per-table lag check."""
        return self.lag_warn_seconds, self.lag_fail_seconds

    @property
    def sink_lag_thresholds(self) -> tuple[float, float]:
        """(warn, fail) in seconds of each sink's lag check."""
        return self.sink_lag_warn_seconds, self.sink_lag_fail_seconds

    @property
    def confirm_every_seconds(self) -> float:
        """How old a quiet table's last materialization may be before a capture confirms it up to date again: a
        quarter of the warn window, so a capture every minute keeps every quiet table fresh with room to spare."""
        return self.freshness_warn_minutes * 60 / 4

    @property
    def schedule_mode(self) -> bool:
        """CDC_CAPTURE_CRON or CDC_CAPTURE_INTERVAL_SECONDS set: the capture schedule (or the binlog sensor) and the
        raw-batch sensor update the tables, not the automation."""
        return self.capture_cron is not None or self.capture_interval_seconds is not None

    @property
    def automation_on(self) -> bool:
        return not self.schedule_mode and not self.continuous


@dataclass(frozen=True)
class Settings:
    """Every setting of one pipeline (one source into one lakehouse), typed and range-checked, built once from the
    environment (`from_env`; the CLI's flags over it) and passed down as a value: below the CLI and the Dagster
    resources nothing reads the environment, so two values in one process are two pipelines (test_settings).

    `environment` keeps the CDC_* and AWS_* texts the value was read from: the Dagster resources are built from them
    (defs/resources.resources_of: a variable of the process's environment stays an EnvVar, out of run config), and
    the sinks' from them one sink at a time (sinks.settings.sink_settings: a sink badly set fails its own runs)."""

    source: SourceSettings
    lakehouse: LakehouseSettings = field(default_factory=LakehouseSettings)
    # CDC_SOURCE_NAME, or a component's `name`: every asset key, job, sensor, schedule, resource and run-queue lane of
    # the source lives under it, so many sources share one Dagster deployment (defs/keys.SourceKeys). None: the one
    # unnamed source of the environment, with the keys as they always were (`current/<schema>/<table>`).
    name: str | None = None
    engine: EngineSettings = field(default_factory=EngineSettings)
    cadence: CadenceSettings = field(default_factory=CadenceSettings)
    progress_seconds: float = DEFAULT_PROGRESS_SECONDS  # CDC_PROGRESS_SECONDS: the CLI's progress lines
    sync_fork: str = "1"  # CDC_SYNC_FORK: 1 (fork a sync's capture and stages), capture (its capture only), 0 (none)
    environment: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def from_env(env: Mapping[str, str]) -> Settings:
        """Every setting read from `env` at once, so a bad value ends a command (or the code location's load) with
        its sentence before any work starts, whichever stage would use it first (or never, in this command)."""
        for setting in (*SOURCE_ENV.values(), *LAKEHOUSE_ENV.values()):
            setting.value(env)  # the whole numbers first, as the resources' fields check them
        source = source_from_env(env)
        lakehouse = lakehouse_from_env(env)
        engine = engine_from_env(env)
        cadence = cadence_from_env(env)
        for name in ("CDC_SINK_DEDUP_SECONDS", "CDC_SINK_HEARTBEAT_SECONDS"):
            sink_seconds(env, name)  # the rest of a sink's settings: sinks.settings.sink_settings, per sink
        return Settings(
            source=source,
            lakehouse=lakehouse,
            name=source_name(env.get("CDC_SOURCE_NAME")),
            engine=engine,
            cadence=cadence,
            progress_seconds=env_number(
                "CDC_PROGRESS_SECONDS", DEFAULT_PROGRESS_SECONDS, lambda s: s > 0, "a positive number of seconds", env
            ),
            sync_fork=(env.get("CDC_SYNC_FORK") or "1").strip(),
            environment={k: v for k, v in env.items() if k.startswith(("CDC_", "AWS_"))},
        )


@dataclass(frozen=True)
class EnvSetting:
    """A resource field's environment variable, its default when unset, and whether it is a whole number."""

    variable: str
    default: object = None
    whole_number: bool = False
    minimum: int | None = None  # a whole number's bounds, both included
    maximum: int | None = None

    def value(self, env: Mapping[str, str]) -> object:
        """The variable's value in `env` (a whole number checked, in its bounds), else the default."""
        text = env.get(self.variable)
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


# The variables of the source's and the lakehouse's texts, by the name of the resource field each fills
# (BinlogResource, LakehouseResource): Dagster's resources take them as EnvVars, `Settings.from_env` parses them.
# A setting added to a resource and not here fails test_settings.
SOURCE_ENV = {
    "mysql_url": EnvSetting("CDC_MYSQL_URL"),
    "server_id": EnvSetting("CDC_SERVER_ID", DEFAULT_SERVER_ID, whole_number=True, minimum=1, maximum=MAX_SERVER_ID),
    "tables": EnvSetting("CDC_TABLES"),
    "exclude_tables": EnvSetting("CDC_EXCLUDE_TABLES"),
    "max_batch_rows": EnvSetting("CDC_MAX_BATCH_ROWS", DEFAULT_MAX_BATCH_ROWS, whole_number=True, minimum=1),
    "exclude_columns": EnvSetting("CDC_EXCLUDE_COLUMNS"),
    "hash_columns": EnvSetting("CDC_HASH_COLUMNS"),
    "mask_columns": EnvSetting("CDC_MASK_COLUMNS"),
    "hash_key": EnvSetting("CDC_HASH_KEY"),
    "demo_source": EnvSetting("CDC_DEMO_SOURCE"),
}
LAKEHOUSE_ENV = {
    "location": EnvSetting("CDC_LAKEHOUSE", DEFAULT_LAKEHOUSE),
    "history_tables": EnvSetting("CDC_HISTORY_TABLES"),
    "soft_deletes": EnvSetting("CDC_SOFT_DELETES"),
}


SOURCE_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,39}")


def source_name(text: str | None) -> str | None:
    """A source's name as Dagster will carry it (an asset key's first part, a job name's prefix, a run tag): lower
    case letters, digits and `_`, a letter first, at most 40; None for no name."""
    name = (text or "").strip()
    if not name:
        return None
    if not SOURCE_NAME_PATTERN.fullmatch(name):
        raise CdcUserError(
            f"The source name {name!r} cannot name Dagster asset keys and jobs: use lower-case letters, digits and "
            "'_', starting with a letter, at most 40 characters (for example orders_db)."
        )
    if "__" in name:
        raise CdcUserError(f"The source name {name!r} holds '__', which separates a source's name from its jobs' names: use a single '_'.")
    return name


def source_from_env(env: Mapping[str, str]) -> SourceSettings:
    """The source's settings (`max_batches` is no variable: it is a run's own)."""
    from cdc_assets.core.column_policy import policy_from_env  # pyarrow: see _no_policy

    url = env.get("CDC_MYSQL_URL")
    return SourceSettings(
        url=MySQLUrl.parse(url) if url else DEMO_SOURCE,
        server_id=int(SOURCE_ENV["server_id"].value(env)),  # type: ignore[call-overload]
        table_filter=TableFilter.parse(env.get("CDC_TABLES"), env.get("CDC_EXCLUDE_TABLES")),
        max_batch_rows=int(SOURCE_ENV["max_batch_rows"].value(env)),  # type: ignore[call-overload]
        snapshot_chunk_rows=_snapshot_chunk_rows(env),
        global_read_lock=_global_read_lock(env),
        column_policy=policy_from_env(env),  # a bad column glob, or hashing without a key
        demo_flavour=demo_flavour_of(env.get("CDC_DEMO_SOURCE")),
    )


def demo_flavour_of(text: str | None) -> str:
    """CDC_DEMO_SOURCE: the local demo server read while CDC_MYSQL_URL is unset, `mariadb` (the default) or `mysql`."""
    flavour = (text or "").strip().lower() or DEMO_FLAVOURS[0]
    if flavour not in DEMO_FLAVOURS:
        raise CdcUserError(f"CDC_DEMO_SOURCE={flavour} is not a server the demo runs: set it to mariadb or mysql.")
    return flavour


def lakehouse_from_env(env: Mapping[str, str]) -> LakehouseSettings:
    return LakehouseSettings(
        location=str(LAKEHOUSE_ENV["location"].value(env)),
        history=TableSelection.parse(env.get("CDC_HISTORY_TABLES"), "CDC_HISTORY_TABLES"),
        soft_deletes=TableSelection.parse(env.get("CDC_SOFT_DELETES"), "CDC_SOFT_DELETES"),
        lock_wait_seconds=env_number(
            "CDC_LOCK_WAIT_SECONDS", DEFAULT_LOCK_WAIT_SECONDS, lambda v: v >= 0, "a number of seconds", env
        ),
        # at least 3 s, as the lease is renewed every third of it
        lock_ttl_seconds=env_number(
            "CDC_LOCK_TTL_SECONDS", DEFAULT_LOCK_TTL_SECONDS, lambda v: v >= 3, "a number of seconds of at least 3", env
        ),
        s3_retries=s3_retries_from_env(env),
        current_file_kb=env_number(
            "CDC_CURRENT_FILE_KB", DEFAULT_CURRENT_FILE_KB, lambda kb: kb >= 1, "a size in KB of at least 1", env
        ),
    )


def engine_from_env(env: Mapping[str, str]) -> EngineSettings:
    """CDC_SPARK_MIN_ROWS: runs with at least this many changes go to Spark. By default DEFAULT_SPARK_MIN_ROWS on a
    local master (a Spark job's fixed cost exceeds smaller runs' work), 0 on a cluster or a Spark Connect server:
    every run there is Spark's, as a user who points the pipeline at a cluster expects."""
    master = env.get("CDC_SPARK_MASTER") or DEFAULT_SPARK_MASTER
    default = 0 if master.startswith(("spark://", "sc://")) else DEFAULT_SPARK_MIN_ROWS
    min_rows = int(env_number("CDC_SPARK_MIN_ROWS", default, lambda v: v >= 0 and v == int(v), "a whole number", env))
    return EngineSettings(master, min_rows, spark_conf_of(env.get("CDC_SPARK_CONF")))


def spark_conf_of(text: str | None) -> dict[str, str]:
    """CDC_SPARK_CONF: Spark settings of the user's, as a JSON object of names and values, on top of ours."""
    if not text:
        return {}
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise CdcUserError(
            'CDC_SPARK_CONF is not a JSON object of Spark settings: write it as e.g. {"spark.executor.memory": "2g"}.'
        )
    return {k: str(v) for k, v in settings.items()}


def _snapshot_chunk_rows(env: Mapping[str, str]) -> int:
    """CDC_SNAPSHOT_CHUNK_ROWS: a positive whole number."""
    valid = lambda v: v >= 1 and v == int(v)  # noqa: E731
    return int(env_number("CDC_SNAPSHOT_CHUNK_ROWS", DEFAULT_SNAPSHOT_CHUNK_ROWS, valid, "a positive whole number", env))


def _global_read_lock(env: Mapping[str, str]) -> bool:
    """CDC_GLOBAL_READ_LOCK: `on` takes consistent points on MySQL under a moment of FLUSH TABLES WITH READ LOCK
    (needs RELOAD; RDS and Aurora refuse it); `off`, the default, takes them without a lock."""
    text = (env.get("CDC_GLOBAL_READ_LOCK") or "off").strip().lower()
    if text in ("on", "true", "1", "yes"):
        return True
    if text in ("off", "false", "0", "no"):
        return False
    raise CdcUserError(f"CDC_GLOBAL_READ_LOCK={text!r} is not on or off: set it to on, or unset it.")


OWNERS_ENV = "CDC_ASSET_OWNERS"
FRESHNESS_TABLES_ENV = "CDC_FRESHNESS_TABLES"


def cadence_from_env(env: Mapping[str, str]) -> CadenceSettings:
    """The schedules', sensors', freshness's and checks' settings, and the continuous mode's check intervals."""
    capture_interval = None
    if env.get("CDC_CAPTURE_INTERVAL_SECONDS"):
        capture_interval = env_number(
            "CDC_CAPTURE_INTERVAL_SECONDS", 10, lambda s: s >= 1, "a number of seconds of at least 1", env
        )
    warn, fail = env_window(
        ("CDC_FRESHNESS_WARN_MINUTES", "CDC_FRESHNESS_FAIL_MINUTES"),
        (DEFAULT_FRESHNESS_WARN_MINUTES, DEFAULT_FRESHNESS_FAIL_MINUTES),
        lambda minutes: minutes >= 1,
        "a number of minutes of at least 1 (Dagster's shortest freshness window)",
        env,
    )
    # the lag checks' thresholds default to the freshness windows, so a check names the tables behind when
    # freshness warns or fails
    lag = env_window(
        ("CDC_LAG_WARN_SECONDS", "CDC_LAG_FAIL_SECONDS"), (warn * 60, fail * 60), lambda s: s > 0,
        "a positive number of seconds", env,
    )  # fmt: skip
    sink_lag = env_window(
        ("CDC_SINK_LAG_WARN_SECONDS", "CDC_SINK_LAG_FAIL_SECONDS"), (warn * 60, fail * 60), lambda s: s > 0,
        "a positive number of seconds", env,
    )  # fmt: skip
    return CadenceSettings(
        capture_cron=env.get("CDC_CAPTURE_CRON") or None,
        capture_interval_seconds=capture_interval,
        full_check_cron=env.get("CDC_FULL_CHECK_CRON") or DEFAULT_FULL_CHECK_CRON,
        continuous=(env.get("CDC_CONTINUOUS") or "").strip().lower() in ("1", "true", "yes", "on"),
        check_interval_seconds=env_number(
            "CDC_CHECK_INTERVAL_SECONDS", DEFAULT_CHECK_INTERVAL_SECONDS, lambda s: s > 0, "a positive number of seconds", env
        ),
        full_check_interval_seconds=env_number(
            "CDC_FULL_CHECK_INTERVAL_SECONDS", DEFAULT_FULL_CHECK_INTERVAL_SECONDS, lambda s: s > 0,
            "a positive number of seconds", env,
        ),  # fmt: skip
        freshness_warn_minutes=warn,
        freshness_fail_minutes=fail,
        freshness_tables=tuple(table_freshness_rules(env)),
        lag_warn_seconds=lag[0],
        lag_fail_seconds=lag[1],
        sink_lag_warn_seconds=sink_lag[0],
        sink_lag_fail_seconds=sink_lag[1],
        asset_owners=asset_owners(env),
        webserver=WebserverAddress.parse(env.get(WEBSERVER_ENV) or ""),
    )


def table_freshness_rules(env: Mapping[str, str]) -> list[tuple[str, float, float]]:
    """CDC_FRESHNESS_TABLES: comma-separated `schema.table=WARN/FAIL` (minutes), each glob's freshness windows,
    the first glob a table matches winning; the other tables keep CDC_FRESHNESS_WARN/FAIL_MINUTES."""
    text = env.get(FRESHNESS_TABLES_ENV) or ""
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


def asset_owners(env: Mapping[str, str]) -> tuple[str, ...]:
    """CDC_ASSET_OWNERS: comma-separated owners of every asset, each an e-mail address or `team:<name>`."""
    owners = tuple(o.strip() for o in (env.get(OWNERS_ENV) or "").split(",") if o.strip())
    for owner in owners:
        if not (owner.startswith("team:") and len(owner) > 5) and not ("@" in owner and " " not in owner):
            raise CdcUserError(
                f"{OWNERS_ENV} entry {owner!r} is neither an e-mail address nor team:<name>: write e.g. "
                "data@example.com,team:analytics."
            )
    return owners


def sink_seconds(env: Mapping[str, str], name: str) -> float:
    """CDC_SINK_DEDUP_SECONDS, CDC_SINK_HEARTBEAT_SECONDS (from `env`): a number of seconds, 0 (the default) off."""
    return env_number(name, 0.0, lambda s: s >= 0, "a number of seconds (0: off)", env)
