"""Names of the pipeline's stages: the locks that keep two runs of a stage apart, and the progress files."""

CAPTURE_LOCK = "capture"
CHANGES_STAGE = "changes"
CHANGES_LOCK = "changes"
CURRENT_STAGE = "current"
CURRENT_LOCK = "current"
