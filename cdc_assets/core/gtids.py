"""GTID state at a transaction boundary, as the checkpoint and the raw batches keep it (plain values, no I/O).

MariaDB names a point of its binlog by the last GTID of each replication domain (`domain-server-sequence`, one per
domain), and a replica resumes after that state. MySQL names it by the set of every transaction executed up to it
(`uuid:1-5:tag:1-3,uuid2:1-9`, MySQL's own text form: a source UUID, its untagged intervals, then each tag, MySQL
8.3+, with its intervals), and a replica with auto-position resumes with exactly the transactions not in that set.
One `GtidState` holds either kind; its text is what the checkpoint and each manifest store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

Interval = tuple[int, int]  # first and last transaction number, both included
Source = tuple[str, str]  # (server uuid, tag): the tag is '' for untagged GTIDs

_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")


def _merged(intervals: list[Interval], first: int, last: int) -> list[Interval]:
    """Sorted disjoint intervals with [first, last] added (touching ones joined)."""
    out: list[Interval] = []
    for low, high in intervals:
        if high + 1 < first:
            out.append((low, high))
        elif last + 1 < low:
            out.append((first, last))
            first, last = low, high
        else:
            first, last = min(first, low), max(last, high)
    out.append((first, last))
    return sorted(out)


def _contains(intervals: list[Interval], first: int, last: int) -> bool:
    return any(low <= first and last <= high for low, high in intervals)


@dataclass
class GtidState:
    """MariaDB's last GTID per domain, and MySQL's executed GTID set (per source and tag, its intervals)."""

    domains: dict[str, str] = field(default_factory=dict)  # MariaDB: domain -> `domain-server-sequence`
    executed: dict[Source, list[Interval]] = field(default_factory=dict)  # MySQL

    @staticmethod
    def parse(text: str | None) -> GtidState:
        """A state from its text (`text()`, MariaDB's `gtid_binlog_pos`, MySQL's `gtid_executed`); newlines and
        spaces between elements are ignored."""
        state = GtidState()
        for element in re.sub(r"\s+", "", text or "").split(","):
            if not element:
                continue
            if ":" not in element:
                state.domains[element.split("-", 1)[0]] = element
                continue
            uuid, *parts = element.split(":")
            tag = ""
            for part in parts:
                match = _INTERVAL.match(part)
                if match is None:
                    tag = part.lower()
                    if not _TAG.match(tag):
                        raise ValueError(f"not a GTID tag: {part!r} in {text!r}")
                    continue
                first, last = int(match.group(1)), int(match.group(2) or match.group(1))
                state.add_interval((uuid.lower(), tag), first, last)
        return state

    def add(self, gtid: str) -> None:
        """One transaction's GTID: `domain-server-sequence` (MariaDB), `uuid:n` or `uuid:tag:n` (MySQL)."""
        if ":" not in gtid:
            self.domains[gtid.split("-", 1)[0]] = gtid
            return
        uuid, *tag, number = gtid.split(":")
        self.add_interval((uuid.lower(), tag[0].lower() if tag else ""), int(number), int(number))

    def add_interval(self, source: Source, first: int, last: int) -> None:
        self.executed[source] = _merged(self.executed.get(source, []), first, last)

    def update(self, other: GtidState) -> None:
        """This state and `other` together: MySQL sets united, MariaDB domains taken from `other`."""
        self.domains.update(other.domains)
        for source, intervals in other.executed.items():
            for first, last in intervals:
                self.add_interval(source, first, last)

    def copy(self) -> GtidState:
        return GtidState(dict(self.domains), {s: list(i) for s, i in self.executed.items()})

    def holds(self, gtid: str) -> bool:
        """Whether a MySQL GTID (`uuid:n`, `uuid:tag:n`) is in the executed set (a MariaDB one never is: its state
        keeps no set)."""
        if ":" not in gtid:
            return False
        uuid, *tag, number = gtid.split(":")
        return _contains(self.executed.get((uuid.lower(), tag[0].lower() if tag else ""), []), int(number), int(number))

    def issubset(self, other: GtidState) -> bool:
        """Every MySQL transaction of this set is in `other`'s (MariaDB domains are not compared)."""
        return all(
            _contains(other.executed.get(source, []), first, last)
            for source, intervals in self.executed.items()
            for first, last in intervals
        )

    @property
    def tagged(self) -> bool:
        return any(tag for _, tag in self.executed)

    def last_gtids_only(self) -> bool:
        """Whether a MySQL state looks as the checkpoint once stored it (the last GTID of each source, not the
        executed set): an untagged source with a single transaction past the first. The set there must be read
        again from the binlog (a real executed set of that form is rare, and reading it again is always right)."""
        return any(
            not tag and len(intervals) == 1 and intervals[0][0] == intervals[0][1] > 1
            for (_, tag), intervals in self.executed.items()
        )

    def text(self) -> str | None:
        """MySQL's text of the executed set (sources in UUID order, untagged intervals first, then tags in order),
        MariaDB's domains in domain order; None for an empty state."""
        parts = [self.domains[d] for d in sorted(self.domains)]
        for uuid in sorted({uuid for uuid, _ in self.executed}):
            text = uuid
            for tag in sorted(tag for u, tag in self.executed if u == uuid):
                ranges = ":".join(f"{a}-{b}" if a != b else str(a) for a, b in self.executed[uuid, tag])
                text += f":{tag}:{ranges}" if tag else f":{ranges}"
            parts.append(text)
        return ",".join(parts) or None

    def __bool__(self) -> bool:
        return bool(self.domains or self.executed)
