"""The project's own local brokers for the demo, `make dev` and the tests: a dedicated RabbitMQ server and a local
Kinesis-compatible endpoint."""
