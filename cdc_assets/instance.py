"""The Dagster instance the CLI and `make dev` share: DAGSTER_HOME and its dagster.yaml.

The run queue lets one capture and one apply run go at a time (tag `cdc/stage`): the lakehouse locks
would keep them apart anyway, but queued runs wait without holding a run slot or timing out on a lock.
"""

import os
from pathlib import Path

DEFAULT_DAGSTER_HOME = Path(".local") / "dagster_home"
LEGACY_YAML = "telemetry:\n  enabled: false\n"  # what earlier versions wrote
MANAGED_HEADER = "# Written by cdc-lakehouse; delete this line to keep your own edits to this file.\n"
INSTANCE_YAML = (
    MANAGED_HEADER
    + """telemetry:
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
"""
)


def ensure_dagster_home() -> Path:
    """DAGSTER_HOME (default .local/dagster_home) with our dagster.yaml, unless the user wrote their own."""
    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME).resolve()
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    existing = config.read_text() if config.exists() else None
    ours = existing is None or existing.startswith(MANAGED_HEADER) or existing == LEGACY_YAML
    if ours and existing != INSTANCE_YAML:
        config.write_text(INSTANCE_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


if __name__ == "__main__":
    print(ensure_dagster_home())
