"""One fixture runs the store suite against the TinyDB store and the in-memory store."""

from __future__ import annotations

from pathlib import Path

import pytest

from labq.store import MemoryStore, PutJob, TinyDBStore


class StoreFactory:
    """Opens a store; ``reopen`` closes it and opens it again, as a leader restart does."""

    def __init__(self, kind: str, folder) -> None:
        self.kind = kind
        self.folder = folder
        self.current = None

    def open(self):
        self.current = TinyDBStore(self.folder) if self.kind == "tinydb" else MemoryStore()
        return self.current

    def reopen(self):
        if self.kind == "memory":
            return self.current  # nothing survives a memory store's process; a restart keeps the object
        self.current.close()
        return self.open()

    def close(self) -> None:
        if self.current is not None:
            self.current.close()


@pytest.fixture(params=["tinydb", "memory"])
def stores(request, tmp_path):
    factory = StoreFactory(request.param, tmp_path / "data")
    yield factory
    factory.close()


@pytest.fixture
def store(stores):
    return stores.open()


def job(job_id: int, state: str = "queued", **extra) -> dict:
    return {"id": job_id, "state": state, "spec": {"user": extra.pop("user", "alice"), "gpus": 1}, **extra}


def small_lab(folder):
    """A data folder of two commits: jobs 1 and 2 queued, then 1 finished (archived) and 3 queued."""
    with TinyDBStore(folder) as store:
        store.commit([PutJob(job(1)), PutJob(job(2))])
        store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0)), PutJob(job(3))])
    return folder


def stored(folder) -> bytes:
    """Everything a store in ``folder`` holds: its snapshot and its journals, in order (a change to either shows)."""
    from labq.store.journal import journal_files
    from labq.store.tinydb_store import DB_NAME

    folder = Path(folder)
    return (folder / DB_NAME).read_bytes() + b"".join(path.read_bytes() for _, path in journal_files(folder))
