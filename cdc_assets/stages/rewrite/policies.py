"""Column policies applied to earlier layers (`cdc-lakehouse forget TABLE --rewrite-policies`): a policy added to
columns already captured leaves their clear values in the raw batches, change log, current state and history until
this rewrites them (`layers.rewrite_table_layers`, under `run.run_rewrite`'s locks and record).

Which values are clear is told by value (`ColumnPolicy.settle_texts`, as the comparisons tell them), not by seq: the
same layer holds rows captured before the policy beside rows captured after it (current state's older rows, a
history version an implicit ALTER carried over), and both must end policed. An excluded column is dropped from every
layer (the change log's `_cdc_before` too) and from the raw batches' images and shapes; a hashed or masked column's
clear values are hashed or masked from their text (the raw batches' canonical text; in the Delta layers the text the
implicit ALTER made of them, as the comparisons read them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdc_assets.core.column_policy import CLEAR, EXCLUDE, HASH, MASK, ColumnPolicy, Rules, lake_shape
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.layout import POLICY_REWRITES_STATE
from cdc_assets.lake.state import load_policy_record, policies_rewritten
from cdc_assets.lake.store import Lakehouse, MissingObject
from cdc_assets.stages.rewrite.layers import LayerCount
from cdc_assets.stages.rewrite.run import PENDING, run_rewrite

BEFORE = "_cdc_before"


@dataclass(frozen=True)
class ApplyPolicies:
    """`layers.TableRewrite` that applies rules added since capture (`added`: column -> exclude, hash or mask) to
    every row of the table, returning None for rows that hold no clear value and no excluded column."""

    policy: ColumnPolicy
    added: Rules

    def raw_shape(self, shape: TableShape) -> TableShape:
        return lake_shape(shape, {c.name: self.added.get(c.name, CLEAR) for c in shape.columns})

    def raw_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        rules = [self.added.get(c.name, CLEAR) for c in shape.columns]
        if all(rule == CLEAR for rule in rules):
            return None
        keep = [i for i, rule in enumerate(rules) if rule != EXCLUDE]
        changed = len(keep) < len(rules)
        columns = {}
        for name in ("before", "after"):
            images = rows.column(name).to_pylist()
            present = [image for image in images if image is not None]
            for i, rule in enumerate(rules):
                if rule in (HASH, MASK):
                    texts, found = self.policy.settle_texts(rule, [image[i] for image in present])
                    changed = changed or bool(found)
                    for image, text in zip(present, texts, strict=True):
                        image[i] = text
            columns[name] = pa.array([None if im is None else [im[i] for i in keep] for im in images], pa.list_(pa.string()))
        if not changed:
            return None
        for name, values in columns.items():
            rows = rows.set_column(rows.column_names.index(name), name, values)
        return rows

    def change_rows(self, rows: pa.Table) -> pa.Table | None:
        return self._settled(rows)

    def current_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        return self._settled(rows)

    def history_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        return self._settled(rows)

    def _settled(self, rows: pa.Table) -> pa.Table | None:
        """Rows of a Delta layer: excluded columns dropped (and from the before-image), clear values policed."""
        changed = False
        for name, rule in sorted(self.added.items()):
            if name not in rows.column_names:
                continue
            if rule == EXCLUDE:
                rows, changed = rows.drop_columns([name]), True
                continue
            column, found = self._settled_column(rule, rows.column(name))
            if found:
                rows, changed = rows.set_column(rows.column_names.index(name), name, column), True
        if BEFORE in rows.column_names and pa.types.is_struct(rows.schema.field(BEFORE).type):
            before, found = self._settled_struct(rows.column(BEFORE).combine_chunks() if rows.num_rows else None, rows.schema.field(BEFORE).type)
            if found:
                rows, changed = rows.set_column(rows.column_names.index(BEFORE), BEFORE, before), True
        return rows if changed else None

    def _settled_column(self, rule: str, values: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, int]:
        texts, found = self.policy.settle_texts(rule, [None if v is None else str(v) for v in values.to_pylist()])
        return pa.array(texts, pa.string()), found

    def _settled_struct(self, values: pa.StructArray | None, kind: pa.StructType) -> tuple[pa.Array, bool]:
        """The change log's before-image struct with the same done to its fields; True when anything changed."""
        fields = [kind.field(i) for i in range(kind.num_fields)]
        kept = [f for f in fields if self.added.get(f.name, CLEAR) != EXCLUDE]
        changed = len(kept) < len(fields)
        if values is None:
            return pa.array([], pa.struct(kept)), changed
        arrays = []
        for f in kept:
            child = values.field(f.name)
            rule = self.added.get(f.name, CLEAR)
            if rule in (HASH, MASK):
                child, found = self._settled_column(rule, child)
                changed = changed or bool(found)
            arrays.append(child)
        retyped = [f.with_type(a.type) for f, a in zip(kept, arrays, strict=True)]
        struct = pa.StructArray.from_arrays(arrays, fields=retyped, mask=values.is_null())
        return struct, changed


