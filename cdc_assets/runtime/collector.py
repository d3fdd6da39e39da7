"""Python's cyclic garbage collector told which objects live as long as the process: what it has imported.

A sync's processes hold hundreds of thousands of objects from their imports (Dagster, pyarrow, deltalake, ours), and
each full collection walks every one of them again; over 1,000 tables the collections of a sync's two processes
took about 4.8 s of its 60 (issue 45: benchmarks/README.md, "Table count"), while every other thread waited on the
GIL. Frozen objects are left out of every collection (they are never freed, which an import never is anyway), and a
forked child's collections no longer touch, and so copy, the pages it shares with its parent.
"""

from __future__ import annotations

import gc


def freeze_imported() -> None:
    """Leave every object alive now out of the cyclic collections to come: call once a process has imported what it
    runs with, before its per-table work."""
    gc.freeze()
