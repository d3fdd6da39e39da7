"""What the Dagster definitions run on, and no definition itself: the lakehouse's Dagster home and its batched event
log, the run queue's view, and the processes a run starts (a sync's forked child, the checks' child)."""
