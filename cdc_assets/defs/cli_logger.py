"""A Dagster logger for the CLI's long runs (`snapshot`, `sync --verbose`): it prints the messages the pipeline
logs (`context.log.info`: chunks read, batches done) as plain lines, and none of Dagster's own events, so a
failure ends with the CLI's one sentence, not the step's stack trace, which stays in the run's event log."""

from __future__ import annotations

import logging
import sys

from dagster import InitLoggerContext, logger


class _PipelineMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Dagster puts the event a record stands for (step started, failed, …) under `dagster_meta`; a message
        # of the pipeline's own has none
        meta = getattr(record, "dagster_meta", None) or {}
        return meta.get("dagster_event") is None and record.levelno < logging.ERROR


@logger(description="The pipeline's own progress messages on stdout, without Dagster's events.")
def progress_logger(init_context: InitLoggerContext) -> logging.Logger:
    printed = logging.Logger("cdc-lakehouse", level=logging.INFO)
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(_PipelineMessages())
    handler.setFormatter(_Message())
    printed.addHandler(handler)
    return printed


class _Message(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        meta = getattr(record, "dagster_meta", None) or {}
        return str(meta.get("orig_message", record.getMessage()))
