"""Binlog positions, and how `_cdc_seq` is numbered.

`_cdc_seq` orders every row change of the whole binlog as one number (docs/lakehouse.md): it is the
change's ordinal in binlog order, counted from 1 since the lakehouse started capturing. The
counter travels with the checkpoint, so re-capturing from a checkpoint numbers the same changes
the same way, and it keeps increasing across binlog file rotation. It is a 64-bit integer on
purpose: delta-rs writes wrong file statistics for decimals beyond the int64 range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

FIRST_SEQ = 1
_FILE_NUMBER = re.compile(r"\.(\d+)$")


def binlog_file_number(log_file: str) -> int:
    """`mysql-bin.000042` -> 42."""
    match = _FILE_NUMBER.search(log_file)
    if not match:
        raise ValueError(f"not a binlog file name: {log_file!r}")
    return int(match.group(1))


@dataclass(frozen=True, order=False)
class BinlogPosition:
    """A place in the binlog: file and byte offset. Ordered by (file number, offset).

    `epoch` counts the servers capture has followed by GTID (a failover to a replica, whose binlog files and
    offsets are its own): 0 for the first. Positions are compared within one server only, so it takes no part in
    ordering or equality; it prefixes batch names, so a later server's batches sort after an earlier one's.

    `step` counts the batches written at one binlog position without reading the binlog: a repair's rows, read from
    the source at that position (repair/run.py). It suffixes batch names, so such a batch sorts after the batch
    that ends there and before the next one read from the binlog, and takes no part in ordering or equality."""

    log_file: str
    log_pos: int
    epoch: int = field(default=0, compare=False)
    step: int = field(default=0, compare=False)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (binlog_file_number(self.log_file), self.log_pos)

    def __lt__(self, other: BinlogPosition) -> bool:
        return self.sort_key < other.sort_key

    def __le__(self, other: BinlogPosition) -> bool:
        return self.sort_key <= other.sort_key

    def __str__(self) -> str:
        return f"{self.log_file}:{self.log_pos}"

    def batch_name(self) -> str:
        """Name of the raw batch starting here: sorts in binlog order as plain text (a later epoch's names start
        with `g` and its number, after every digit-led name of epoch 0)."""
        number, pos = self.sort_key
        # "_" sorts after "/" too: in a listing of raw/<name>/…, a step's batch still comes after its position's
        name = f"{number:010d}-{pos:012d}" + (f"_{self.step:04d}" if self.step else "")
        return f"g{self.epoch:04d}-{name}" if self.epoch else name

    def in_epoch(self, epoch: int) -> BinlogPosition:
        """The same place, named in `epoch` (a position the current server reported, for comparing and naming)."""
        return self if self.epoch == epoch else replace(self, epoch=epoch)

    def next_step(self) -> BinlogPosition:
        """The same place, after one more batch written there (see `step`)."""
        return replace(self, step=self.step + 1)

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.log_file, "pos": self.log_pos,
            **({"epoch": self.epoch} if self.epoch else {}), **({"step": self.step} if self.step else {}),
        }  # fmt: skip

    @staticmethod
    def from_json(d: dict[str, object]) -> BinlogPosition:
        return BinlogPosition(str(d["file"]), int(d["pos"]), int(d.get("epoch") or 0), int(d.get("step") or 0))  # type: ignore[arg-type]
