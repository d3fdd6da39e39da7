"""Sinks: every change of the change logs also published to message brokers (RabbitMQ, Kinesis), each sink with
its own checkpoint under `_state/sinks/`. Dagster-free: the Dagster layer (defs/sinks.py) calls `publish`."""
