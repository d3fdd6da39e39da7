"""Where things live under CDC_LAKEHOUSE (docs/lakehouse.md: Lakehouse layout), and the names of the stages that write them.

Each stage is named after the layer it writes; the lock that keeps two runs of a stage apart and the
progress files under `_state/progress/<stage>/` carry that name.
"""

RAW = "raw"  # raw binlog batches: raw/<batch>/{changes.parquet, manifest.json}
CHANGES = "changes"  # Delta change logs: changes/<schema>/<table>
CURRENT = "current"  # Delta current state: current/<schema>/<table>
HISTORY = "history"  # Delta SCD2 history of the tables CDC_HISTORY_TABLES selects: history/<schema>/<table>
STATE = "_state"  # checkpoint, registry, shapes, progress, locks
# raw batches of an earlier lakehouse, moved out of raw/ by the first capture of a new one (a lakehouse re-initialised
# after its checkpoint was purged: a chain the new one does not continue): archive/raw-<when>/<batch>/
ARCHIVE = "archive"
DELTA_LOG = "_delta_log"

CAPTURE_LOCK = "capture"
SNAPSHOT_LOCK = "snapshot"  # a snapshot's resumable state under _state/snapshots/
SNAPSHOTS_STATE = f"{STATE}/snapshots"  # one record per table: <schema>/<table>.json
# one object per chunk a Spark snapshot task has written: <schema>/<table>/<seq>/<chunk>.done
SNAPSHOT_CHUNKS_STATE = f"{STATE}/snapshot_chunks"
CHANGES_STAGE = CHANGES_LOCK = CHANGES
CURRENT_STAGE = CURRENT_LOCK = CURRENT
# per table, the Delta version and `_cdc_seq` up to which its current state was last found equal to the source:
# <schema>/<table>.json (verification/changed_keys.py)
CHECKED_STATE = f"{STATE}/checked"
# what each `cdc-lakehouse forget` did (table, hashes of the keys, time, rows removed per layer; never a clear key):
# <schema>/<table>/<id>.json (stages/rewrite/forget.py)
FORGOTTEN_STATE = f"{STATE}/forgotten"
# what each `cdc-lakehouse forget TABLE --rewrite-policies` did (the columns and their rules, rows per layer; no value):
# <schema>/<table>/<id>.json (stages/rewrite/policies.py)
POLICY_REWRITES_STATE = f"{STATE}/policy_rewrites"
# per current-state data file, the key and CRC-32 of each row's digest text, kept for the next repair:
# <schema>/<table>/<name>.parquet (lake/file_digests.py)
FILE_DIGESTS_STATE = f"{STATE}/file_digests"


def file_digests_folder(table_path: str) -> str:
    """Where a table's kept digest rows live (`TableRef.path`): removed with its current state."""
    return f"{FILE_DIGESTS_STATE}/{table_path}"
