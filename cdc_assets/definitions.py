"""The Dagster code location (workspace.yaml, `make dev`): the pipeline's definitions, assembled in `defs/`."""

from __future__ import annotations

from cdc_assets.defs.code_location import build_definitions
from cdc_assets.runtime.instance import enable_event_batches

# Runs launched from the UI or the daemon load this module: their partition-range events go in batches too.
enable_event_batches()
defs = build_definitions()  # with the settings of this process's environment, read once as the code location loads
