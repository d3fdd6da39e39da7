"""The pipeline's one driver (`driver.drive`): capture, the change logs, current state, the checks and the sinks in
that order, with the blocking rules between them, over plain settings and free of Dagster. `sync` (its run and its
forked child), the continuous mode, the scheduled and sensor-launched asset runs, the new-tables job and a rewrite's
catch-up all run it; the Dagster layer records what its reports say."""
