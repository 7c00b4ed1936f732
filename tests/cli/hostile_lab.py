"""A lab whose database carries names with control characters and markup, as an old database may.

The leader's API refuses such names now; a database written before it did still has them, and so
may reach every screen. ``make_hostile`` takes a lab with its leader started, makes a few jobs, a
node (agent ``ws1``), a reservation and a user through the API, stops the leader and rewrites their
names in its TinyDB store with the store's own ``commit``, then starts the leader again on that
database. The agent stays away: its node, renamed, goes down.
"""

from __future__ import annotations

import copy
import hashlib
import signal
import unicodedata
from dataclasses import dataclass

from labq.store import TinyDBStore
from labq.store.contract import DeleteRecord, PutJob, PutRecord
from tests.e2e.conftest import Lab

#: a row splitter, a screen clearer, markup and a bidi override, in one job name
NAME = "evil\n\x1b[2J[red]boom[/red]\u202egnp"
USER = "alice\r\x1b]0;pwned\x07"  #: carriage return and a window-title sequence
NODE = "ws\n\x1b[31mx\x9b"  #: a newline, a color and a one-byte C1 CSI
RESERVATION = "paper\x08\x08\u200b[bold]r"  #: backspaces, a zero-width space and markup
COMMAND = ["sh", "-c", "echo hi\x1b[H\x7f"]
ENV_VALUE = "v\n\x1b[5mblink"
WORKDIR = "/tmp/\x1b[Hw"
GPU_MODEL = "RTX\x1b[2J 3090"
ARCHIVED = "old\u2028\x1b[1mjob"  #: a finished job's name, in the archive
USER_TOKEN = "lq_hostile-user-token"  #: USER's token, to be USER


@dataclass
class HostileJobs:
    running: int  #: NAME, USER, COMMAND, ENV_VALUE, WORKDIR; placed on NODE
    waiting: int  #: USER, in RESERVATION (which USER may not use): its pending reason quotes both
    finished: int  #: ARCHIVED, succeeded


def make_hostile(lab: Lab) -> HostileJobs:
    """``lab``: a leader, and no agent yet. The jobs are held before any node could run them (nothing
    here needs a process to run), then given their states in the store."""
    running = lab.submit("sleep", "300", name="victim", env="FOO=bar")
    waiting = lab.submit("sleep", "300", name="waiter")
    finished = lab.submit("sleep", "300", name="done")
    lab.labq("hold", str(running), str(waiting), str(finished))
    lab.start_agent("ws1")
    lab.labq("reserve", "--gpus", "1", "--start", "in 1d", "--for", "1d", "--name", "paper")
    for proc in (lab.agents.pop("ws1"), lab.leader):
        lab.kill(proc, signal.SIGTERM)

    store = TinyDBStore(lab.data)
    try:
        state = store.load()
        changes = []
        job = copy.deepcopy(state.jobs[running])
        job["spec"].update(name=NAME, user=USER, command=COMMAND, env={"FOO": ENV_VALUE}, workdir=WORKDIR)
        uuid = state.records["agents"]["ws1"]["node"]["gpus"][0]["uuid"]
        job.update(state="running", started_at=job["submitted_at"] + 1, placement={"allocations": [
            {"node": NODE, "gpu_indices": [0], "gpu_uuids": [uuid], "score": 0}]})
        changes.append(PutJob(job))
        job = copy.deepcopy(state.jobs[waiting])
        job["spec"].update(user=USER, reservation=RESERVATION)
        job["state"] = "queued"
        changes.append(PutJob(job))
        job = copy.deepcopy(state.jobs[finished])
        job["spec"]["name"] = ARCHIVED
        job.update(state="succeeded", ended_at=job["submitted_at"] + 60, exit_code=0)
        changes.append(PutJob(job))

        agent = copy.deepcopy(state.records["agents"]["ws1"])
        agent["node"]["name"] = NODE
        agent["node"]["gpus"][0]["model"] = GPU_MODEL
        changes += [DeleteRecord("agents", "ws1"), PutRecord("agents", NODE, agent)]
        booking = copy.deepcopy(state.records["reservations"]["paper"])
        booking.update(name=RESERVATION, node=NODE, note=f"re-pinned from {NODE}")
        changes += [DeleteRecord("reservations", "paper"), PutRecord("reservations", RESERVATION, booking)]
        admin = next(iter(state.records["users"].values()))
        changes.append(PutRecord("users", USER, {**admin, "admin": False,
                                                  "token_sha256": hashlib.sha256(USER_TOKEN.encode()).hexdigest()}))
        store.commit(changes)
    finally:
        store.close()
    lab.start_leader()
    lab.wait(lambda: lab.api("why", str(waiting))["pending"], "the scheduler to say why the waiting job waits")
    return HostileJobs(running, waiting, finished)


def raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (or hide), but for the line breaks between lines."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
