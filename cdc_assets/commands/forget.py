"""`cdc-lakehouse forget TABLE --key K … | --keys-file FILE`: a person's rows removed from every layer of the
lakehouse and from storage (`stages/rewrite/forget.py` does the work and keeps the record); `forget TABLE
--rewrite-policies`: column policies added since capture applied to every earlier layer (`stages/rewrite/policies.py`).

It refuses while the source still holds one of the keys: forget follows a DELETE at the source. Were the row still
there, `verify` and the checks would report it missing, and the next change of it, a snapshot or a repair would
bring it back; deleting it at the source first is what makes the forgetting last. The sinks cannot unsend what they
sent: the command names those that had published a change of the keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pymysql

from cdc_assets.core.column_policy import policy_from_env
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import decode_column
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import SourceSettings
from cdc_assets.core.shapes import TableShape
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.lake.store import Lakehouse
from cdc_assets.sinks.checkpoint import SINKS_STATE, load_checkpoint
from cdc_assets.source import server as source
from cdc_assets.source.rows import read_source_rows_with_keys
from cdc_assets.stages.follow import refuse_beside_continuous
from cdc_assets.stages.rewrite.forget import ForgetRecord, canonical_keys, forget, hashed_key, parse_key, table_shape
from cdc_assets.stages.rewrite.policies import PolicyRewriteRecord, rewrite_policies

NO_SUCH_TABLE = 1146


def given_keys(keys: list[str] | None, keys_file: str | None) -> list[str]:
    """The keys as given: each `--key`, then each non-empty line of `--keys-file`."""
    texts = list(keys or [])
    if keys_file is not None:
        try:
            lines = Path(keys_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CdcUserError(f"Cannot read the keys file {keys_file} ({exc.__class__.__name__}): give a readable UTF-8 file, one key a line.") from exc
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise CdcUserError("No key given: name the rows to forget with --key VALUE (repeatable) or --keys-file FILE.")
    return texts


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


def sinks_published(lakehouse: Lakehouse, table: TableRef, seq: int) -> list[str]:
    """The sinks whose checkpoint for `table` is at or past `seq`: they have sent that change on."""
    suffix = ".json"
    names = [key.rsplit("/", 1)[-1][: -len(suffix)] for key in lakehouse.store.list_keys(SINKS_STATE) if key.endswith(suffix)]
    return sorted(name for name in names if load_checkpoint(lakehouse.store, name).seq_of(str(table)) >= seq)


def run_forget(table_text: str, keys: list[str] | None, keys_file: str | None) -> ForgetRecord:
    """`cdc-lakehouse forget`: the keys read and checked, then forgotten in every layer."""
    resources = initialized_resources()
    settings, lakehouse = resources.binlog.settings(), resources.lakehouse.get()
    table = TableRef.parse(table_text)
    shape = table_shape(lakehouse, table)
    texts = given_keys(keys, keys_file)
    policy = policy_from_env()
    canonical = canonical_keys(shape, [parse_key(text, len(shape.primary_key)) for text in texts], policy)
    refuse_beside_continuous(lakehouse)
    lakehouse.check_writable()
    clear = at_source(canonical, hashed_key(shape, policy))
    return forget(
        settings, lakehouse, table, sorted(canonical),
        source_holds=lambda shape, keys: source_holds(settings, shape, clear(keys)),
        published_by=lambda seq: sinks_published(lakehouse, table, seq),
    )  # fmt: skip


def run_rewrite_policies(table_text: str) -> PolicyRewriteRecord | None:
    """`cdc-lakehouse forget TABLE --rewrite-policies`: the column policies added since capture applied to every
    earlier layer (None: no policy was added to a captured column of the table)."""
    resources = initialized_resources()
    settings, lakehouse = resources.binlog.settings(), resources.lakehouse.get()
    table = TableRef.parse(table_text)
    table_shape(lakehouse, table)  # one sentence for a table the lakehouse does not know
    policy = policy_from_env()
    refuse_beside_continuous(lakehouse)
    lakehouse.check_writable()
    return rewrite_policies(settings, lakehouse, table, policy)
