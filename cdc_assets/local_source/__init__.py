"""The project's own local MariaDB source: server scripts, sample schema and workload."""

from cdc_assets.local_source.server import LocalServer, running, start, stop
from cdc_assets.local_source.workload import Workload, load_sample_schema

# The sample schema's tables whose SCD2 history the demo and `make dev` keep (CDC_HISTORY_TABLES, unless set): what
# docs/history.md's reading examples read after `make demo`.
DEMO_HISTORY_TABLES = "shop.orders"

__all__ = ["DEMO_HISTORY_TABLES", "LocalServer", "Workload", "load_sample_schema", "running", "start", "stop"]
