"""The change-log stage's keying of changes, on either engine: in the run's process on Arrow, in the tasks that read
the raw batches on Spark (stages.changes.spark_tasks). The JSON texts are those Spark's to_json wrote when the Spark
engine keyed in its own SQL: change logs written then hold them, so the texts must not change."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from cdc_assets.core.arrow import sorted_rows

_CONTROL = r"[\x00-\x1f]"


def _jackson_string(text: str) -> str:
    """A JSON string as Spark's to_json (Jackson) writes it: non-ASCII kept, control characters escaped
    (\\uXXXX in upper-case hex but for the five short escapes)."""
    encoded = json.dumps(text, ensure_ascii=False)
    return encoded if "\\u" not in encoded else _upper_hex_escapes(encoded)


def _upper_hex_escapes(encoded: str) -> str:
    parts = encoded.split("\\u")
    return parts[0] + "".join("\\u" + p[:4].upper() + p[4:] for p in parts[1:])


def _json_element(values: pa.Array) -> pa.Array:
    """Each value as a JSON string, `null` for NULL."""
    if pc.any(pc.match_substring_regex(values, _CONTROL)).as_py():  # rare: escape in Python
        quoted = pa.array([None if v is None else _jackson_string(v) for v in values.to_pylist()], pa.string())
    else:
        escaped = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
        quoted = pc.binary_join_element_wise('"', escaped, '"', "")
    return pc.fill_null(quoted, "null")


def json_keys(images: pa.Array | pa.ChunkedArray, key_idx: list[int]) -> pa.Array | pa.ChunkedArray:
    """The key of each row image as the JSON array of its key columns' texts (NULL for a NULL image)."""
    if not len(images):
        return pa.array([], pa.string())
    keys = json_key_texts([pc.list_element(images, i) for i in key_idx])
    return pc.if_else(pc.is_valid(images), keys, pa.scalar(None, pa.string()))


def json_key_texts(columns: list[pa.Array | pa.ChunkedArray]) -> pa.Array | pa.ChunkedArray:
    """The JSON array of each row's texts in `columns` (canonical texts of the key columns): the key text every layer
    is matched by (a forget rewrites current state by the texts of its typed key columns)."""
    elements = [_json_element(column) for column in columns]
    inner = elements[0] if len(elements) == 1 else pc.binary_join_element_wise(*elements, ",")
    return pc.binary_join_element_wise("[", inner, "]", "")


def keyed_changes(rows: pa.Table, table_keys: pa.Table) -> pa.Table:
    """Raw rows with `key` and `before_key`, ordered by table and seq; rows whose (batch, table_version) has no
    entry in `table_keys` are left out."""
    index_of = {
        (k["batch"], k["table_version"]): tuple(k["key_idx"]) for k in table_keys.to_pylist()
    }  # a few per table and batch
    group = pc.binary_join_element_wise(rows.column("batch"), pc.cast(rows.column("table_version"), pa.string()), "\x1f")
    encoded = pc.dictionary_encode(group).combine_chunks()
    codes_by_key: dict[tuple[int, ...], list[int]] = {}
    for code, name in enumerate(encoded.dictionary.to_pylist()):
        batch, version = name.split("\x1f")
        key_idx = index_of.get((batch, int(version)))
        if key_idx is not None:
            codes_by_key.setdefault(key_idx, []).append(code)
    parts = []
    for key_idx, codes in codes_by_key.items():
        every = len(codes) == len(encoded.dictionary)  # one key layout for all rows (the common case): no copy
        part = rows if every else rows.filter(pc.is_in(encoded.indices, pa.array(codes, encoded.indices.type)))
        after, before = part.column("after"), part.column("before")  # images are read for their keys only
        before_key = json_keys(before, list(key_idx))
        key = pc.if_else(pc.is_valid(after), json_keys(after, list(key_idx)), before_key)
        parts.append(part.append_column("key", key).append_column("before_key", before_key))
    if not parts:
        empty = rows.schema.append(pa.field("key", pa.string())).append(pa.field("before_key", pa.string()))
        return empty.empty_table()
    return sorted_rows(pa.concat_tables(parts), [("schema", "ascending"), ("table", "ascending"), ("seq", "ascending")])
