"""The project's own local MariaDB source: server scripts, sample schema and workload."""

from cdc_assets.local_source.server import LocalServer, running, start, stop
from cdc_assets.local_source.workload import Workload, load_sample_schema

__all__ = ["LocalServer", "Workload", "load_sample_schema", "running", "start", "stop"]
