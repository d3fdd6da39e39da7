"""Column policies for personal data (docs/personal-data.md): the one home of what a policy does to a table.

`CDC_EXCLUDE_COLUMNS`, `CDC_HASH_COLUMNS` and `CDC_MASK_COLUMNS` name columns by `schema.table.column` globs; the hash
key comes from `CDC_HASH_KEY`, from the environment only. Capture applies the policy to each row image as it decodes
it, and every read of the source (snapshots, verify, the checks) applies the same functions to the source's rows, so
no layer ever holds a clear value and both sides of a comparison agree. Pure functions over plain data: no I/O.

- excluded: the column is left out of the table's shape and of every image;
- hashed: HMAC-SHA-256 keyed by `CDC_HASH_KEY` (its UTF-8 bytes) of the value's canonical text (its UTF-8 bytes),
  as 64 lower-case hex digits, in a text column; NULL stays NULL. The same value gives the same hash in every table
  and run, so joins on a hashed column still match;
- masked: every character of the canonical text but the last 4 becomes `*` (a value of 4 characters or fewer is all
  `*`), in a text column; NULL stays NULL.

The canonical text is the one raw batches carry (core/mysql_types): text as it is, numbers in plain decimal digits,
dates and times ISO 8601 (`2024-05-01 12:30:00.000000`), binary as base64.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import ColumnSpec, arrow_type, decode_column, encode_column
from cdc_assets.core.names import TableRef, _read_part
from cdc_assets.core.ops import ALTER
from cdc_assets.core.shapes import Default, SchemaChange, TableShape

EXCLUDE, HASH, MASK, CLEAR = "exclude", "hash", "mask", "clear"
VARIABLES = {EXCLUDE: "CDC_EXCLUDE_COLUMNS", HASH: "CDC_HASH_COLUMNS", MASK: "CDC_MASK_COLUMNS"}
KEY_VARIABLE = "CDC_HASH_KEY"
MIN_KEY_CHARACTERS = 16
MASK_KEEP = 4  # the last characters a mask leaves visible
# the command that rewrites earlier layers under a new policy (built by `cdc-lakehouse forget`)
REWRITE_COMMAND = "cdc-lakehouse forget {table} --rewrite-policies"
Rules = dict[str, str]  # column -> exclude, hash, mask or clear
HASH_FORM = re.compile(r"[0-9a-f]{64}")  # what a hashed value looks like (a clear value left before the policy: not)


def parse_column_glob(glob: str, variable: str) -> tuple[str, str, str]:
    """`schema.table.column` (any part a glob, or in backticks when it holds a dot) as its three parts."""
    parts: list[str] = []
    at = 0
    try:
        while at < len(glob) and len(parts) < 3:
            part, at = _read_part(glob, at, glob)
            parts.append(part)
            if at < len(glob):
                if glob[at] != "." or len(parts) == 3:
                    raise CdcUserError("")
                at += 1
    except CdcUserError:
        parts = []
    if len(parts) != 3 or not all(parts) or at != len(glob):
        raise CdcUserError(
            f"Column pattern '{glob}' in {variable} is not a schema.table.column glob: write its entries like "
            "shop.customers.email or shop.*.email (a name with a dot in backticks)."
        )
    return parts[0], parts[1], parts[2]


def _matches(pattern: tuple[str, str, str], table: TableRef, column: str) -> bool:
    import fnmatch

    schema, name, col = pattern
    return fnmatch.fnmatchcase(table.schema, schema) and fnmatch.fnmatchcase(table.table, name) and fnmatch.fnmatchcase(column, col)


def hash_text(key: bytes, text: str) -> str:
    """The keyed hash of one canonical text: what a user computes to join with a hashed column."""
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def mask_text(text: str) -> str:
    """Every character but the last MASK_KEEP as `*`; a value no longer than that is all `*`."""
    if len(text) <= MASK_KEEP:
        return "*" * len(text)
    return "*" * (len(text) - MASK_KEEP) + text[-MASK_KEEP:]


@dataclass(frozen=True)
class ColumnPolicy:
    """The three glob lists and the hash key (never printed: `repr` leaves it out)."""

    exclude: tuple[tuple[str, str, str], ...] = ()
    hash: tuple[tuple[str, str, str], ...] = ()
    mask: tuple[tuple[str, str, str], ...] = ()
    key: bytes | None = field(default=None, repr=False)

    @property
    def empty(self) -> bool:
        return not (self.exclude or self.hash or self.mask)

    def rule(self, table: TableRef, column: str) -> str:
        """What the policy does to one column; exclude wins over hash, hash over mask."""
        for kind, patterns in ((EXCLUDE, self.exclude), (HASH, self.hash), (MASK, self.mask)):
            if any(_matches(p, table, column) for p in patterns):
                return kind
        return CLEAR

    def rules(self, shape: TableShape) -> Rules:
        """Every column of the shape with its rule (a table's policy, as `_state/` records it)."""
        return {c.name: self.rule(shape.table, c.name) for c in shape.columns}

    def touches(self, shape: TableShape) -> bool:
        return not self.empty and any(r != CLEAR for r in self.rules(shape).values())

    def keys_policed(self, shape: TableShape) -> bool:
        """Whether the lakehouse keys the table on a hash: its rows cannot be looked up in the source by those keys."""
        return not self.empty and any(self.rule(shape.table, k) != CLEAR for k in shape.primary_key)

    def table_mark(self, shape: TableShape) -> str:
        """What a table read under this policy was read under (its rules, the key's fingerprint), as text: work read
        under another mark (a snapshot's chunks) is not mixed with this one's. Empty when the policy leaves it."""
        if not self.touches(shape):
            return ""
        return json.dumps({"rules": self.rules(shape), "key": self.fingerprint()}, sort_keys=True)

    def fingerprint(self) -> str | None:
        """A non-reversible mark of the hash key: tells a changed key without keeping it."""
        if self.key is None:
            return None
        return hmac.new(self.key, b"cdc-lakehouse hash key fingerprint", hashlib.sha256).hexdigest()[:16]

    # -- shapes ---------------------------------------------------------------------------------------------------
    def lake_shape(self, shape: TableShape) -> TableShape:
        return lake_shape(shape, self.rules(shape)) if not self.empty else shape

    def schema_change(self, change: SchemaChange) -> SchemaChange:
        """A DDL's table change as the lakehouse sees it: shapes policed, an excluded column's rename and default
        left out, a hashed or masked column's default hashed or masked."""
        if self.empty:
            return change
        shape = change.after or change.before
        rules = self.rules(shape) if shape is not None else {}
        defaults: dict[str, Default] = {}
        for name, default in change.defaults.items():
            rule = rules.get(name, CLEAR)
            if rule == EXCLUDE:
                continue
            if rule != CLEAR and default.kind == "value" and default.text is not None and shape is not None:
                col = next(c for c in shape.columns if c.name == name)
                default = Default("value", self.police_text(rule, col, default.text))
            elif rule != CLEAR and default.kind == "now":
                default = Default("unknown")
            defaults[name] = default
        return SchemaChange(
            change.table,
            change.action,
            self.lake_shape(change.before) if change.before is not None else None,
            self.lake_shape(change.after) if change.after is not None else None,
            renames={new: old for new, old in change.renames.items() if rules.get(new, CLEAR) != EXCLUDE},
            defaults=defaults,
            renamed_from=change.renamed_from,
            renamed_to=change.renamed_to,
        )

    def renamed_out(self, change: SchemaChange) -> tuple[str, str] | None:
        """(cause, fix) when a DDL renames a column (or its table) so that another rule covers the same data: the
        policy is set by name, so the renamed column would be captured clearer than before (or its earlier clear
        values would sit under a policed name). Capture quarantines the table rather than guess (lake/quarantine)."""
        if self.empty or change.after is None:
            return None
        table, words = change.after.table, {EXCLUDE: "excluded", HASH: "hashed", MASK: "masked", CLEAR: "clear"}
        if change.renamed_from is not None:
            moved = {name: (change.renamed_from, name) for name in change.after.column_names}
        else:
            moved = {new: (table, old) for new, old in change.renames.items() if new != old}
        for new, (old_table, old) in sorted(moved.items()):
            before, after = self.rule(old_table, old), self.rule(table, new)
            if before == after:
                continue
            cause = (
                f"column {old_table}.{old} ({words[before]}) was renamed to {table}.{new}, which the column policy "
                f"leaves {words[after]}"
            )
            setting = VARIABLES.get(before)
            put = f"add {table}.{new} to {setting}" if setting else f"take {table}.{new} out of {VARIABLES[after]}"
            return cause, f"{put} (so the same data keeps the same policy), then run `cdc-lakehouse snapshot {table}`"
        return None

    # -- values ---------------------------------------------------------------------------------------------------
    def police_text(self, rule: str, col: ColumnSpec, text: str) -> str:
        """One canonical text as a policy leaves it (rule hash or mask)."""
        texts = canonical_texts(col, [text])
        return self._police_texts(rule, texts)[0] or ""

    def _police_texts(self, rule: str, texts: list[str | None]) -> list[str | None]:
        if rule == HASH:
            key = self.require_key()
            return [None if t is None else hash_text(key, t) for t in texts]
        return [None if t is None else mask_text(t) for t in texts]

    def require_key(self) -> bytes:
        if self.key is None:
            raise missing_key()
        return self.key

    def image_policer(self, shape: TableShape) -> Callable[[list], list] | None:
        """A function from a list of row images (canonical texts, None for no image) of this shape to the policed
        images; None when the policy leaves the table as it is. Column by column, so a non-text column's texts
        are made canonical in one Arrow call per event."""
        if self.empty:
            return None
        rules = self.rules(shape)
        if all(r == CLEAR for r in rules.values()):
            return None
        keep = [i for i, c in enumerate(shape.columns) if rules[c.name] != EXCLUDE]
        changed = [(i, c, rules[c.name]) for i, c in enumerate(shape.columns) if rules[c.name] in (HASH, MASK)]

        def police(images: list) -> list:
            present = [n for n, image in enumerate(images) if image is not None]
            if not present:
                return list(images)
            rows = [list(images[n]) for n in present]
            for i, col, rule in changed:
                texts = canonical_texts(col, [row[i] for row in rows])
                for row, value in zip(rows, self._police_texts(rule, texts), strict=True):
                    row[i] = value
            result = list(images)
            for n, row in zip(present, rows, strict=True):
                result[n] = [row[i] for i in keep]
            return result

        return police

    def lake_rows(self, shape: TableShape, rows: pa.Table) -> pa.Table:
        """Source rows in the Delta types of `shape` (snapshots, verify, the checks) as the lakehouse holds them."""
        if self.empty:
            return rows
        rules = self.rules(shape)
        if all(r == CLEAR for r in rules.values()):
            return rows
        arrays, fields = [], []
        for col in shape.columns:
            rule = rules[col.name]
            if rule == EXCLUDE or col.name not in rows.column_names:
                continue
            values = rows.column(col.name)
            if rule != CLEAR:
                texts = encode_column(col, values)
                values = pa.array(self._police_texts(rule, texts), pa.string())
            arrays.append(values)
            fields.append(pa.field(col.name, values.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


    def settle_clear(self, added: Mapping[str, str], rows: pa.Table) -> tuple[pa.Table, int]:
        """Lakehouse rows whose columns got a policy after they were captured (`added`: column -> hash or mask), with
        the clear values left from before it (until `REWRITE_COMMAND` rewrites them) policed as the source's now are;
        and how many there were. So a comparison tells those, which the user was told of, from a real difference."""
        found = 0
        for name, rule in added.items():
            if rule not in (HASH, MASK) or name not in rows.column_names:
                continue
            texts, count = self.settle_texts(rule, [None if v is None else str(v) for v in rows.column(name).to_pylist()])
            if count:
                found += count
                rows = rows.set_column(rows.column_names.index(name), name, pa.array(texts, pa.string()))
        return rows, found

    def settle_texts(self, rule: str, texts: list[str | None]) -> tuple[list[str | None], int]:
        """Texts of a column a policy (hash or mask) was added to after capture, each clear one left from before it
        policed (a hash's leftovers are the texts not shaped like a hash; masking a masked text changes nothing), and
        how many were clear: the one home of telling such leftovers, for the comparisons and for the rewrite."""
        if rule == HASH:
            clear = [t is not None and not HASH_FORM.fullmatch(t) for t in texts]
        else:
            clear = [t is not None and mask_text(t) != t for t in texts]
        if not any(clear):
            return texts, 0
        policed = self._police_texts(rule, [t if c else None for t, c in zip(texts, clear, strict=True)])
        return [p if c else t for t, p, c in zip(texts, policed, clear, strict=True)], sum(clear)


def clear_left_sentence(table: TableRef, added: Mapping[str, str], found: int) -> str:
    """What a comparison says of a table whose current state still holds clear values of columns policed since."""
    words = {HASH: "hashed", MASK: "masked"}
    columns = ", ".join(f"{name} ({words[rule]})" for name, rule in sorted(added.items()) if rule in words)
    return (
        f"{table}: its current state still holds {found} clear values of {columns} from before the column policy "
        f"covered them: run `{REWRITE_COMMAND.format(table=table)}` to rewrite them"
    )


def lake_shape(shape: TableShape, rules: Mapping[str, str]) -> TableShape:
    """The shape the lakehouse keeps under `rules`: excluded columns gone, hashed and masked ones text. A key
    column may be hashed (the table keys on the hash), never excluded or masked (distinct keys would collide)."""
    for name in shape.primary_key:
        if rules.get(name, CLEAR) in (EXCLUDE, MASK):
            kind = "excluded" if rules[name] == EXCLUDE else "masked"
            raise CdcUserError(
                f"Column {name} of {shape.table} is part of its primary key and cannot be {kind}: hash it instead "
                f"({VARIABLES[HASH]}), or take it out of {VARIABLES[rules[name]]}."
            )
    columns = []
    for col in shape.columns:
        rule = rules.get(col.name, CLEAR)
        if rule == EXCLUDE:
            continue
        # a hashed or masked column is text (docs/lakehouse.md's type table)
        columns.append(ColumnSpec(col.name, "varchar", charset="utf8mb4") if rule in (HASH, MASK) else col)
    return TableShape(shape.table, tuple(columns), shape.primary_key)


def canonical_texts(col: ColumnSpec, texts: list[str | None]) -> list[str | None]:
    """Texts made canonical the way a source read's are (`encode_column` of the Delta value): a text column's are
    already; another type's go through its Delta value, so capture and a SELECT give the hash the same text."""
    if pa.types.is_string(arrow_type(col)):
        return texts
    return encode_column(col, decode_column(col, pa.array(texts, pa.string())))


def missing_key() -> CdcUserError:
    return CdcUserError(
        f"{VARIABLES[HASH]} is set but {KEY_VARIABLE} is not: set {KEY_VARIABLE} in the environment to a secret of "
        f"at least {MIN_KEY_CHARACTERS} characters (the same one every run, or hashes stop joining), or unset "
        f"{VARIABLES[HASH]}."
    )


def policy_from_env(env: Mapping[str, str]) -> ColumnPolicy:
    """The policy an environment's texts set (core.settings.source_from_env: a part of the source's settings); a bad
    glob, or hashing without a key, ends in one sentence."""
    lists = {}
    for kind, variable in VARIABLES.items():
        globs = [g.strip() for g in (env.get(variable) or "").split(",") if g.strip()]
        lists[kind] = tuple(parse_column_glob(g, variable) for g in globs)
    text = env.get(KEY_VARIABLE) or ""
    if lists[HASH] and not text:
        raise missing_key()
    if text and len(text) < MIN_KEY_CHARACTERS:
        raise CdcUserError(
            f"{KEY_VARIABLE} is shorter than {MIN_KEY_CHARACTERS} characters: set it to a longer secret (e.g. the "
            "output of `openssl rand -hex 32`)."
        )
    return ColumnPolicy(lists[EXCLUDE], lists[HASH], lists[MASK], text.encode("utf-8") if text else None)


# -- policy changes --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyChange:
    """How a table's recorded rules compare with today's, over the columns both know."""

    added: dict[str, str]  # column -> the rule it gets now (it was clear)
    removed: dict[str, tuple[str, str]]  # column -> (rule recorded, rule now): a policy taken away or changed

    @property
    def none(self) -> bool:
        return not self.added and not self.removed


def compare_rules(recorded: Mapping[str, str], now: Mapping[str, str]) -> PolicyChange:
    added, removed = {}, {}
    for name, rule in now.items():
        before = recorded.get(name)
        if before is None or before == rule:
            continue
        if before == CLEAR:
            added[name] = rule
        else:
            removed[name] = (before, rule)
    return PolicyChange(added, removed)


def added_sentence(table: TableRef, added: Mapping[str, str]) -> str:
    """The one sentence a policy added to captured columns gets."""
    words = {EXCLUDE: "excluded", HASH: "hashed", MASK: "masked"}
    columns = ", ".join(f"{name} ({words[rule]})" for name, rule in sorted(added.items()))
    return (
        f"{table}: a column policy now covers {columns}, but its earlier raw batches, change log, current state and "
        f"history still hold the clear values: run `{REWRITE_COMMAND.format(table=table)}` to rewrite them."
    )


def removed_sentence(table: TableRef, removed: Mapping[str, tuple[str, str]]) -> str:
    """The one sentence that refuses a policy taken away from captured columns."""
    columns = ", ".join(f"{name} (was {before}, now {now})" for name, (before, now) in sorted(removed.items()))
    return (
        f"{table} was captured with a column policy the settings no longer give ({columns}), and capturing on would "
        f"mix clearer values into layers that hold policed ones: put the policy back, or accept the change by "
        f"taking `cdc-lakehouse snapshot {table}`, which loads the table again under today's policy."
    )


def key_changed_sentence(tables: list[str]) -> str:
    return (
        f"{KEY_VARIABLE} is not the key the hashes of {', '.join(tables)} were made with, so new hashes would not "
        f"join the old ones: set the earlier key again, or accept the new one by taking `cdc-lakehouse snapshot` "
        "of those tables."
    )


@dataclass
class PolicyPlan:
    """What a capture does about policy changes before it reads on: implicit alters of lakehouse shapes (each with
    the rules it records), rules recorded without a shape change, and the sentences to say."""

    alters: list[tuple[SchemaChange, Rules]] = field(default_factory=list)
    rerecorded: dict[str, Rules] = field(default_factory=dict)
    sentences: list[str] = field(default_factory=list)
    added: dict[str, Rules] = field(default_factory=dict)  # table -> columns a policy covers since they were captured


def plan_policy_changes(
    policy: ColumnPolicy,
    shapes: Mapping[TableRef, TableShape],
    recorded: Mapping[str, Rules],
    recorded_fingerprint: str | None,
    record_found: bool,
    accepted: set[str],
) -> PolicyPlan:
    """Today's policy against the one each known table (its source shape at the checkpoint) was captured under.

    A policy added goes on, with the sentence that earlier layers hold clear values; a policy taken away or changed,
    or another hash key, is refused (one sentence) unless a snapshot of the table accepted it: clearer values never
    mix silently into layers that hold policed ones."""
    plan = PolicyPlan()
    key_changed: list[str] = []
    fingerprint = policy.fingerprint()
    for table, shape in sorted(shapes.items()):
        name = str(table)
        before = recorded.get(name)
        if before is None:
            if record_found:
                continue  # first seen by this capture: recorded as it goes
            before = dict.fromkeys(shape.column_names, CLEAR)  # captured before column policies existed
        now = policy.rules(shape)
        change = compare_rules(before, now)
        hashed_still = [c for c, rule in now.items() if rule == HASH and before.get(c) == HASH]
        if hashed_still and recorded_fingerprint and fingerprint != recorded_fingerprint and name not in accepted:
            key_changed.append(name)
        if change.removed and name not in accepted:
            raise CdcUserError(removed_sentence(table, change.removed))
        if change.none and name not in accepted:
            continue
        old_shape = lake_shape(shape, {c: before.get(c, CLEAR) for c in shape.column_names})
        new_shape = policy.lake_shape(shape)
        if not old_shape.same_layout(new_shape):
            plan.alters.append((SchemaChange(table, ALTER, old_shape, new_shape, by_policy=True), now))
        elif before != now:
            plan.rerecorded[name] = now
        if change.added:
            plan.sentences.append(added_sentence(table, change.added))
            plan.added[name] = change.added
    if key_changed:
        raise CdcUserError(key_changed_sentence(key_changed))
    return plan
