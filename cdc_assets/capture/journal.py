"""The raw batches a run has captured and not yet recorded: `_state/unrecorded/<run id>.json`.

A `sync` records its raw batches as the raw asset's materialization in its Dagster run, after the capture. Its
capture may run in another process than the one that records it (cdc_assets.runtime.forked_capture: the capture
starts before Dagster is even imported), and either process may die in between. So the capture lists each batch
here, under the capture lock, before the checkpoint passes it, together with the process that will record it
(host, pid and that pid's start time, so a reused pid is not taken for it). The recording run deletes its file once
the raw materialization is in its event log.

A capture that opens its journal (under the capture lock) takes over the files of recorders that are gone: their
batches join its own, and it records them. What keeps a batch from being recorded twice or never:

- a batch is listed before the checkpoint passes it, so a capture killed after the checkpoint moved has it listed;
- one listed but never passed by the checkpoint (killed between the two) is read again by the next capture, which
  keeps it under its name (capture/run.py), so it is taken over only when the checkpoint has passed it, and the
  run that reads it again records it as its own;
- a recorder that died after its materialization was logged and before deleting its file: the run taking the file
  over asks Dagster whether that run recorded its raw batches (`recorded_elsewhere` in the sync op) and drops them;
- files are merged by batch name, so a take-over that dies half-way (its own file written, the others not yet
  deleted) leaves the same batches in two files, merged into one again by the next.

A recorder on another host cannot be looked up from here: its file is taken over once it is STALE_SECONDS old.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_assets.lake.layout import STATE
from cdc_assets.lake.store import ObjectStore

UNRECORDED = f"{STATE}/unrecorded"
STALE_SECONDS = 24 * 3600.0  # a file of a recorder on another host is taken over after this long


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux's /proc), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Recorder:
    """The process that records a run's batches in Dagster."""

    host: str
    pid: int
    started: int | None  # its start in clock ticks since boot (None where /proc is missing)

    @staticmethod
    def of(pid: int) -> Recorder:
        """Process `pid` of this host."""
        return Recorder(socket.gethostname(), pid, _start_ticks(pid))

    @staticmethod
    def this_process() -> Recorder:
        return Recorder.of(os.getpid())

    def gone(self, written_at: float, now: float) -> bool:
        if self.host != socket.gethostname():
            return now - written_at > STALE_SECONDS
        if self.started is None:  # no /proc: whether the pid still runs is all that can be told
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            except OSError:
                return False
            return False
        return _start_ticks(self.pid) != self.started


@dataclass
class CaptureJournal:
    """One run's journal; `batches` maps each batch name to the run that captured it (its own, or one taken over)."""

    run_id: str
    recorder: Recorder = field(default_factory=Recorder.this_process)
    batches: dict[str, str] = field(default_factory=dict)
    listed: Callable[[str], None] | None = None  # called with each batch this run listed (a forked sync's child: runtime/forked_capture)

    @property
    def key(self) -> str:
        return f"{UNRECORDED}/{self.run_id}.json"

    def _save(self, store: ObjectStore) -> None:
        body = {
            "run_id": self.run_id,
            "host": self.recorder.host,
            "pid": self.recorder.pid,
            "started": self.recorder.started,
            "written_at": time.time(),
            "batches": self.batches,
        }
        store.put(self.key, json.dumps(body, indent=1, sort_keys=True).encode())

    def open(self, store: ObjectStore, last_batch: str | None) -> list[str]:
        """Under the capture lock, before capturing: take over this run's own earlier file (a forked capture of
        the same run that died) and those of recorders that are gone, keeping their batches up to `last_batch`
        (the checkpoint's last batch; a later one is read again by this capture). Returns the batches taken over."""
        now = time.time()
        taken, merged = [], []
        # a journal is rewritten at every batch: a capture killed mid-write leaves its temporary file behind
        store.remove_partial_writes(UNRECORDED)
        for key in store.list_keys(f"{UNRECORDED}/"):
            if not key.endswith(".json"):
                continue
            try:
                doc = json.loads(store.get(key))
                batches = {str(k): str(v) for k, v in dict(doc["batches"]).items()}
                recorder = Recorder(str(doc["host"]), int(doc["pid"]), doc.get("started"))
                written_at = float(doc["written_at"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # half-written by a store without atomic puts: its writer wrote it again or is gone
            if key != self.key and not recorder.gone(written_at, now):
                continue
            merged.append(key)
            for name, run in batches.items():
                if last_batch is not None and name <= last_batch and name not in self.batches:
                    self.batches[name] = run
                    taken.append(name)
        self._save(store)  # first the batches under this run, then the other files go
        for key in merged:
            if key != self.key:
                store.delete(key)
        return sorted(taken)

    def add(self, store: ObjectStore, name: str) -> None:
        """A batch this run captured (or read again), before the checkpoint passes it."""
        if self.batches.get(name) != self.run_id:
            self.batches[name] = self.run_id
            self._save(store)
            if self.listed is not None:
                self.listed(name)

    def taken_over(self) -> dict[str, str]:
        """The batches of other runs this journal took over: name -> the run that captured them."""
        return {name: run for name, run in self.batches.items() if run != self.run_id}

    def close(self, store: ObjectStore) -> None:
        """The batches are recorded: the file goes."""
        store.delete(self.key)
