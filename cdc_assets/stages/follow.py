"""Who the continuous mode is to everyone else: the owner its locks name (`continuous_owner`), and whether it holds
a lakehouse now (`continuous_holder`; `sync`, the sensors and the run queue ask, and a batch run refuses beside
it). Its loop is the pipeline's driver run for ever (cdc_assets/pipeline/driver.py, `Forever`), holding the capture,
change-log and current-state locks for its whole life under this owner.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cdc_assets.core.errors import CdcUserError
from cdc_assets.lake.layout import CAPTURE_LOCK
from cdc_assets.lake.locks import LockHolder, read_holder
from cdc_assets.lake.store import Lakehouse

CONTINUOUS_OWNER = "continuous mode"  # how the locks name the follower: what `sync` and the sensors look for


def continuous_owner(run_id: str) -> str:
    """The lock owner text of a continuous run: starts with CONTINUOUS_OWNER."""
    return f"{CONTINUOUS_OWNER} (dagster run {run_id[:8]})"


def continuous_holder(lakehouse: Lakehouse) -> LockHolder | None:
    """The continuous mode holding this lakehouse now, or None."""
    holder = read_holder(lakehouse, CAPTURE_LOCK)
    return holder if holder is not None and holder.owner.startswith(CONTINUOUS_OWNER) else None


def refuse_beside_continuous(lakehouse: Lakehouse) -> None:
    """Raise one sentence when the continuous mode holds the lakehouse: a batch run would only wait for its locks."""
    holder = continuous_holder(lakehouse)
    if holder is not None:
        since = datetime.fromtimestamp(holder.acquired_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        where = f"{holder.owner} on host {holder.host}, pid {holder.pid}" if holder.pid > 0 else holder.owner
        raise CdcUserError(
            f"continuous mode is running (started {since} UTC, {where}): stop it with `cdc-lakehouse stop` or "
            "terminate its run in the UI, then retry."
        )