def refuse_key_columns(table: TableRef, shape: TableShape, added: Rules) -> None:
    """A policy added to a key column after capture is not rewritten: every layer keys its rows (and their order,
    merges and history) on the clear key. One sentence names the way out."""
    keyed = sorted(name for name in shape.primary_key if added.get(name, CLEAR) != CLEAR)
    if keyed:
        raise CdcUserError(
            f"A column policy was added to the key column{'s' if len(keyed) > 1 else ''} {', '.join(keyed)} of {table} "
            f"after it was captured, which --rewrite-policies cannot rewrite (every layer is keyed on it): take "
            f"`cdc-lakehouse snapshot {table}` to load the table under the policy."
        )


# -- the record -----------------------------------------------------------------------------------------------------


@dataclass
class PolicyRewriteRecord:
    """What one `--rewrite-policies` did, under `_state/policy_rewrites/<schema>/<table>/<id>.json`: the columns and
    their rules (no value), and the per-layer counts; `pending` until every layer is rewritten."""

    id: str
    table: str
    columns: Rules
    started_at: float
    status: str = PENDING
    finished_at: float | None = None
    layers: dict[str, LayerCount] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{POLICY_REWRITES_STATE}/{TableRef.parse(self.table).path}/{self.id}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "table": self.table, "columns": self.columns, "started_at": self.started_at,
            "status": self.status, "finished_at": self.finished_at,
            "layers": {layer: count.to_json() for layer, count in self.layers.items()},
        }  # fmt: skip

    @staticmethod
    def from_json(d: dict[str, Any]) -> PolicyRewriteRecord:
        return PolicyRewriteRecord(
            d["id"], d["table"], dict(d["columns"]), float(d["started_at"]), d["status"], d.get("finished_at"),
            {layer: LayerCount.from_json(c) for layer, c in (d.get("layers") or {}).items()},
        )  # fmt: skip

    @staticmethod
    def begin(table: TableRef, columns: Rules) -> PolicyRewriteRecord:
        began = time.time()
        return PolicyRewriteRecord(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(began)), str(table), dict(columns), began)


def save_rewrite_record(lakehouse: Lakehouse, record: PolicyRewriteRecord) -> None:
    lakehouse.store.put(record.key, json.dumps(record.to_json(), indent=1, sort_keys=True).encode())


def rewrite_records(lakehouse: Lakehouse, table: TableRef) -> list[PolicyRewriteRecord]:
    """The table's policy rewrite records, oldest first."""
    records = []
    for key in lakehouse.store.list_keys(f"{POLICY_REWRITES_STATE}/{table.path}"):
        try:
            records.append(PolicyRewriteRecord.from_json(json.loads(lakehouse.store.get(key))))
        except (MissingObject, ValueError, KeyError, TypeError):
            raise CdcUserError(f"The policy rewrite record {key} in the lakehouse is corrupt: restore it from a backup.") from None
    return sorted(records, key=lambda r: (r.started_at, r.id))


# -- the run --------------------------------------------------------------------------------------------------------


class _NothingToRewrite(Exception):
    """No column of the table got a policy after capture: the run stops before any layer is touched."""


def rewrite_policies(
    catch_up: Callable[[], None],
    lakehouse: Lakehouse,
    table: TableRef,
    policy: ColumnPolicy,
    owner: str = "cdc-lakehouse forget --rewrite-policies",
) -> PolicyRewriteRecord | None:
    """Apply to every earlier layer of `table` the column policies added since it was captured (the columns
    `_state/column_policies.json` lists under `rewrite`, `column_policy.REWRITE_COMMAND`), vacuum what held the clear
    values, then clear that entry (`lake.state.policies_rewritten`) so the comparisons stop allowing for them.
    None when no policy was added to a captured column of the table. Exactly once like a forget (`run_rewrite`)."""

    def begin(shape: TableShape) -> tuple[PolicyRewriteRecord, ApplyPolicies]:
        added = load_policy_record(lakehouse.store).rewrite.get(str(table)) or {}
        record = next((r for r in rewrite_records(lakehouse, table) if r.status == PENDING), None)
        if record is None:
            if not added:
                raise _NothingToRewrite
            record = PolicyRewriteRecord.begin(table, added)
        record.columns = {**record.columns, **added}  # a policy added between a crash and the run again, too
        refuse_key_columns(table, shape, record.columns)
        save_rewrite_record(lakehouse, record)
        return record, ApplyPolicies(policy, record.columns)

    try:
        return run_rewrite(
            catch_up, lakehouse, table, owner, begin,
            save=lambda record: save_rewrite_record(lakehouse, record),
            finish=lambda _: policies_rewritten(lakehouse.store, str(table)),
        )  # fmt: skip
    except _NothingToRewrite:
        return None
