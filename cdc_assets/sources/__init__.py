"""The project's sources, one folder and `defs.yaml` per `MySQLSource` component instance (cdc_assets/definitions.py
loads them all). Add a folder here for each database: docs/dagster-project.md."""
