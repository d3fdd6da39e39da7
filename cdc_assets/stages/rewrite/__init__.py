"""Rewriting one table's rows in every layer that holds them, old versions and raw batches included: `layers` (the
one rewrite, given what to do to the rows) and `forget` (a person's keys removed: `cdc-lakehouse forget`)."""
