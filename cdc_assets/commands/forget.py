"""`cdc-lakehouse forget TABLE --key K … | --keys-file FILE`: a person's rows removed from every layer of the
lakehouse and from storage (`stages/rewrite/forget.py` does the work and keeps the record); `forget TABLE
--rewrite-policies`: column policies added since capture applied to every earlier layer (`stages/rewrite/policies.py`).

It refuses while the source still holds one of the keys: forget follows a DELETE at the source. Were the row still
there, `verify` and the checks would report it missing, and the next change of it, a snapshot or a repair would
bring it back; deleting it at the source first is what makes the forgetting last. The sinks cannot unsend what they
sent: the command names those that had published a change of the keys.
"""

from __future__ import annotations

import time
from pathlib import Path

from cdc_assets.commands.runs import RunOutcome, run_job
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.settings import Settings
from cdc_assets.defs.keys import FORGET_JOB, FORGET_OP
from cdc_assets.defs.resources import initialized_resources
from cdc_assets.stages.follow import refuse_beside_continuous
from cdc_assets.stages.rewrite import person
from cdc_assets.stages.rewrite.forget import ForgetRecord, canonical_keys, forget_records, key_hash, parse_key
from cdc_assets.stages.rewrite.policies import PolicyRewriteRecord, rewrite_records
from cdc_assets.stages.rewrite.run import DONE, table_shape


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


def run_forget(
    settings: Settings, table_text: str, keys: list[str] | None, keys_file: str | None
) -> tuple[ForgetRecord | None, RunOutcome]:
    """`cdc-lakehouse forget`: the keys read and checked here (a wrong one gets its sentence before any run), then
    forgotten in every layer by a run of the `forget` job, which gets them through a private file (`person.keys_file`),
    never in its config. The run's record (None when the run failed)."""
    lakehouse = initialized_resources(settings).lakehouse.get()
    table = TableRef.parse(table_text)
    shape = table_shape(lakehouse, table)
    texts = given_keys(keys, keys_file)
    policy = settings.source.column_policy
    canonical = canonical_keys(shape, [parse_key(text, len(shape.primary_key)) for text in texts], policy)
    refuse_beside_continuous(lakehouse)
    with person.keys_file(canonical) as path:
        outcome = run_job(settings, FORGET_JOB, op_config={FORGET_OP: {"config": {"table": str(table), "keys_file": path}}})
    given = sorted({key_hash(table, key) for key in canonical})
    done = [r for r in forget_records(lakehouse, table) if r.given == given and r.status == DONE]
    return (done[-1] if done and outcome.success else None), outcome


def run_rewrite_policies(settings: Settings, table_text: str) -> tuple[PolicyRewriteRecord | None, RunOutcome]:
    """`cdc-lakehouse forget TABLE --rewrite-policies`: the column policies added since capture applied to every
    earlier layer by a run of the `forget` job; its record (None: no policy was added to a captured column of the
    table, or the run failed)."""
    lakehouse = initialized_resources(settings).lakehouse.get()
    table = TableRef.parse(table_text)
    table_shape(lakehouse, table)  # one sentence for a table the lakehouse does not know
    refuse_beside_continuous(lakehouse)
    began = time.time()
    outcome = run_job(settings, FORGET_JOB, op_config={FORGET_OP: {"config": {"table": str(table), "rewrite_policies": True}}})
    done = [r for r in rewrite_records(lakehouse, table) if r.status == DONE and (r.finished_at or 0) >= began]
    return (done[-1] if done and outcome.success else None), outcome
