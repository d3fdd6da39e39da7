"""The change-log stage (`changes/<schema>/<table>`): raw batches split into per-table change logs. `run` plans,
locks and commits; `plan` and `log` say what goes into each log; `keys` keys changes on Arrow; `rows` holds the
change logs' rows as plain Arrow (their columns, typing, conforming to a log's schema); `on_spark` is the Spark
half's driver side and `spark_tasks` the functions its tasks run."""
