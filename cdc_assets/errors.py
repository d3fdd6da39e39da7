"""Errors a user can cause and fix: they end the CLI with one sentence and exit code 2."""

from __future__ import annotations


class CdcUserError(Exception):
    """Bad configuration, credentials, server set-up or lakehouse: the message names cause and fix."""
