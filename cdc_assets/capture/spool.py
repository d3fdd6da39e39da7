"""Rows kept in memory up to a bound, beyond it in a local Parquet file: capture's memory does not grow with
the size of a transaction or a batch (a 1M-row UPDATE is one transaction, and a batch ends only where a
transaction does)."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

CHUNK_ROWS = 20_000  # rows held in Python lists at most, per spool; a Parquet row group beyond that


SPOOL_PREFIX = "cdc-spool-"


class SpoolDirectory:
    """A private local directory, removed when the last object holding it is gone. Its name carries the
    process id, so a later process can tell one left by a process that was killed (`remove_orphaned_spools`)."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def remove(self) -> None:
        self._finalizer()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_orphaned_spools(base: Path | None = None) -> list[Path]:
    """Remove spool directories whose process is gone (a SIGKILL leaves them: the finalizer never ran, and a
    huge transaction's spool holds gigabytes); returns what was removed. Directories of living processes, and
    of other programs, are left alone."""
    removed = []
    for path in Path(base or tempfile.gettempdir()).glob(f"{SPOOL_PREFIX}*"):
        pid_text = path.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if not path.is_dir() or not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def string_lists(values: Sequence[list[str | None] | None]) -> pa.ListArray:
    """A list<string> array from Python lists, flattened first: three times faster than converting nested lists."""
    valid = [v is not None for v in values]
    if all(valid):
        flat = list(chain.from_iterable(values))  # type: ignore[arg-type]
        offsets = pa.array([0, *accumulate(map(len, values))], pa.int32())  # type: ignore[arg-type]
        return pa.ListArray.from_arrays(offsets, pa.array(flat, pa.string()))
    present = [v for v in values if v is not None]
    flat = list(chain.from_iterable(present))
    offsets = pa.array([0, *accumulate(len(v) if v is not None else 0 for v in values)], pa.int32())
    mask = pa.array([not v for v in valid])
    return pa.ListArray.from_arrays(offsets, pa.array(flat, pa.string()), mask=mask)


_STRING_LISTS = pa.list_(pa.string())


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How a spool's Parquet file is written: zstd, and statistics of the plain columns only. A row image's
    statistics helped no reader, and finding them copied every value twice (a 60 MB value took 200 MB more)."""
    return {"compression": "zstd", "write_statistics": [f.name for f in schema if not pa.types.is_nested(f.type)]}


class RowSpool:
    """Rows of one Arrow schema, added column by column (a block of rows at a time) and read back in order as
    tables of at most about `chunk_rows` rows. The file, when one is needed, is a plain Parquet file (zstd)."""

    def __init__(self, schema: pa.Schema, path: Path, chunk_rows: int = CHUNK_ROWS) -> None:
        self.schema = schema
        self.path = path
        self.chunk_rows = chunk_rows
        self._width = len(schema.names)
        self._columns: list[list[Any]] = [[] for _ in range(self._width)]
        self._writer: pq.ParquetWriter | None = None
        self._file_written = False
        self.spilled = 0
        self.buffered = 0

    def __len__(self) -> int:
        return self.spilled + self.buffered

    def extend(self, columns: Sequence[Sequence[Any]]) -> None:
        """Rows given as one sequence per column, in the schema's order, all of one length."""
        for column, values in zip(self._columns, columns, strict=True):
            column.extend(values)
        self.buffered += len(columns[0])
        if self.buffered >= self.chunk_rows:
            self.flush()

    def append_table(self, table: pa.Table) -> None:
        """Whole row groups at once (rows moved from another spool)."""
        self.flush()
        self._write(table.cast(self.schema))

    def buffered_columns(self) -> list[list[Any]]:
        """The rows still in memory, one list per column (all of them for a spool that never spilled)."""
        return self._columns

    def _buffer(self) -> pa.Table:
        arrays = [
            string_lists(values) if f.type == _STRING_LISTS else pa.array(values, f.type)
            for values, f in zip(self._columns, self.schema, strict=True)
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema, **_parquet_options(self.schema))
            self._file_written = True
        self._writer.write_table(table, row_group_size=self.chunk_rows)
        self.spilled += table.num_rows

    def flush(self) -> None:
        if self.buffered:
            table = self._buffer()
            self._columns = [[] for _ in range(self._width)]  # the Python values go before the file is written
            self.buffered = 0
            self._write(table)

    def chunks(self) -> Iterator[pa.Table]:
        """Every row in order: what was spilled, then what is still buffered. Ends the spool's file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            parquet = pq.ParquetFile(self.path)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group)
        if self.buffered:
            yield self._buffer()

    def finish(self, limit: int | None = None) -> Path:
        """The spool (its first `limit` rows) as one Parquet file at `path`, also when it has no row at all."""
        self.flush()
        if self._writer is None:
            pq.write_table(self.schema.empty_table(), self.path, **_parquet_options(self.schema))
            self._file_written = True
        else:
            self._writer.close()
            self._writer = None
        if limit is not None and limit < len(self):
            self._truncate(limit)
        return self.path

    def _truncate(self, limit: int) -> None:
        kept = self.path.with_name(self.path.name + ".kept")
        with pq.ParquetWriter(kept, self.schema, **_parquet_options(self.schema)) as writer:
            parquet = pq.ParquetFile(self.path)
            left = limit
            for group in range(parquet.num_row_groups):
                if left <= 0:
                    break
                table = parquet.read_row_group(group).slice(0, left)
                writer.write_table(table, row_group_size=self.chunk_rows)
                left -= table.num_rows
        kept.replace(self.path)
        self.spilled, self.buffered = limit, 0

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._file_written:  # most transactions never need a file: no system call for them
            self.path.unlink(missing_ok=True)
            self._file_written = False
        self._columns = [[] for _ in range(self._width)]
        self.spilled = self.buffered = 0
