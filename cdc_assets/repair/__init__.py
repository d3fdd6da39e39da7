"""`cdc-lakehouse repair`: the rows of a current-state table that differ from its source written again from the
source as a raw batch of `repair` changes, which the stages then take in as any other (`run`). It writes to the
lakehouse, so it is not a verification; it uses verification's comparisons to find the rows."""
