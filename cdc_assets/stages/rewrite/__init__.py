"""Rewriting one table's rows in every layer that holds them, old versions and raw batches included: `layers` (the
one rewrite, given what to do to the rows), `run` (the skeleton of a rewrite run: locks, the table brought up to date,
a pending/done record), `forget` (a person's keys removed: `cdc-lakehouse forget`), `policies` (column policies added
since capture applied to earlier layers) and `person` (the `forget` job's side of a forget)."""
