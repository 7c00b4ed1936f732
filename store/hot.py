"""The hot database in memory, changed one journal record at a time, and its snapshot file's bytes.

The snapshot (``labq.json``) is in TinyDB's JSON storage format, ``{"TABLE": {"DOC_ID": DOC}}``,
so ``TinyDB(path, access_mode="r")`` opens it: jobs are documents whose doc id is the job id, every
other table holds ``{"key", "record"}`` documents, and the ``_meta`` table's one document says the schema,
the commit the file holds and the job ids. It is canonical JSON (sorted keys, compact), and each
document's encoding is kept once made (a commit makes it for the journal), so writing a snapshot
joins kept bytes instead of encoding the whole lab again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from labq.store.contract import JOBS, META, ToldTask, whole
from labq.store.files import write_all
from labq.store.journal import dumps

SCHEMA = 1
#: Canonical JSON sorts keys, so the file opens with the _meta table (table names are lower-case,
#: "_" sorts first) and its record, whose first key is "checksum", spliced in there.
PREFIX = b'{"' + META.encode() + b'":{"1":{'


_CHECKSUM_KEY = b'"checksum":"'
#: about how much of a snapshot is made at a time (``Capture.parts``)
CHUNK_BYTES = 1 << 20


def stamp(body: bytes) -> bytes:
    """The file's bytes for canonical ``body`` (whose ``_meta`` has no checksum): the checksum spliced in."""
    assert body.startswith(PREFIX), "the _meta table must come first"
    digest = hashlib.sha256(body).hexdigest().encode()
    return PREFIX + _CHECKSUM_KEY + digest + b'",' + body[len(PREFIX):]


class HotState:
    """Unfinished jobs and the records tables at commit ``seq``. Documents are never changed in place
    (a change replaces them), so a snapshot taken as shallow copies stays as it was."""

    def __init__(self, data: dict) -> None:
        meta = data[META]["1"]
        self.seq: int = meta["seq"]
        self.next_job_id: int = meta["next_job_id"]
        self.reserved: int = meta["ids_reserved_until"]
        # TinyDB's own reader makes a Document of every job (a third of a second at 30,000 jobs): the tables
        # are read as the plain mappings TinyDB stores them as
        #: by id, each job's document (an array's task told as its differences: a ``ToldTask``, ``whole`` makes it)
        self.jobs: dict[int, dict] = {int(doc_id): doc for doc_id, doc in data.get(JOBS, {}).items()}
        self.texts: dict[int, bytes] = {}  #: canonical encodings of jobs, where made
        #: table -> key -> (doc id, record)
        self.tables: dict[str, dict[str, tuple[int, dict]]] = {
            name: {doc["key"]: (int(doc_id), doc["record"]) for doc_id, doc in table.items()}
            for name, table in data.items() if name not in (JOBS, META)}
        self._next_doc = {name: 1 + max((d for d, _ in table.values()), default=0)
                          for name, table in self.tables.items()}

    def take(self, record: dict, texts: dict[int, bytes] | None = None) -> None:
        """Apply one journal record; ``texts``: the encodings of its jobs, when the caller made them. An array's
        tasks (``tasks``: each ``PutTasks`` as its first task's document and the others' differences) come
        before ``jobs``, which holds what later changes of the same commit made of them."""
        for first, others in record.get("tasks", ()):
            for job_id, doc in ((first["id"], first), *((o[0], ToldTask(first, *o)) for o in others)):
                self.texts.pop(job_id, None)
                self.jobs[job_id] = doc
        for key, doc in record["jobs"].items():
            job_id = int(key)
            self.texts.pop(job_id, None)
            if doc is None:
                self.jobs.pop(job_id, None)
            else:
                self.jobs[job_id] = doc
                if texts is not None and job_id in texts:
                    self.texts[job_id] = texts[job_id]
        for name, key, value in record["records"]:
            table = self.tables.setdefault(name, {})
            if value is None:
                table.pop(key, None)
                continue
            doc_id = table[key][0] if key in table else self._next_doc.get(name, 1)
            self._next_doc[name] = max(self._next_doc.get(name, 1), doc_id + 1)
            table[key] = (doc_id, value)
        self.seq, self.next_job_id, self.reserved = record["seq"], record["next_job_id"], record["reserved"]

    def meta(self) -> dict:
        return {"schema": SCHEMA, "seq": self.seq, "next_job_id": self.next_job_id,
                "ids_reserved_until": self.reserved}

    def capture(self) -> Capture:
        """What a snapshot of now needs: shallow copies, quick to take while commits wait."""
        return Capture(self.meta(), dict(self.jobs), dict(self.texts),
                       {name: dict(table) for name, table in self.tables.items()})


class Capture:
    def __init__(self, meta: dict, jobs: dict[int, dict], texts: dict[int, bytes],
                 tables: dict[str, dict[str, tuple[int, dict]]]) -> None:
        self.meta, self.jobs, self.texts, self.tables = meta, jobs, texts, tables

    @property
    def seq(self) -> int:
        return self.meta["seq"]

    def parts(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The canonical body after ``PREFIX`` (the ``_meta`` record without its checksum, then each table), in
        pieces of about ``chunk_bytes``: a snapshot of a long queue is tens of megabytes, and joining it whole (and
        again to splice the checksum in) made fresh memory the size of the file several times over."""
        pieces, size = [dumps(self.meta)[1:], b"}"], 0
        for name in sorted(set(self.tables) | {JOBS}):
            if name == JOBS:
                rows = sorted((str(i), self.texts.get(i) or dumps(whole(doc))) for i, doc in self.jobs.items())
            else:
                rows = sorted((str(doc_id), dumps({"key": key, "record": record}))
                              for key, (doc_id, record) in self.tables[name].items())
            pieces.append(b',"' + name.encode() + b'":{')
            between = b'"'
            for key, text in rows:
                pieces += (between, key.encode(), b'":', text)
                between = b',"'
                size += len(text)
                if size >= chunk_bytes:
                    yield b"".join(pieces)
                    pieces, size = [], 0
            pieces.append(b"}")
        pieces.append(b"}")
        yield b"".join(pieces)

    def write(self, fd: int) -> int:
        """Write the snapshot file's bytes to ``fd`` (a new file) piece by piece; the checksum, known only at the
        end, is written into the place kept for it. Returns the file's size."""
        digest = hashlib.sha256(PREFIX)
        head = PREFIX + _CHECKSUM_KEY + b"0" * 64 + b'",'
        write_all(fd, head)
        size = len(head)
        for part in self.parts():
            digest.update(part)
            write_all(fd, part)
            size += len(part)
        os.pwrite(fd, digest.hexdigest().encode(), len(PREFIX) + len(_CHECKSUM_KEY))
        return size

    def encode(self) -> bytes:
        """The snapshot file's bytes at once (a backup, a recovery): the same as ``encode`` of the whole database,
        from kept encodings."""
        return stamp(PREFIX + b"".join(self.parts()))
