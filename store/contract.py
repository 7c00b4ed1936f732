"""What the leader asks the store to record, and the rules every store enforces.

A commit is a list of changes applied atomically. Jobs are JSON documents with
an integer ``id`` and a ``state``; a job put in a finished state leaves the hot
database for the archive. Other tables (reservations, users, ...) hold records
by string key.

Rules, the same for every store:
- job ids are never reused: ``next_job_id`` only grows, even when the newest
  job is deleted or archived;
- a job that has left the hot database (finished or deleted) cannot be put
  back: a rerun is a new job;
- a delete of something that does not exist is an error, not a no-op.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from labq.models.job import JobState

JOBS = "jobs"
META = "_meta"
_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class PutJob:
    """A job submitted, placed, or changed state: the whole new document."""

    doc: Mapping


@dataclass(frozen=True)
class PutTasks:
    """New jobs of one shape, an array's tasks, in one change: ``first`` is the first task's whole document, and
    each of ``others`` (id, command, environment, index in the array) another task's, the same as ``first`` but for
    those (``task_doc``). Their ids are new. The journal keeps them so, not as whole documents: a 10,000-task array
    is one small record, and the whole documents are written when a compaction folds it into the snapshot."""

    first: Mapping
    #: each: (id, command, environment as a mapping or (name, value) pairs, index)
    others: Sequence[tuple[int, Sequence[str], Mapping[str, str] | Sequence[tuple[str, str]], int]]


def task_doc(first: Mapping, job_id: int, command: Sequence[str], env: Mapping[str, str], index: int) -> dict:
    """The document of an array's task that differs from ``first`` (another task's) in its id, command,
    environment and index alone."""
    spec = first["spec"]
    return {**first, "id": job_id, "spec": {**spec, "command": list(command), "env": dict(env),
                                            "array": {**spec["array"], "index": index}}}


class ToldTask:
    """An array's task as ``PutTasks`` told it, kept so in the store's hot state until its whole document is
    asked for (``whole``): by a compaction, or the leader's next start. Making 10,000 documents would cost a
    big array's submit more than all the rest of its commit."""

    __slots__ = ("first", "job_id", "command", "env", "index")

    def __init__(self, first: Mapping, job_id: int, command: Sequence[str], env: Mapping[str, str],
                 index: int) -> None:
        self.first, self.job_id, self.command, self.env, self.index = first, job_id, command, env, index


def whole(doc: Mapping | ToldTask) -> dict:
    """A job's document, made whole if it is a ``ToldTask``."""
    if type(doc) is ToldTask:
        return task_doc(doc.first, doc.job_id, doc.command, doc.env, doc.index)
    return doc


@dataclass(frozen=True)
class DeleteJob:
    job_id: int


@dataclass(frozen=True)
class PutRecord:
    """A reservation booked, a user added, ...: the whole new record."""

    table: str
    key: str
    doc: Mapping


@dataclass(frozen=True)
class DeleteRecord:
    table: str
    key: str


Change = PutJob | PutTasks | DeleteJob | PutRecord | DeleteRecord


@dataclass(frozen=True)
class StoredState:
    """Everything the leader needs at start."""

    jobs: dict[int, dict]  #: the hot jobs: not finished
    records: dict[str, dict[str, dict]]  #: table -> key -> record
    next_job_id: int
    seq: int  #: commits so far


class HistoryPart(NamedTuple):
    """One part of the archive (a month's file): what identifies its content, and how to read it."""

    name: str | None  #: the file's name; None: a part with no file (a memory store), so nothing derived is kept of it
    size: int  #: the file's size and modification time as it was listed: a copy of what was derived of it names
    mtime_ns: int  #: them, and is stale once they differ
    closed: bool  #: not the newest part: rarely written to (a job archived late, a recovery)
    #: its jobs, the last version of each in it (None: deleted there), and whether that is all of it: no line was
    #: damaged or of a commit still being made (then nothing derived of it should be kept)
    read: Callable[[], tuple[dict[int, dict | None], bool]]
    #: the month (``month_at``) whose finished jobs it holds, and the deletions made in it; None: a part of every
    #: month (a memory store's one part)
    month: str | None = None


def month_at(ended_at: object, now: float) -> str:
    """The month of the archive a finished job is kept in (``YYYY-MM``, UTC): the one it ended in (``ended_at``), else
    ``now``'s (a deletion's, or a job with no end)."""
    stamp = ended_at if isinstance(ended_at, (int, float)) and not isinstance(ended_at, bool) else now
    return time.strftime("%Y-%m", time.gmtime(stamp))


class Ended(NamedTuple):
    """An archived job as a listing of finished jobs filters, sorts and pages it, before it reads the page's jobs
    whole (``Store.archived``)."""

    id: int
    state: str
    user: str
    ended_at: float | None


