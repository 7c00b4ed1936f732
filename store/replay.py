"""Reading what a store loads: the snapshot, then the journal records after it, and what they say of the archive.

Only a torn last record (a crash mid-append, never acknowledged) is left out; any other damage, or a gap
between the snapshot and the journals, is CorruptDatabase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labq.store.archive import encode_line
from labq.store.contract import CorruptDatabase
from labq.store.data_folder import DB_NAME
from labq.store.hot import HotState
from labq.store.journal import JournalDamaged, journal_files, read_journal
from labq.store.snapshot import decode


@dataclass
class Journaled:
    """What the journals say of the archive: after commit ``after``, its lines are exactly ``lines`` (file name,
    line), in commit order. ``after`` is the snapshot's commit, or the last commit of an older labq's record
    after it (which carries no lines: that labq fsynced them in the archive's files)."""

    after: int = 0
    lines: list[tuple[str, bytes]] = field(default_factory=list)

    def take(self, record: dict) -> None:
        """A record replayed after the last one taken."""
        if "archive" not in record:
            self.after, self.lines = record["seq"], []
        else:
            self.lines += [(name, encode_line(line)) for name, line in record["archive"]]


def replay(hot: HotState, journals: list[tuple[int, Path]], snapshot: Path,
           journaled: Journaled | None = None) -> int | None:
    """Apply the records after ``hot``'s commit from ``journals``; the sound length of the last journal (where a
    torn tail starts), None when there are none. Raises CorruptDatabase for damage or a gap. ``journaled``: takes
    in the archive lines the records carry (its ``after`` set to ``hot``'s commit first)."""
    good_bytes = None
    if journaled is not None:
        journaled.after, journaled.lines = hot.seq, []
    for number, (_, path) in enumerate(journals):
        try:
            read = read_journal(path, last=number == len(journals) - 1)
        except JournalDamaged as err:
            raise CorruptDatabase(str(err)) from None
        for record in read.records:
            if record["seq"] <= hot.seq:
                continue
            if record["seq"] != hot.seq + 1:
                raise CorruptDatabase(f"{path} goes on from commit {record['seq']}, but {snapshot} and the journals "
                                      f"before it end at commit {hot.seq}: commits are missing")
            hot.take(record)
            if journaled is not None:
                journaled.take(record)
        good_bytes = read.good_bytes
    return good_bytes


def read_state(data_dir: Path, journaled: Journaled | None = None) -> HotState:
    """What a store opened on ``data_dir`` would load, read only and beside a running leader: the snapshot and
    the journals after it, a record being appended left out. Raises CorruptDatabase or SchemaMismatch.
    ``journaled``: takes in what the journals say of the archive (``replay``)."""
    path = data_dir / DB_NAME
    for attempt in range(5):
        hot = HotState(decode(path.read_bytes(), path))
        journals = journal_files(data_dir)
        try:
            replay(hot, journals, path, journaled)
            return hot
        except (FileNotFoundError, CorruptDatabase):
            if attempt == 4 or journal_files(data_dir) == journals:
                raise  # no compaction changed the files meanwhile: the damage is real
    raise AssertionError("unreachable")
