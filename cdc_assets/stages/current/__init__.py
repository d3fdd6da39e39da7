"""The current-state stage (`current/<schema>/<table>`) and the history it keeps: each change log's pending
changes applied in `_cdc_seq` order. `run` plans, locks and saves progress; `steps` plans a table's spans on
either engine; `rules` holds every rule both engines apply (the newest change per key, the seq guard, keyless
copies, what a TRUNCATE leaves); `apply` is the Arrow half; `on_spark` the Spark half's driver side and
`spark_tasks` the functions its tasks run; `history` moves SCD2 history forward in the same run."""
