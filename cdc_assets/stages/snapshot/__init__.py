"""The snapshot stage: tables loaded whole from the source at a binlog point, and the record of what each load
covered. `run` plans, locks and commits; `records` and `loaded_tables` keep what was loaded; `on_spark` is the
Spark half's driver side and `spark_tasks` the functions its tasks run (reading the source in key ranges)."""
