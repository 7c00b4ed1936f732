"""Durable persistence of the leader's state (labq.store).

``TinyDBStore`` is what the leader uses; ``MemoryStore`` keeps the same rules
in memory for the simulator and demos. Both implement ``Store``.
"""

from labq.store.contract import (
    Change, CommitFailed, CorruptDatabase, DeleteJob, DeleteRecord, Ended, HistoryPart, InvalidChange, PutJob,
    PutRecord, PutTasks, SchemaMismatch, Staged, Store, StoredState, StoreError, StoreLocked, month_at,
)
from labq.store.memory import MemoryStore
from labq.store.recovery import RecoveryPlan, plan_recovery, recover
from labq.store.tinydb_store import TinyDBStore, collector_paused

__all__ = [
    "Change", "CommitFailed", "CorruptDatabase", "DeleteJob", "DeleteRecord", "Ended", "HistoryPart", "InvalidChange",
    "MemoryStore",
    "PutJob", "PutRecord", "PutTasks", "RecoveryPlan", "SchemaMismatch", "Staged", "Store", "StoreError", "StoreLocked",
    "StoredState",
    "TinyDBStore", "collector_paused", "month_at", "plan_recovery", "recover",
]
