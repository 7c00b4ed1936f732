"""Giving one more user access to a file or folder the agent owns, by POSIX ACL, without root.

An agent that is not root cannot hand a job's user a folder (``chown``), but the owner of a file may always
change its ACL. A Slurm node whose agent submits through ``sudo -u USER`` uses this for what the job's user must
reach: the attempt's folder and log, and the checkpoint folder. The ACL is written as the kernel keeps it (the
``system.posix_acl_access`` and ``system.posix_acl_default`` attributes), so no ``setfacl`` is needed.

Entries already there are kept: granting is adding (or replacing) one user's entry.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
_ACCESS, _DEFAULT = "system.posix_acl_access", "system.posix_acl_default"

Entry = tuple[int, int, int]  #: (tag, permission bits rwx as 4 2 1, id)


def grant(path: str | os.PathLike, uid: int, perm: int, *, inherit_to: tuple[int, ...] = ()) -> None:
    """Let user ``uid`` have ``perm`` (rwx as 4 2 1) on ``path``, besides whoever has it now. With ``inherit_to``
    (a folder), what is made in it later gives those users rwx as well (a default ACL): the folder's owner can
    still clean up what the job's user leaves there. ``OSError`` where the file system takes no ACLs
    (``ENOTSUP``) or the agent does not own ``path`` (``EPERM``)."""
    mode = os.stat(path).st_mode
    entries = _read(path, _ACCESS) or _from_mode(mode)
    os.setxattr(path, _ACCESS, _encode(_with_user(entries, uid, perm)))
    if inherit_to and stat.S_ISDIR(mode):
        default = _read(path, _DEFAULT) or [(_USER_OBJ, 7, _NO_ID), (_GROUP_OBJ, 0, _NO_ID), (_OTHER, 0, _NO_ID)]
        for user in inherit_to:
            default = _with_user(default, user, 7)
        os.setxattr(path, _DEFAULT, _encode(default))


def revoke_all(path: str | os.PathLike) -> None:
    """Take back every grant on ``path``: only its mode counts again, its group bits the owning group's own (while
    an ACL is there they show its mask)."""
    entries = _read(path, _ACCESS)
    if not entries:
        return
    group = next((bits for tag, bits, _ in entries if tag == _GROUP_OBJ), 0)
    os.removexattr(path, _ACCESS)
    os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & ~0o070 | group << 3)


def granted(path: str | os.PathLike, uid: int) -> int | None:
    """The permission bits user ``uid``'s own entry gives on ``path`` (the mask applied); None if it has none."""
    entries = _read(path, _ACCESS)
    mask = next((bits for tag, bits, _ in entries if tag == _MASK), 7)
    return next((bits & mask for tag, bits, who in entries if tag == _USER and who == uid), None)


def _from_mode(mode: int) -> list[Entry]:
    return [(_USER_OBJ, (mode >> 6) & 7, _NO_ID), (_GROUP_OBJ, (mode >> 3) & 7, _NO_ID), (_OTHER, mode & 7, _NO_ID)]


def _with_user(entries: list[Entry], uid: int, perm: int) -> list[Entry]:
    """``entries`` with ``uid``'s entry set to ``perm`` and the mask widened to let it through."""
    kept = [e for e in entries if not (e[0] == _USER and e[2] == uid) and e[0] != _MASK]
    kept.append((_USER, perm, uid))
    mask = 0
    for tag, bits, _ in kept:  # the group class, as setfacl works it out
        if tag in (_USER, _GROUP, _GROUP_OBJ):
            mask |= bits
    return sorted([*kept, (_MASK, mask, _NO_ID)], key=lambda e: (e[0], e[2]))


def _read(path: str | os.PathLike, name: str) -> list[Entry]:
    try:
        raw = os.getxattr(path, name)
    except OSError as err:
        if err.errno in (errno.ENODATA, errno.ENOTSUP):  # no ACL beyond the mode; none taken: setxattr says so
            return []
        raise
    version, = struct.unpack_from("<I", raw)
    if version != _VERSION:
        raise OSError(f"{os.fspath(path)}: an ACL of version {version}, not {_VERSION}")
    return [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]


def _encode(entries: list[Entry]) -> bytes:
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def let_reach(path: str | os.PathLike, uid: int, *, below: str | os.PathLike | None = None) -> str | None:
    """Let user ``uid`` pass through every folder above ``path`` (those inside ``below`` alone, if given) that the
    agent owns and others may not pass (``--x`` for it alone). Returns the first folder above that stops it and is
    not the agent's to open, else None."""
    me = os.geteuid()
    top = os.path.abspath(below) if below is not None else None
    for folder in _parents(os.path.abspath(path)):
        if top is not None and not folder.startswith(top + os.sep):
            break
        st = os.stat(folder)
        if st.st_mode & stat.S_IXOTH or st.st_uid == uid:
            continue
        if st.st_uid != me:
            return folder
        if (granted(folder, uid) or 0) & 1 == 0:
            grant(folder, uid, 1)
    return None


def _parents(path: str) -> list[str]:
    """The folders above ``path``, nearest first."""
    found = []
    while (parent := os.path.dirname(path)) != path:
        found.append(parent)
        path = parent
    return found
