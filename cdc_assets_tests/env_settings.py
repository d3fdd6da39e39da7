"""The settings a test's environment gives (its monkeypatched CDC_* variables), built as the CLI builds them from
the environment when no flag is given: the commands and stage functions the tests call take them as a value."""

from __future__ import annotations

import os

from cdc_assets.core.settings import Settings, SourceSettings
from cdc_assets.source.server import resolved_source


def settings_now() -> Settings:
    """The settings of the environment as it is now."""
    return Settings.from_env(os.environ)


def source_now() -> SourceSettings:
    """The source's settings of the environment as it is now, its URL looked up (the demo server's when unset)."""
    return resolved_source(settings_now().source)
