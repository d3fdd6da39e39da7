"""What the `cdc-lakehouse` commands do, above the definitions: runs of the code location's jobs on the lakehouse's
Dagster instance, the read-only views (verify, status), and the demo. `cli` parses and prints; the work is here."""
