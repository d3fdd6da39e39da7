"""The Dagster instance the CLI and `make dev` share: DAGSTER_HOME and its dagster.yaml.

The run queue lets one capture, one apply and one sync run go at a time (tag `cdc/stage`; a `sync` run launched
from the UI queues too), and one publish run per sink (tag `cdc/sink`): the lakehouse locks would keep them apart
anyway, but queued runs wait without holding a run slot or timing out on a lock.
"""

import json
import os
from pathlib import Path

DEFAULT_DAGSTER_HOME = Path(".local") / "dagster_home"
LEGACY_YAML = "telemetry:\n  enabled: false\n"  # what earlier versions wrote
EVENT_BATCH_SIZE = 1000  # events Dagster gathers before it hands them to store_event_batch (cdc_assets.defs.event_log)
MANAGED_HEADER = "# Written by cdc-lakehouse; delete this line to keep your own edits to this file.\n"


def instance_yaml(home: Path) -> str:
    """Our dagster.yaml: the run queue's limits (looked at every second, not every five: queued runs start
    sooner), and the event log that writes batches of events at once (cdc_assets.defs.event_log), over the same
    files as Dagster's default SQLite storage."""
    return (
        MANAGED_HEADER
        + f"""telemetry:
  enabled: false
concurrency:
  runs:
    max_concurrent_runs: 4
    tag_concurrency_limits:
      - key: cdc/stage
        value: capture
        limit: 1
      - key: cdc/stage
        value: apply
        limit: 1
      - key: cdc/stage
        value: sync
        limit: 1
      - key: cdc/sink
        value:
          applyLimitPerUniqueValue: true
        limit: 1
run_queue:
  dequeue_interval_seconds: 1
  dequeue_use_threads: true
event_log_storage:
  module: cdc_assets.defs.event_log
  class: BatchingSqliteEventLogStorage
  config:
    base_dir: {json.dumps(str(home / "history" / "runs"))}
"""
    )


def enable_event_batches() -> None:
    """Dagster gathers the events of a partition range into batches only when this is set (in every process
    that runs or starts runs: the CLI, `make dev`, the runs it launches)."""
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", str(EVENT_BATCH_SIZE))


def ensure_dagster_home() -> Path:
    """DAGSTER_HOME (default .local/dagster_home) with our dagster.yaml, unless the user wrote their own."""
    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    existing = config.read_text() if config.exists() else None
    ours = existing is None or existing.startswith(MANAGED_HEADER) or existing == LEGACY_YAML
    wanted = instance_yaml(home)
    if ours and existing != wanted:
        config.write_text(wanted)
    os.environ["DAGSTER_HOME"] = str(home)
    enable_event_batches()
    return home


if __name__ == "__main__":
    print(ensure_dagster_home())
