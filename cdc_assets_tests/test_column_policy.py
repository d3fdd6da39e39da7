"""Column policies as pure functions (core/column_policy): globs, the keyed hash, the mask, the lakehouse's shape,
images and source rows through one policy, and what a policy change means. No server needed."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

import pyarrow as pa
import pytest

from cdc_assets.core.column_policy import (
    CLEAR,
    EXCLUDE,
    HASH,
    MASK,
    compare_rules,
    hash_text,
    mask_text,
    plan_policy_changes,
    policy_from_env,
)
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.mysql_types import ColumnSpec, arrow_schema
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape

KEY = "a-test-key-of-enough-length"
T = TableRef("shop", "customers")
SHAPE = TableShape(
    T,
    (
        ColumnSpec("email", "varchar", charset="utf8mb4"),
        ColumnSpec("age", "int"),
        ColumnSpec("card", "varchar", charset="utf8mb4"),
        ColumnSpec("notes", "text", charset="utf8mb4"),
        ColumnSpec("born", "datetime"),
    ),
    ("email",),
)
ENV = {
    "CDC_EXCLUDE_COLUMNS": "shop.customers.notes",
    "CDC_HASH_COLUMNS": "shop.*.email, shop.customers.age,shop.customers.born",
    "CDC_MASK_COLUMNS": "shop.customers.card",
    "CDC_HASH_KEY": KEY,
}


def test_rules_hash_and_mask() -> None:
    policy = policy_from_env(ENV)
    assert policy.rules(SHAPE) == {"email": HASH, "age": HASH, "card": MASK, "notes": EXCLUDE, "born": HASH}
    assert policy.rule(TableRef("shop", "orders"), "email") == HASH
    assert policy.rule(TableRef("other", "orders"), "email") == CLEAR
    expected = hmac.new(KEY.encode(), b"ann@example.org", hashlib.sha256).hexdigest()
    assert hash_text(KEY.encode(), "ann@example.org") == expected and len(expected) == 64
    assert mask_text("4111222233334444") == "************4444"
    assert mask_text("abcd") == "****" and mask_text("") == ""
    assert "a-test-key" not in repr(policy)  # the key is never printed


def test_shape_images_and_source_rows_agree() -> None:
    policy = policy_from_env(ENV)
    lake = policy.lake_shape(SHAPE)
    assert lake.column_names == ["email", "age", "card", "born"] and lake.primary_key == ("email",)
    assert all(pa.types.is_string(f.type) for f in arrow_schema(list(lake.columns)))
    police = policy.image_policer(SHAPE)
    assert police is not None
    images = police([["ann@example.org", "42", "4111222233334444", "secret", "2024-05-01 12:30:00.000000"], None])
    key = KEY.encode()
    assert images[1] is None
    assert images[0] == [
        hash_text(key, "ann@example.org"), hash_text(key, "42"), "************4444",
        hash_text(key, "2024-05-01 12:30:00.000000"),
    ]  # fmt: skip
    # a source read's typed rows through the same policy give the same values
    rows = pa.table(
        {
            "email": ["ann@example.org"], "age": pa.array([42], pa.int32()), "card": ["4111222233334444"],
            "notes": ["secret"], "born": pa.array([dt.datetime(2024, 5, 1, 12, 30)], pa.timestamp("us")),
        }
    )  # fmt: skip
    assert list(policy.lake_rows(SHAPE, rows).to_pylist()[0].values()) == images[0]


def test_bad_settings_are_one_sentence() -> None:
    with pytest.raises(CdcUserError, match=r"CDC_HASH_COLUMNS is set but CDC_HASH_KEY is not: set CDC_HASH_KEY"):
        policy_from_env({"CDC_HASH_COLUMNS": "shop.t.c"})
    with pytest.raises(CdcUserError, match=r"'shop.email' in CDC_MASK_COLUMNS is not a schema.table.column glob"):
        policy_from_env({"CDC_MASK_COLUMNS": "shop.email"})
    with pytest.raises(CdcUserError, match="part of its primary key and cannot be excluded"):
        policy_from_env({"CDC_EXCLUDE_COLUMNS": "shop.customers.email"}).lake_shape(SHAPE)
    assert policy_from_env({"CDC_HASH_COLUMNS": "`a.b`.t.`c.d`", "CDC_HASH_KEY": KEY}).hash == (("a.b", "t", "c.d"),)


def test_policy_changes() -> None:
    before = {"email": CLEAR, "age": CLEAR, "card": MASK}
    change = compare_rules(before, {"email": HASH, "age": CLEAR, "card": CLEAR, "new": HASH})
    assert change.added == {"email": HASH} and change.removed == {"card": (MASK, CLEAR)}
    policy = policy_from_env({"CDC_HASH_COLUMNS": "shop.customers.email,shop.customers.age", "CDC_HASH_KEY": KEY})
    clear = {T: SHAPE}
    recorded = {str(T): dict.fromkeys(SHAPE.column_names, CLEAR)}
    plan = plan_policy_changes(policy, clear, recorded, None, True, set())
    assert len(plan.alters) == 1 and plan.alters[0][0].after.columns[1].type == "varchar"  # the hashed INT is text
    assert "cdc-lakehouse forget shop.customers --rewrite-policies" in plan.sentences[0]
    hashed = {str(T): policy.rules(SHAPE)}
    with pytest.raises(CdcUserError, match="put the policy back, or accept the change by taking `cdc-lakehouse snapshot"):
        plan_policy_changes(policy_from_env({}), clear, hashed, policy.fingerprint(), True, set())
    accepted = plan_policy_changes(policy_from_env({}), clear, hashed, policy.fingerprint(), True, {str(T)})
    assert len(accepted.alters) == 1 and not accepted.sentences
    other_key = policy_from_env({"CDC_HASH_COLUMNS": "shop.customers.email,shop.customers.age", "CDC_HASH_KEY": KEY + "x"})
    with pytest.raises(CdcUserError, match="is not the key the hashes of shop.customers were made with"):
        plan_policy_changes(other_key, clear, hashed, policy.fingerprint(), True, set())


def test_a_rename_that_changes_a_columns_rule_is_named() -> None:
    from cdc_assets.core.shapes import SchemaChange

    policy = policy_from_env({"CDC_HASH_COLUMNS": "shop.customers.email,shop.*.card", "CDC_HASH_KEY": KEY})
    before = TableShape(T, (ColumnSpec("id", "int"), ColumnSpec("email", "varchar")), ("id",))
    renamed = TableShape(T, (ColumnSpec("id", "int"), ColumnSpec("mail", "varchar")), ("id",))
    cause, fix = policy.renamed_out(SchemaChange(T, "alter", before, renamed, renames={"mail": "email"})) or ("", "")
    assert cause == "column shop.customers.email (hashed) was renamed to shop.customers.mail, which the column policy leaves clear"
    assert fix.startswith("add shop.customers.mail to CDC_HASH_COLUMNS") and "`cdc-lakehouse snapshot shop.customers`" in fix
    # into a policy: its earlier clear values would sit under a hashed name
    back = SchemaChange(T, "alter", renamed, before, renames={"email": "mail"})
    assert "take shop.customers.email out of CDC_HASH_COLUMNS" in (policy.renamed_out(back) or ("", ""))[1]
    # a rename the globs follow, another column's rename, and a table renamed within the same glob: nothing to say
    card = TableShape(T, (ColumnSpec("id", "int"), ColumnSpec("card", "varchar")), ("id",))
    moved = TableShape(TableRef("shop", "clients"), card.columns, ("id",))
    assert policy.renamed_out(SchemaChange(moved.table, "create", None, moved, renamed_from=T)) is None
    assert policy.renamed_out(SchemaChange(T, "alter", before, before, renames={"id": "id"})) is None
    # a table renamed out of a column's glob
    out = TableShape(TableRef("shop", "people"), before.columns, ("id",))
    assert "shop.people.email" in (policy.renamed_out(SchemaChange(out.table, "create", None, out, renamed_from=T)) or ("", ""))[0]
