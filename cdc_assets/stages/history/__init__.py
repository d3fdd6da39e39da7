"""The history layer (`history/<schema>/<table>`): each selected table's SCD2 history. `rows` holds the versions'
shape and how a run of change-log rows opens and closes them (plain functions, no I/O); `run` moves a history
forward in the apply run that updates its current state, and seeds it from a snapshot; `as_of` reads a table as it
was at a point, from its history or by replaying its change log through `rows`. Arrow only, no Spark half."""
