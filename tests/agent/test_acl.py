"""``labq.agent.acl``: granting a user access by POSIX ACL, on real files (this machine's file system takes ACLs;
under CI a file system that does not is a failure, elsewhere a skip)."""

from __future__ import annotations

import os
import stat

import pytest

from labq.agent import acl
from tests.conftest import unavailable


@pytest.fixture
def folder(tmp_path):
    probe = tmp_path / "probe"
    probe.touch()
    try:
        acl.grant(probe, 4242, 4)
    except OSError as err:
        unavailable("POSIX ACLs", f"{tmp_path}'s file system takes none: {err}")
    made = tmp_path / "attempt"
    made.mkdir(mode=0o700)
    return made


def test_a_grant_adds_one_users_entry_and_keeps_the_others(folder):
    log = folder / "log"
    log.touch(mode=0o600)
    acl.grant(log, 4242, 6)
    acl.grant(log, 4343, 4)
    assert (acl.granted(log, 4242), acl.granted(log, 4343), acl.granted(log, 4444)) == (6, 4, None)
    acl.grant(log, 4242, 4)  # granting again replaces that user's entry
    assert (acl.granted(log, 4242), acl.granted(log, 4343)) == (4, 4)
    mode = stat.S_IMODE(os.stat(log).st_mode)
    assert mode & 0o707 == 0o600  # the owner and everyone else are as they were; the group bits show the mask
    acl.revoke_all(log)
    assert (acl.granted(log, 4242), acl.granted(log, 4343)) == (None, None)
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600  # the mask's bits do not stay as the group's
    acl.revoke_all(log)  # none left: nothing to do


def test_what_is_made_in_a_folder_later_inherits_the_grant(folder):
    acl.grant(folder, 4242, 7, inherit_to=(4242, os.geteuid()))
    assert acl.granted(folder, 4242) == 7
    (folder / "ckpt").mkdir()
    (folder / "ckpt" / "step-1.pt").write_bytes(b"w")
    assert acl.granted(folder / "ckpt", 4242) == 7
    assert acl.granted(folder / "ckpt" / "step-1.pt", 4242) is not None


def test_reach_opens_the_agents_own_folders_above_and_names_one_it_cannot(tmp_path, folder):
    inner = folder / "a" / "b"
    inner.mkdir(parents=True)
    (folder / "a").chmod(0o700)
    (folder / "a" / "b").chmod(0o711)  # others may pass this one already: left as it is
    assert acl.let_reach(inner / "log", 4242, below=tmp_path) is None
    assert acl.granted(folder / "a", 4242) == 1 and acl.granted(folder, 4242) == 1
    assert acl.granted(inner, 4242) is None
    assert acl.granted(tmp_path, 4242) is None  # not below tmp_path: not touched
    if os.geteuid() != 0:
        return  # making a folder someone else owns needs root
    foreign = tmp_path / "theirs"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 4343, 4343)
    (foreign / "x").mkdir()
    assert acl.let_reach(foreign / "x" / "file", 4242, below=tmp_path) == str(foreign)
