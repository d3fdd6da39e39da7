"""The current-state stage (`current/<schema>/<table>`): each change log's pending
changes applied in `_cdc_seq` order. `run` plans, locks and saves progress; `steps` plans a table's spans on
either engine; `rules` holds every rule both engines apply (the newest change per key, the seq guard, keyless
copies, what a TRUNCATE leaves); `apply` is the Arrow half; `on_spark` the Spark half's driver side and
`spark_tasks` the functions its tasks run; `rows` the current-state tables' rows as plain Arrow. The history
it keeps in the same run is `stages/history/`."""
