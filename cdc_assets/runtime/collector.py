"""Python's cyclic garbage collector told which objects live as long as the process: what it has imported.

A sync's processes hold hundreds of thousands of objects from their imports (Dagster, pyarrow, deltalake, ours), and
each full collection walks every one of them again, while every other thread waits on the GIL (issue 45: `sync -v`
counts the collections and their seconds, core.work_tally). Frozen objects are left out of every collection, and a
forked child's collections no longer touch, and so copy, the pages it shares with its parent.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_imported() -> None:
    """Leave every object alive now out of the cyclic collections to come, once per process (a fork inherits it):
    called once a process has imported what it runs with, before its per-table work. Frozen objects are never freed,
    as an import never is; so is any cyclic garbage not collected yet (a full collection first would cost a process
    about 0.15 s, a small sync's fixed cost). Once only, so a process that runs many syncs (a test session) freezes
    what was there at its first, not each run's garbage."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
