"""One table's rows rewritten in every layer, so a value is gone from storage, not only from the newest version.

`rewrite_table_layers(lakehouse, table, rewrite)` takes a `TableRewrite`: what to do to the table's rows in each
form a layer holds them (raw batches' images of canonical texts, the change log's typed rows with their before-image,
current state's rows, the history's versions). `forget.ForgetKeys` drops the rows of some keys; a column policy
added later (issue 31, `--rewrite-policies`) is another `TableRewrite` that replaces a column's values, and needs
nothing else of this module.

Layer by layer, in the order the pipeline feeds them (raw, change log, current state, history), so a layer is never
rebuilt from one not yet rewritten:

- raw batches (raw/ and the archived chains under archive/): each batch holding the table is read, rewritten and
  written again under a new data file named by its manifest (`lake.raw_batches.rewrite_batch_data`): positions, seqs
  and every other table's rows stay as they were;
- each Delta table: every data file whose rows change is written again (statistics from the new rows) and one commit
  removes the old files and adds the new; then `purge_old_versions` vacuums every file no version needs any more,
  writes a checkpoint and deletes the log's JSON commits and older checkpoints: their add actions' statistics (a
  file's min and max of each column) may hold the very values the rewrite removed.

Every step can be taken again: a file whose rows the rewrite leaves as they are is not written, and the purge of
old versions runs every time, so a rewrite stopped anywhere (failpoints `rewrite.*`) is finished by running it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from cdc_assets.core import failpoints
from cdc_assets.core.names import TableRef
from cdc_assets.core.shapes import TableShape
from cdc_assets.lake.delta import file_paths
from cdc_assets.lake.file_digests import remove_file_digests
from cdc_assets.lake.files import add_actions, conformed, read_files, remove_actions, write_files
from cdc_assets.lake.layout import CHANGES, CURRENT, DELTA_LOG, HISTORY, RAW
from cdc_assets.lake.raw_batches import (
    batch_folders,
    read_folder_manifest,
    read_folder_rows,
    remove_unnamed_data,
    rewrite_batch_data,
)
from cdc_assets.lake.store import Lakehouse

REWRITE_KEY = "cdc_rewrite"  # commit metadata of a rewrite's commits: what rewrote the table (no value of a row)
LAYERS = (RAW, CHANGES, CURRENT, HISTORY)


class TableRewrite(Protocol):
    """What a rewrite does to one table's rows, in each form a layer holds them. Each method returns the rows
    rewritten (fewer rows when some go; columns dropped or retyped when a column policy is applied), or None when it
    changes none of them (then nothing is written). A Delta transform given no rows returns the table's rows' new
    schema (an empty table), or None when it keeps the schema."""

    def raw_shape(self, shape: TableShape) -> TableShape:
        """The shape of one raw-batch table version once its images are rewritten (`raw_rows`)."""
        ...

    def raw_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        """Raw-batch rows of one version of the table (`lake.raw_batches.RAW_ROWS_SCHEMA`; `before`/`after` are
        lists of canonical texts in `shape`'s column order)."""
        ...

    def change_rows(self, rows: pa.Table) -> pa.Table | None:
        """Change-log rows: source columns, `_cdc_before` (a struct of them), `_cdc_key`, `_cdc_before_key`, …"""
        ...

    def current_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        """Current-state rows: the source columns (typed) and `_cdc_*` columns; `shape` is the table's newest."""
        ...

    def history_rows(self, rows: pa.Table, shape: TableShape) -> pa.Table | None:
        """History versions: the source columns (typed), `_cdc_key` (the key's typed values as JSON, not the change
        log's texts) and the validity columns; `shape` is the table's newest."""
        ...


@dataclass
class LayerCount:
    """What a rewrite did to one layer: rows it removed, files (raw batches) it wrote again, and the files of old
    versions and log entries it purged."""

    rows_removed: int = 0
    files_rewritten: int = 0
    files_purged: int = 0

    def add(self, other: LayerCount) -> LayerCount:
        return LayerCount(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.rows_removed, self.files_rewritten, self.files_purged)

    def to_json(self) -> dict[str, int]:
        return dict(zip(("rows_removed", "files_rewritten", "files_purged"), self.as_tuple(), strict=True))

    @staticmethod
    def from_json(d: dict[str, int] | None) -> LayerCount:
        return LayerCount(**(d or {}))


@dataclass
class RewriteReport:
    layers: dict[str, LayerCount] = field(default_factory=dict)


def rewrite_table_layers(
    lakehouse: Lakehouse, table: TableRef, rewrite: TableRewrite, shape: TableShape, done: Callable[[str, LayerCount], None] | None = None
) -> RewriteReport:
    """Rewrite `table`'s rows in raw batches, change log, current state and history (when kept), and purge what held
    the old rows. `shape` is the table's newest (current state's columns and key). The caller holds the capture,
    change-log and current-state locks. `done` hears each layer's count as soon as it is finished."""
    report = RewriteReport()
    steps: list[tuple[str, Callable[[], LayerCount]]] = [
        (RAW, lambda: _rewrite_raw(lakehouse, table, rewrite)),
        (CHANGES, lambda: _rewrite_delta(lakehouse, CHANGES, table, rewrite.change_rows)),
        (CURRENT, lambda: _rewrite_delta(lakehouse, CURRENT, table, lambda rows: rewrite.current_rows(rows, shape))),
        (HISTORY, lambda: _rewrite_delta(lakehouse, HISTORY, table, lambda rows: rewrite.history_rows(rows, shape))),
    ]
    for layer, step in steps:
        count = step()
        report.layers[layer] = count
        if done is not None:
            done(layer, count)
    return report


def _rewrite_raw(lakehouse: Lakehouse, table: TableRef, rewrite: TableRewrite) -> LayerCount:
    """Every raw batch (raw/ and archive/) holding rows of `table`, its rows rewritten."""
    store = lakehouse.store
    count = LayerCount()
    for folder in batch_folders(store):
        manifest = read_folder_manifest(store, folder)
        count.files_purged += remove_unnamed_data(store, folder, manifest)  # what a rewrite stopped midway left
        versions = {v: shape for v, shape in manifest.shapes.items() if shape.table == table}
        if not versions:
            continue
        rows = read_folder_rows(store, folder, manifest)
        mine = pc.and_(pc.equal(rows.column("schema"), table.schema), pc.equal(rows.column("table"), table.table))
        parts = [rows.filter(pc.invert(mine))]
        shapes = {v: rewrite.raw_shape(shape) for v, shape in versions.items()}
        changed = any(shapes[v] != shape for v, shape in versions.items())
        for version, shape in sorted(versions.items()):
            part = rows.filter(pc.and_(mine, pc.equal(rows.column("table_version"), version)))
            new = rewrite.raw_rows(part, shape) if part.num_rows else None
            if new is not None:
                changed = True
                count.rows_removed += part.num_rows - new.num_rows
            parts.append(part if new is None else new)
        if not changed:
            continue
        kept = pa.concat_tables([p.cast(rows.schema) for p in parts])
        rewrite_batch_data(store, folder, manifest, kept.sort_by([("seq", "ascending")]), shapes)
        count.files_rewritten += 1
    return count


def _rewrite_delta(
    lakehouse: Lakehouse, layer: str, table: TableRef, transform: Callable[[pa.Table], pa.Table | None]
) -> LayerCount:
    """The table's Delta table in `layer`: each data file whose rows `transform` changes written again, one commit
    replacing them; then its old versions purged. A layer the table has no Delta table in counts nothing.

    When `transform` changes the schema (a column policy: a column dropped, an INT now a hash), every file is written
    again in the new schema and one overwrite commit replaces them all and the schema: the table is never seen with
    files of two schemas, and no old file keeps a dropped column's values."""
    current = lakehouse.open(layer, table)
    if current is None:
        return LayerCount()
    count = LayerCount()
    schema = pa.schema(current.schema().to_arrow())
    reshaped = transform(schema.empty_table())
    new_schema = reshaped.schema if reshaped is not None and _layout(reshaped.schema) != _layout(schema) else None
    access, key = lakehouse.file_access(), lakehouse.table_key(layer, table)
    replaced: list[str] = []
    written: list[dict] = []
    for path in file_paths(current):
        groups = [conformed(rows, schema) for rows in read_files(access, key, [path])]
        rows = pa.concat_tables(groups) if groups else schema.empty_table()
        new = transform(rows)
        if new is None and new_schema is None:
            continue
        new = conformed(rows if new is None else new, new_schema) if new_schema is not None else new
        assert new is not None
        count.rows_removed += rows.num_rows - new.num_rows
        replaced.append(path)
        written.extend(write_files(access, key, str(table), [new]))
    properties = CommitProperties(custom_metadata={REWRITE_KEY: "true"}, max_commit_retries=0)
    if new_schema is not None:
        current.create_write_transaction(
            add_actions(written), mode="overwrite", schema=new_schema, commit_properties=properties
        )
        count.files_rewritten = len(replaced)
        failpoints.hit("rewrite.layer_committed")
    elif replaced:
        current.create_write_transaction(
            [*remove_actions(current, replaced), *add_actions(written)],
            mode="append",
            schema=current.schema(),
            commit_properties=properties,
        )
        count.files_rewritten = len(replaced)
        failpoints.hit("rewrite.layer_committed")
    count.files_purged += purge_old_versions(lakehouse, layer, table)
    return count


def _layout(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """A schema's columns and types (nullability and metadata aside, as Delta and Arrow differ there)."""
    return [(f.name, f.type) for f in schema]


_VERSIONED = re.compile(r"^(\d{20})\.")  # a log file of one version: NNN.json, NNN.checkpoint.parquet, NNN.crc, …


def purge_old_versions(lakehouse: Lakehouse, layer: str, table: TableRef) -> int:
    """Remove from storage everything of the table's older versions: every data file the newest version does not
    reference (delta-rs's vacuum, full, no retention), then the Delta log before a checkpoint of the newest version
    (commits and older checkpoints: their add actions carry each file's min and max values). Time travel to an
    older version is gone with them; the pipeline's seqs live on in the checkpoint's app transactions. Returns the
    files and log entries removed."""
    if layer == CURRENT:  # the CRC-32s of rows a rewrite removed go with them (the next repair writes them again)
        remove_file_digests(lakehouse.store, table)
    current = lakehouse.open(layer, table)
    if current is None:
        return 0
    vacuumed = current.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
    failpoints.hit("rewrite.layer_vacuumed")
    current = DeltaTable(lakehouse.table_uri(layer, table), storage_options=lakehouse.storage_options())
    current.create_checkpoint()
    version = current.version()
    log = f"{lakehouse.table_key(layer, table)}/{DELTA_LOG}"
    removed = 0
    for key in lakehouse.store.list_keys(log):
        found = _VERSIONED.match(key.rsplit("/", 1)[-1])
        if found is not None and int(found.group(1)) < version:
            lakehouse.store.delete(key)
            removed += 1
    return len(vacuumed) + removed