class Store(Protocol):
    """What the leader needs from persistence. Only the leader process writes."""

    def load(self) -> StoredState:
        """The whole hot state, at start."""

    def commit(self, changes: Iterable[Change]) -> int:
        """Apply the changes atomically; return the commit number once they are durable.

        Raises InvalidChange (the changes break a rule) or CommitFailed (not saved).
        """

    def stage(self, changes: Iterable[Change]) -> Staged:
        """``commit``, returning once the changes are written and the next commit may be checked against them,
        before they are durable: ``wait()`` on the answer for that. A caller that takes them in meanwhile is ahead
        of the disk if they are lost on the way: the store then refuses changes until a restart."""

    def newest(self) -> Staged | None:
        """The last commit written and not yet durable, if any: whatever was read now is on disk once it is."""

    def history(self, since: float | None = None, until: float | None = None) -> list[dict]:
        """Finished jobs that left the hot state, newest version of each."""

    def history_parts(self) -> list[HistoryPart]:
        """The archive in its parts, oldest first: ``history()`` is what they read, merged in this order."""

    def array_history(self, array_ids: Iterable[int]) -> list[dict]:
        """``history()`` of the tasks of arrays ``array_ids`` alone: only their lines are decoded."""

    def ended(self, user: str | None = None) -> list[Ended]:
        """The last version of each archived job that was not deleted (``user``: of that user's jobs alone), as
        ``Ended``: read without decoding whole jobs (``ls --history`` of 100,000 archived jobs reads the 20 it
        shows whole)."""

    def archived(self, job_ids: Iterable[int]) -> dict[int, dict]:
        """The last versions of the archived jobs ``job_ids``, by id (one not there, or deleted, is left out):
        only their lines are decoded."""

    def ends(self) -> Iterator[tuple[int, str | None]]:
        """How each archived job ended, as (job id, its state; None: deleted since), in the archive's order (a
        later one of a job says it last): what depends on finished jobs needs of history, read without decoding
        whole jobs."""

    def close(self) -> None: ...


class Staged(Protocol):
    """Commits written, on their way to disk (``Store.stage``)."""

    #: whether a caller took one of them in before it was on disk (``stage``, not ``commit``)
    taken_in: bool

    def wait(self) -> int:
        """The commit number once on disk; CommitFailed if it never will be."""


@dataclass(frozen=True)
class Durable:
    """A commit on disk already: what a store that waits for nothing stages."""

    seq: int
    taken_in: bool = False

    def wait(self) -> int:
        return self.seq


class StoreError(Exception):
    """Base of everything the store refuses; ``hint`` says what to do."""

    hint: str = ""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint or self.hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n{self.hint}" if self.hint else text


class InvalidChange(StoreError, ValueError):
    """A change breaks the rules; nothing of its commit was applied."""


class CommitFailed(StoreError):
    """The disk refused the write (full, fsync error): nothing was acknowledged."""


class CorruptDatabase(StoreError):
    """The database on disk is damaged; it was left as it is."""


class SchemaMismatch(StoreError):
    """The database was written by another version of labq."""


class StoreLocked(StoreError):
    """Another leader holds this data folder."""


def ended_within(doc: Mapping, since: float | None, until: float | None) -> bool:
    """Whether a finished job's ``ended_at`` lies in [since, until); jobs without one always do."""
    ended = doc.get("ended_at")
    if not isinstance(ended, (int, float)) or isinstance(ended, bool):
        return True
    return (since is None or ended >= since) and (until is None or ended < until)


def is_finished(doc: Mapping) -> bool:
    return JobState(doc["state"]).finished


