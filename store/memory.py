"""A store that keeps everything in memory: for the simulator, demos and tests.

It follows the same rules as the TinyDB store (the same ``Batch`` validates
both) but nothing survives the process.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from labq.store.contract import Batch, Change, Durable, Ended, HistoryPart, Ids, StoredState, ended_within, whole


class MemoryStore:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[int, dict] = {}
        self._records: dict[str, dict[str, dict]] = {}
        self._archive: dict[int, dict | None] = {}
        self._ids = Ids(hot=set(), next_job_id=1, floor=1)
        self._record_keys: dict[str, set[str]] = {}
        self._seq = 0

    def load(self) -> StoredState:
        with self._lock:
            return StoredState(copy.deepcopy(self._jobs), copy.deepcopy(self._records), self._ids.next_job_id,
                               self._seq)

    def stage(self, changes: Iterable[Change]) -> Durable:
        """Nothing goes to disk here: staged is committed."""
        return Durable(self.commit(changes))

    def newest(self) -> None:
        return None

    def commit(self, changes: Iterable[Change]) -> int:
        with self._lock:
            batch = Batch(self._ids, self._record_keys)
            batch.add(list(changes))
            for job_id, doc in batch.jobs.items():
                if doc is None:
                    self._jobs.pop(job_id, None)
                else:
                    self._jobs[job_id] = copy.deepcopy(whole(doc))
            for (table, key), record in batch.records.items():
                if record is None:
                    del self._records[table][key]
                else:
                    self._records.setdefault(table, {})[key] = copy.deepcopy(record)
            for entry in batch.archive:
                if "deleted" in entry:
                    self._archive[entry["deleted"]] = None
                else:
                    self._archive[entry["id"]] = copy.deepcopy(entry)
            batch.settle()
            self._seq += 1
            return self._seq

    def history(self, since: float | None = None, until: float | None = None) -> list[dict]:
        with self._lock:
            docs = [d for d in self._archive.values() if d is not None]
        return [copy.deepcopy(d) for d in docs if ended_within(d, since, until)]

    def array_history(self, array_ids: Iterable[int]) -> list[dict]:
        wanted = set(array_ids)
        return [doc for doc in self.history() if (doc["spec"].get("array") or {}).get("id") in wanted]

    def ended(self, user: str | None = None) -> list[Ended]:
        with self._lock:
            return [Ended(d["id"], d["state"], d["spec"]["user"], d.get("ended_at"))
                    for d in self._archive.values() if d is not None and user in (None, d["spec"]["user"])]

    def archived(self, job_ids: Iterable[int]) -> dict[int, dict]:
        with self._lock:
            docs = [self._archive.get(i) for i in set(job_ids)]
        return {d["id"]: copy.deepcopy(d) for d in docs if d is not None}

    def ends(self) -> Iterator[tuple[int, str | None]]:
        with self._lock:
            ends = [(job_id, doc["state"] if doc is not None else None) for job_id, doc in self._archive.items()]
        return iter(ends)

    def history_parts(self) -> list[HistoryPart]:
        """The archive as one part, with no file: nothing derived of it is kept."""

        def read() -> tuple[dict[int, dict | None], bool]:
            with self._lock:
                return copy.deepcopy(self._archive), True

        return [HistoryPart(None, 0, 0, False, read)]

    def close(self) -> None:
        pass
