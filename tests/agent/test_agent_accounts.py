"""How an agent maps the lab's users to this machine's accounts: by name, or by the admin's user map.

Real passwd lookups: ``root`` and ``nobody`` exist on every machine this suite runs on, and names like
``nouser-…`` on none.
"""

from __future__ import annotations

import os
import pwd

import pytest

from labq.agent.accounts import NO_SUCH_USER, Accounts, UserMapError, load_user_map
from labq.agent.faults import ProblemBook, sentence
from labq.models.node import Account, NodeProblem

NOBODY = pwd.getpwnam("nobody")
ROOT = pwd.getpwnam("root")


@pytest.fixture
def user_map(tmp_path):
    return tmp_path / "user-map.toml"


def write(path, text: str) -> None:
    """Write ``text``, and make sure the file looks changed even within one mtime tick."""
    before = path.stat().st_size if path.exists() else -1
    path.write_text(text + (" " if len(text.encode()) == before else ""))


def test_a_root_agent_runs_each_user_as_the_account_of_the_same_name(user_map):
    accounts = Accounts(user_map, run_as_job_user=True)
    assert accounts.resolve("nobody") == Account("nobody", "nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert accounts.resolve("root") == Account("root", "root", ROOT.pw_uid, ROOT.pw_gid)
    assert accounts.resolve("nouser-0a1b2c") == Account("nouser-0a1b2c", problem=NO_SUCH_USER)
    assert accounts.report(["root", "nouser-0a1b2c", "root"]) == (
        Account("nouser-0a1b2c", problem=NO_SUCH_USER), Account("root", "root", ROOT.pw_uid, ROOT.pw_gid))


def test_the_user_map_renames_accounts_keeps_users_off_and_says_so(user_map):
    write(user_map, '# lab user = account here\n[users]\nnouser-0a1b2c = "nobody"\nguest = ""\n'
                    'carol = "nouser-ffffff"\n')
    accounts = Accounts(user_map, run_as_job_user=True)
    assert accounts.resolve("nouser-0a1b2c") == Account("nouser-0a1b2c", "nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert accounts.resolve("guest").problem == f"the agent's user map {user_map} keeps guest's jobs off this machine"
    assert accounts.resolve("carol").problem == ("the agent's user map names account 'nouser-ffffff', and there is "
                                                 "no such user on this machine")
    assert accounts.resolve("nobody").login == "nobody"  # users the map does not name keep the default rule
    assert "1 user" not in accounts.describe() and "3 user(s)" in accounts.describe()


def test_an_edit_of_the_user_map_takes_effect_at_once(user_map):
    accounts = Accounts(user_map, run_as_job_user=True)
    assert accounts.resolve("nouser-0a1b2c").problem == NO_SUCH_USER
    write(user_map, '[users]\nnouser-0a1b2c = "nobody"\n')
    assert accounts.resolve("nouser-0a1b2c").login == "nobody"  # no wait for the recheck: the file changed
    write(user_map, '[users]\nnouser-0a1b2c = ""\n')
    assert "keeps nouser-0a1b2c's jobs off" in accounts.resolve("nouser-0a1b2c").problem
    user_map.unlink()
    assert accounts.resolve("nouser-0a1b2c").problem == NO_SUCH_USER


@pytest.mark.parametrize(("text", "words"), [
    ("[users\nalice = 'a'", "cannot be read"),
    ("alice = 'asmith'", "one [users] table"),
    ("[users]\nalice = 1001", "alice must name an account in quotes"),
])
def test_a_user_map_that_cannot_be_read_keeps_every_job_off_and_says_why(user_map, text, words):
    write(user_map, text)
    with pytest.raises(UserMapError, match=words.replace("[", r"\[")):
        load_user_map(user_map)
    accounts = Accounts(user_map, run_as_job_user=True)
    assert words in accounts.resolve("root").problem and str(user_map) in accounts.resolve("nobody").problem
    assert words in accounts.describe()


def test_an_agent_that_is_not_root_runs_every_user_as_its_own_account(user_map):
    accounts = Accounts(user_map, run_as_job_user=False)
    mine = accounts.resolve("nouser-0a1b2c")
    assert (mine.problem, mine.uid, mine.gid) == (None, os.geteuid(), os.getegid())


def test_a_problem_is_reported_until_the_retry_period_after_it_was_last_met():
    book = ProblemBook(retry_s=60.0)
    docker, disk = NodeProblem("docker is not available", runtime="docker"), NodeProblem("disk full")
    book.met(docker, 0.0)
    book.met(disk, 30.0)
    assert book.current(59.0) == (docker, disk)
    book.met(docker, 59.5)  # met again: reported on, now after the disk's
    assert book.current(61.0) == (disk, docker)
    assert book.current(90.0) == (docker,)
    assert book.current(119.5) == ()


def test_a_problem_due_for_retry_is_kept_if_the_node_can_tell_it_is_still_there_and_dropped_if_not():
    book = ProblemBook(retry_s=60.0)
    daemon, image, disk = (NodeProblem("no daemon", runtime="docker"),
                           NodeProblem("no image", runtime="docker", image="a:1"), NodeProblem("disk full"))
    for problem in (daemon, image, disk):
        book.met(problem, 0.0)
    asked = []

    def still_there(problem):
        asked.append(problem)
        return {daemon: True, image: False}.get(problem)  # the disk: cannot tell

    assert book.current(30.0, still_there) == (daemon, image, disk) and asked == []  # none due yet
    assert book.current(60.0, still_there) == (daemon,)
    assert asked == [daemon, image, disk]
    assert book.current(100.0, still_there) == (daemon,)  # met again at 60: not due before 120
    assert len(asked) == 3


def test_a_docker_problem_is_looked_at_where_docker_is_out_of_reach(tmp_path, monkeypatch):
    from labq.agent.runtimes import Runtimes

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # how an admin points at the engine
    (tmp_path / "state").mkdir()
    runtimes = Runtimes(tmp_path / "state", "ws1")
    assert runtimes.still_there(NodeProblem("no daemon", runtime="docker")) is True
    assert runtimes.still_there(NodeProblem("no image", runtime="docker", image="a:1")) is None  # cannot tell
    assert runtimes.still_there(NodeProblem("disk full")) is None


def test_a_problem_is_reported_as_one_printable_line():
    book = ProblemBook()
    book.met(NodeProblem("500 Server Error:\n  OCI runtime failed", runtime="docker"), 0.0)
    assert book.current(1.0) == (NodeProblem("500 Server Error: OCI runtime failed", runtime="docker"),)


def test_a_sentence_is_one_printable_line_short_enough_for_the_wire():
    assert sentence("500 Server Error:\n  OCI runtime\x1b[2J failed") == "500 Server Error: OCI runtime?[2J failed"
    long = sentence("é" * 2000)
    assert len(long.encode()) <= 1000 and long.endswith("...")
