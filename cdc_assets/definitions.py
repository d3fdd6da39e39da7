"""The Dagster code location (workspace.yaml, `dg dev`, `make dev`): the `MySQLSource` component instances under
cdc_assets/sources/, one folder and defs.yaml per source, loaded as Dagster loads any `dg` project's defs folder."""

from __future__ import annotations

import warnings
from pathlib import Path

import dagster as dg

from cdc_assets.runtime.instance import enable_event_batches

# Dagster's own loading of a defs folder turns its asset checks into AssetChecksDefinitions through a parameter it
# flags beta (repository_data.get_asset_checks_defs_by_key): a notice about Dagster's internals, not our code.
warnings.filterwarnings("ignore", message="Parameter `execution_type`", category=dg.BetaWarning)

# Runs launched from the UI or the daemon load this module: their partition-range events go in batches too.
enable_event_batches()


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
