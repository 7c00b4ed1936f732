"""Which local account runs each lab user's jobs on this machine, as the agent reports it to the leader.

An agent running as root runs a job as the Unix account named like the job's lab user; an agent
running as anyone else runs every job as its own account. An admin maps lab users whose account here
has another name, or keeps a user's jobs off this machine, in the agent's user map: the file
``user-map.toml`` in the agent's state folder (``labq agent --state-dir``; by default
``DATA/agents/NODE/``)::

    # lab user = the account that runs their jobs on this machine; "" keeps their jobs off it
    [users]
    alice = "asmith"
    guest = ""

The map is read again whenever the file changes, so an edit takes effect at the next sync. A map that
cannot be read keeps every job off this machine, and says why, rather than run jobs as the wrong account.
Lookups are trusted for ``RECHECK_S``: an account made (or removed) since is seen within that time.
"""

from __future__ import annotations

import os
import pwd
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path

from labq.models.node import Account

USER_MAP_FILE = "user-map.toml"
RECHECK_S = 30.0
NO_SUCH_USER = "no such user on this machine"


class UserMapError(ValueError):
    pass


def load_user_map(path: Path) -> dict[str, str]:
    """The ``[users]`` table of ``path``: lab user -> local account ("" keeps the user off this machine);
    an empty map when there is no such file."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserMapError(f"the user map {path} cannot be read: {err}") from None
    users = doc.get("users", {})
    unknown = sorted(set(doc) - {"users"})
    if unknown or not isinstance(users, dict):
        raise UserMapError(f"the user map {path} must hold one [users] table of lab user = \"account\"")
    bad = [user for user, login in users.items() if not isinstance(login, str)]
    if bad:
        raise UserMapError(f"the user map {path}: {bad[0]} must name an account in quotes (\"\" keeps it off)")
    return dict(users)


class Accounts:
    """Resolves lab users to local accounts, with the admin's user map, for launches and for reports."""

    def __init__(self, user_map: Path, *, run_as_job_user: bool,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.user_map = user_map
        self.run_as_job_user = run_as_job_user  #: False: every job runs as the agent's own account
        self.monotonic = monotonic
        self._map: dict[str, str] = {}
        self._map_error: str | None = None
        self._map_stamp: tuple | None = None
        self._known: dict[str, tuple[Account, float]] = {}
        self._lock = threading.Lock()

    def resolve(self, user: str) -> Account:
        """How this machine runs ``user``'s jobs now: the local account, or the problem (``Account.problem``)."""
        with self._lock:
            self._read_map()
            known = self._known.get(user)
            if known is not None and self.monotonic() - known[1] < RECHECK_S:
                return known[0]
            account = self._look_up(user)
            self._known[user] = (account, self.monotonic())
            return account

    def report(self, users: Iterable[str]) -> tuple[Account, ...]:
        """The accounts of ``users`` (the lab's, as the leader last said), for the next sync."""
        users = sorted(set(users))
        with self._lock:
            for gone in set(self._known) - set(users):
                del self._known[gone]
        return tuple(self.resolve(user) for user in users)

    def lab_user_of(self, uid: int) -> str:
        """The lab user that the local account ``uid`` is, for the local socket: the user the admin's map gives
        this account to, else the account's own name unless the map gives that lab user another account here.
        ``LookupError`` with a sentence otherwise."""
        try:
            login = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise LookupError(f"uid {uid} has no name on this machine") from None
        with self._lock:
            self._read_map()
            if self._map_error:
                raise LookupError(self._map_error)
            named = sorted(user for user, account in self._map.items() if account == login)
            mapped = self._map.get(login)
        if len(named) > 1:
            raise LookupError(f"the user map {self.user_map} gives account {login} to several lab users "
                              f"({', '.join(named)}): log in to the leader with your token instead")
        if named:
            return named[0]
        if mapped:  # "" keeps the user's jobs off this machine, and says nothing against who they are
            raise LookupError(f"the user map {self.user_map} gives lab user {login} the account {mapped} here, "
                              f"not {login}")
        return login

    def forget(self, user: str) -> None:
        """Look ``user`` up again next time: a launch found their account other than it was."""
        with self._lock:
            self._known.pop(user, None)

    def describe(self) -> str:
        """The user map in a few words, for the agent's start-up line."""
        with self._lock:
            self._read_map()
            if self._map_error:
                return self._map_error
            return f"user map {self.user_map}: {len(self._map)} user(s)" if self._map else ""

    def _read_map(self) -> None:
        """Read the map again if its file changed (the lock is held); forget every lookup then."""
        try:
            st = os.stat(self.user_map)
            stamp: tuple | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._map_stamp:  # None at first: no file, an empty map
            return
        self._map_stamp = stamp
        self._known.clear()
        try:
            self._map, self._map_error = load_user_map(self.user_map), None
        except UserMapError as err:
            self._map, self._map_error = {}, str(err)

    def _look_up(self, user: str) -> Account:
        if self._map_error:
            return Account(user, problem=self._map_error)
        if not self.run_as_job_user:
            uid = os.geteuid()
            try:
                login = pwd.getpwuid(uid).pw_name
            except KeyError:  # a container's uid without a passwd entry
                login = os.environ.get("USER", str(uid))
            return Account(user, login, uid, os.getegid())
        login = self._map.get(user, user)
        if not login:
            return Account(user, problem=f"the agent's user map {self.user_map} keeps {user}'s jobs off this machine")
        try:
            pw = pwd.getpwnam(login)
        except KeyError:
            return Account(user, problem=NO_SUCH_USER if login == user else
                           f"the agent's user map names account {login!r}, and there is no such user on this machine")
        return Account(user, pw.pw_name, pw.pw_uid, pw.pw_gid)
