"""The Dagster Components cdc-lakehouse offers a Dagster project (`dg list components` shows them)."""

from cdc_assets.components.mysql_source import MySQLSource as MySQLSource
