"""The `forget` job's side of a forget (`forget_keys_in`): what it asks the source, and the keys file through which
it gets its keys.

Why a file: a job's config is kept in the Dagster home's run storage and shown in the UI, so a clear key must never
be in it. The command writes the keys (as every layer holds them, each mapped to its text at the source) to a file
of a private temporary directory, passes only the file's path in the run's config, and deletes the directory when
the run ends; the job reads the file (`read_keys_file`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pymysql

from cdc_assets.core.column_policy import ColumnPolicy
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import decode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.store import Lakehouse
from cdc_assets.source import server as source
from cdc_assets.source.rows import read_source_rows_with_keys
from cdc_assets.stages.rewrite.forget import ForgetRecord, forget, hashed_key
from cdc_assets.stages.rewrite.run import table_shape

NO_SUCH_TABLE = 1146


def source_holds(settings: SourceSettings, shape: TableShape, keys: list[str]) -> int:
    """How many of `keys` (JSON key texts at the source) the source table still holds (0 when the table is gone)."""
    if not keys:
        return 0
    columns = [shape.columns[i] for i in shape.key_indexes()]
    values = [json.loads(key) for key in keys]
    typed = pa.table({c.name: decode_column(c, pa.array([v[n] for v in values], pa.string())) for n, c in enumerate(columns)})
    conn = source.connect(settings.url)
    try:
        rows = read_source_rows_with_keys(conn, shape.table, columns, list(shape.primary_key), typed)
    except pymysql.err.ProgrammingError as exc:
        if exc.args and exc.args[0] == NO_SUCH_TABLE:
            return 0
        raise
    finally:
        conn.close()
    return rows.num_rows


def at_source(given: dict[str, str], hashed: bool) -> Callable[[list[str]], list[str]]:
    """The source's key texts of lakehouse keys: those given are known; a key a key change linked to them is its own
    text at the source, unless a column policy hashes a key column (then it cannot be asked for, and is left out)."""
    return lambda keys: [given[k] if k in given else k for k in keys if k in given or not hashed]


@contextmanager
def keys_file(keys: dict[str, str]) -> Iterator[str]:
    """A private file holding `keys` (lakehouse key text -> source key text) for as long as the block runs."""
    with tempfile.TemporaryDirectory(prefix="cdc-forget-") as work:  # mode 0700: only this user reads it
        path = Path(work) / "keys.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(keys, out)
        yield str(path)


def read_keys_file(path: str) -> dict[str, str]:
    """The keys a `keys_file` holds; one sentence when it is gone (a run started again from the UI after the
    command's file was deleted: run the command again)."""
    try:
        keys = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CdcUserError(
            f"The forget run's keys file {path} is gone or unreadable (it lives only while `cdc-lakehouse forget` "
            "runs): run the command again rather than re-executing the run."
        ) from exc
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        raise CdcUserError(f"The forget run's keys file {path} is not what `cdc-lakehouse forget` writes: run the command again.")
    return keys


def forget_keys_in(
    settings: SourceSettings,
    lakehouse: Lakehouse,
    table: TableRef,
    keys: dict[str, str],
    policy: ColumnPolicy,
    owner: str,
    published_by: Callable[[int], list[str]],
    catch_up: Callable[[], None],
) -> ForgetRecord:
    """Forget `keys` (lakehouse key text -> source key text, as `keys_file` holds them) of `table`: the source asked
    whether it still holds them; `published_by(seq)`: the sinks that sent the table's changes up to `seq`
    (`forget.forget`); `catch_up`: the table brought up to date first (`run.run_rewrite`)."""
    clear = at_source(keys, hashed_key(table_shape(lakehouse, table), policy))
    return forget(
        catch_up, lakehouse, table, sorted(keys),
        source_holds=lambda shape, linked: source_holds(settings, shape, clear(linked)),
        owner=owner,
        published_by=published_by,
    )  # fmt: skip