@dataclass
class Ids:
    """Which job ids are in use, and which are spent for good.

    An id is spent when its job leaves the hot state (finished or deleted), and
    every id below ``floor`` (the next id when the store was opened) that is
    not hot is spent too. An id the leader has handed out but not yet committed
    is neither, so concurrent submits may commit in any order.
    """

    hot: set[int]
    next_job_id: int
    floor: int
    #: a mark for each id from ``floor`` on that left the hot state: a byte an id, not a set's entry (ids are dense)
    spent: bytearray = field(default_factory=bytearray)

    def is_spent(self, job_id: int) -> bool:
        if job_id < self.floor:
            return job_id not in self.hot
        at = job_id - self.floor
        return at < len(self.spent) and self.spent[at] != 0

    def unspend(self, ids: Iterable[int]) -> None:
        """``ids`` did not leave after all: the commit that spent them was lost on its way to disk."""
        for job_id in ids:
            at = job_id - self.floor
            if 0 <= at < len(self.spent):
                self.spent[at] = 0

    def spend(self, ids: Iterable[int]) -> None:
        """``ids`` left the hot state for good."""
        for job_id in ids:
            at = job_id - self.floor
            if at < 0:
                continue
            if at >= len(self.spent):
                self.spent.extend(bytes(max(at + 1 - len(self.spent), len(self.spent) // 2)))
            self.spent[at] = 1


@dataclass
class Batch:
    """The combined effect of a run of commits, validated against the store's state before them.

    It reads the store's ``Ids`` and record keys without changing them; the
    store takes the effect in with ``settle`` once the batch is on disk.
    ``jobs`` maps id -> new document (an array's task: a ``ToldTask``), or None when the job leaves the hot state;
    ``archive`` lists finished job documents and tombstones (``{"deleted": id}``);
    ``tasks`` lists each ``PutTasks`` as (first document, others).
    """

    ids: Ids
    record_keys: dict[str, set[str]]
    next_job_id: int = 0
    jobs: dict[int, dict | None] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)  #: ids spent by this batch
    records: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    archive: list[dict] = field(default_factory=list)
    tasks: list[tuple[dict, list[tuple[int, list[str], dict[str, str], int]]]] = field(default_factory=list)
    #: what ``settle`` changed, as it was: hot or not by id, the next id, a key or not by (table, key), the ids it
    #: spent that were not spent before
    _before: tuple = field(default=(), repr=False)

    def __post_init__(self) -> None:
        self.next_job_id = max(self.next_job_id, self.ids.next_job_id)

    def add(self, changes: Sequence[Change]) -> None:
        """Validate ``changes`` as one commit on top of this batch, then take them in.

        Raises InvalidChange, leaving the batch as it was.
        """
        if not changes:
            raise InvalidChange("a commit needs at least one change")
        draft = _Draft(self, self.next_job_id)
        for change in changes:
            draft.take(change)
        self.jobs.update(draft.jobs)
        self.tasks.extend(draft.tasks)
        self.left |= draft.left
        self.records.update(draft.records)
        self.archive.extend(draft.archive)
        self.next_job_id = draft.next_job_id

    def told(self) -> set[int]:
        """The ids whose document in ``jobs`` is the one ``tasks`` tells (as its differences, or as the first
        task's): no later change in the batch made it again. The journal writes those there alone."""
        ids = {job_id for job_id, doc in self.jobs.items() if type(doc) is ToldTask}
        ids.update(first["id"] for first, _ in self.tasks if self.jobs.get(first["id"]) is first)
        return ids

    def settle(self) -> None:
        """Take the batch's effect into the store's ids and record keys (once written: the next batches are
        checked against it); ``unsettle`` undoes it if it is lost on its way to disk."""
        keys = self.record_keys
        self._before = ({job_id: job_id in self.ids.hot for job_id in self.jobs}, self.ids.next_job_id,
                        {(table, key): key in keys.get(table, ()) for table, key in self.records},
                        [job_id for job_id in self.left if not self.ids.is_spent(job_id)])
        for job_id, doc in self.jobs.items():
            if doc is None:
                self.ids.hot.discard(job_id)
            else:
                self.ids.hot.add(job_id)
        self.ids.spend(self.left)
        self.ids.next_job_id = self.next_job_id
        for (table, key), record in self.records.items():
            keys = self.record_keys.setdefault(table, set())
            if record is None:
                keys.discard(key)
            else:
                keys.add(key)

    def unsettle(self) -> None:
        """Undo ``settle``: the batch never reached the disk."""
        hot, next_job_id, had, spent_here = self._before
        for job_id, was in hot.items():
            if was:
                self.ids.hot.add(job_id)
            else:
                self.ids.hot.discard(job_id)
        self.ids.unspend(spent_here)
        self.ids.next_job_id = next_job_id
        for (table, key), was in had.items():
            keys = self.record_keys.setdefault(table, set())
            if was:
                keys.add(key)
            else:
                keys.discard(key)


@dataclass
class _Draft:
    """One commit's changes on top of a batch, checked one by one; the batch takes them only if all pass."""

    batch: Batch
    next_job_id: int
    jobs: dict[int, dict | None] = field(default_factory=dict)
    left: set[int] = field(default_factory=set)
    records: dict[tuple[str, str], dict | None] = field(default_factory=dict)
    archive: list[dict] = field(default_factory=list)
    tasks: list[tuple[dict, list[tuple[int, list[str], dict[str, str], int]]]] = field(default_factory=list)

    def take(self, change: Change) -> None:
        if isinstance(change, PutJob):
            self._put_job(change)
        elif isinstance(change, PutTasks):
            self._put_tasks(change)
        elif isinstance(change, DeleteJob):
            self._delete_job(change.job_id)
        elif isinstance(change, PutRecord):
            table, key = _record_address(change.table, change.key)
            if not isinstance(change.doc, Mapping):
                raise InvalidChange(f"a {table} record must be a JSON object")
            self.records[table, key] = dict(change.doc)
        elif isinstance(change, DeleteRecord):
            table, key = _record_address(change.table, change.key)
            if not self._has_record(table, key):
                raise InvalidChange(f"there is no {table} record {key!r} to delete")
            self.records[table, key] = None
        else:
            raise InvalidChange(f"not a store change: {change!r}")

    def _put_job(self, change: PutJob) -> None:
        doc = _job_doc(change.doc)
        job_id = doc["id"]
        if self._spent(job_id):
            raise InvalidChange(f"job {job_id} is no longer active (finished or deleted); "
                                f"job ids are never reused, so a rerun is a new job")
        self.next_job_id = max(self.next_job_id, job_id + 1)
        if is_finished(doc):
            self.jobs[job_id] = None
            self.left.add(job_id)
            self.archive.append(doc)
        else:
            self.jobs[job_id] = doc

    def _put_tasks(self, change: PutTasks) -> None:
        first = _job_doc(change.first)
        spec = first.get("spec")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("array"), Mapping):
            raise InvalidChange(f"job {first['id']}: an array's task needs spec.array")
        if is_finished(first):
            raise InvalidChange(f"job {first['id']}: an array's new tasks are not finished")
        others = []
        for item in change.others:
            if not isinstance(item, (tuple, list)) or len(item) != 4:
                raise InvalidChange(f"an array's task is (id, command, environment, index), not {item!r}")
            job_id, command, env, index = item
            if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
                raise InvalidChange(f"a job needs an integer id of 1 or more, not {job_id!r}")
            try:  # words all: join says so at C speed
                if not isinstance(command, (list, tuple)) or isinstance(env, (str, bytes)):
                    raise TypeError
                env = dict(env)
                "".join(command), "".join(env), "".join(env.values())
                if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                    raise TypeError
            except (TypeError, ValueError):
                raise InvalidChange(f"job {job_id}: a task's command is words, its environment names to words, "
                                    "its index a whole number") from None
            others.append((job_id, list(command), env, index))
        ids = [first["id"]] + [o[0] for o in others]
        if len(set(ids)) != len(ids):
            raise InvalidChange("an array's tasks have ids of their own, each once")
        fresh = min(ids) >= self.next_job_id  # past every id committed or taken so far: new, every one
        for job_id in () if fresh else ids:
            if self._hot(job_id):
                raise InvalidChange(f"job {job_id} exists already: an array's tasks are new jobs")
            if self._spent(job_id):
                raise InvalidChange(f"job {job_id} has ended: job ids are never reused, and an array's tasks are "
                                    "new jobs")
        self.next_job_id = max(self.next_job_id, max(ids) + 1)
        self.jobs[first["id"]] = first
        for job_id, command, env, index in others:
            self.jobs[job_id] = ToldTask(first, job_id, command, env, index)
        self.tasks.append((first, others))

    def _delete_job(self, job_id: object) -> None:
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not 1 <= job_id < self.next_job_id:
            raise InvalidChange(f"there is no job {job_id!r} to delete")
        if self._hot(job_id):
            self.jobs[job_id] = None
        elif not self._spent(job_id):
            raise InvalidChange(f"there is no job {job_id} to delete")
        else:
            self.archive.append({"deleted": job_id})
        self.left.add(job_id)

    def _hot(self, job_id: int) -> bool:
        for layer in (self.jobs, self.batch.jobs):
            if job_id in layer:
                return layer[job_id] is not None
        return job_id in self.batch.ids.hot

    def _spent(self, job_id: int) -> bool:
        return (job_id in self.left or job_id in self.batch.left
                or (not self._hot(job_id) and self.batch.ids.is_spent(job_id)))

    def _has_record(self, table: str, key: str) -> bool:
        for layer in (self.records, self.batch.records):
            if (table, key) in layer:
                return layer[table, key] is not None
        return key in self.batch.record_keys.get(table, ())


def _job_doc(doc: Mapping) -> dict:
    if not isinstance(doc, Mapping):
        raise InvalidChange("a job must be a JSON object")
    job_id = doc.get("id")
    if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
        raise InvalidChange(f"a job needs an integer id of 1 or more, not {job_id!r}")
    try:
        JobState(doc.get("state"))
    except ValueError:
        raise InvalidChange(f"job {job_id}: unknown state {doc.get('state')!r}; "
                            f"one of {', '.join(s.value for s in JobState)}") from None
    return dict(doc)


def _record_address(table: str, key: str) -> tuple[str, str]:
    if not isinstance(table, str) or not _TABLE_NAME.match(table) or table == JOBS:
        raise InvalidChange(f"bad table name {table!r}: lower-case letters, digits and _, not 'jobs'")
    if not isinstance(key, str) or not key:
        raise InvalidChange(f"a {table} record needs a non-empty string key")
    return table, key
