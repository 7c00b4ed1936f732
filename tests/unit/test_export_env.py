"""What of the submitting shell a job takes (``--export``, as sbatch's), what never, and what the lab may say."""

from __future__ import annotations

import pytest

from labq.models.job import FAILED_NOTE, Job, JobSpec, JobState
from labq.models.notify import NotifyEvent, job_notices
from labq.models.transitions import exited, out_of_memory, running
from labq.protocol.codec import HIDDEN, encode_job, hide_env
from labq.protocol.errors import ApiError
from labq.protocol.submit import exported, never_exported, parse_submit

SHELL = {"PATH": "/home/a/env/bin:/usr/bin", "VIRTUAL_ENV": "/home/a/env", "WANDB_API_KEY": "k",
         "LABQ_TOKEN": "secret", "SSH_AUTH_SOCK": "/tmp/ssh", "DBUS_SESSION_BUS_ADDRESS": "unix:x", "HOME": "/home/a",
         "BASH_FUNC_ml%%": "() { :; }", "DISPLAY": ":0", "PWD": "/home/a/proj"}


@pytest.mark.parametrize(("text", "taken"), [
    (None, {"PATH": "/home/a/env/bin:/usr/bin", "VIRTUAL_ENV": "/home/a/env", "WANDB_API_KEY": "k"}),
    ("ALL", {"PATH": "/home/a/env/bin:/usr/bin", "VIRTUAL_ENV": "/home/a/env", "WANDB_API_KEY": "k"}),
    ("all,X=1", {"PATH": "/home/a/env/bin:/usr/bin", "VIRTUAL_ENV": "/home/a/env", "WANDB_API_KEY": "k", "X": "1"}),
    ("NONE", {}),
    ("PATH,X=a=b", {"PATH": "/home/a/env/bin:/usr/bin", "X": "a=b"}),
])
def test_export_takes_what_sbatch_would_and_never_a_credential(text, taken):
    assert exported(text, SHELL) == taken


@pytest.mark.parametrize(("text", "words"), [
    ("SSH_AUTH_SOCK", "never exported"), ("LABQ_TOKEN", "never exported"), ("NONE,PATH", "takes no names"),
    ("NOPE", "not set in this shell"), ("1X", "not a variable's name"), (",", "needs ALL, NONE or names"),
])
def test_a_bad_export_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        exported(text, SHELL)


def test_the_leader_refuses_a_credential_or_an_environment_for_a_container():
    with pytest.raises(ApiError, match="SSH_AUTH_SOCK: never exported") as err:
        parse_submit({"command": ["x"], "environment": {"SSH_AUTH_SOCK": "/tmp/s"}})
    assert err.value.field == "environment"
    with pytest.raises(ApiError, match="environment is for process jobs"):
        parse_submit({"command": ["x"], "image": "a:1", "environment": {"A": "1"}})
    with pytest.raises(ApiError, match="export"):
        parse_submit({"command": ["x"], "export": "NONE,A"})
    assert never_exported("DBUS_SYSTEM_BUS_ADDRESS") and not never_exported("CONDA_PREFIX")


def test_the_lab_may_export_nothing_unless_the_job_asks():
    sent = {"command": ["x"], "environment": {"A": "1"}}
    assert parse_submit(sent).spec_for("a", default_export="NONE").environment == ()
    assert parse_submit(sent).spec_for("a").environment == (("A", "1"),)
    asked = {**sent, "export": "ALL"}
    assert parse_submit(asked).spec_for("a", default_export="NONE").environment == (("A", "1"),)


def test_exported_values_are_hidden_as_env_values_are():
    job = Job(1, JobSpec("a", ("x",), env=(("K", "v"),), environment=(("WANDB_API_KEY", "k"),)), 0.0)
    hidden = hide_env(encode_job(job))["spec"]
    assert hidden["env"] == {"K": HIDDEN} and hidden["environment"] == {"WANDB_API_KEY": HIDDEN}


def test_why_an_attempt_ended_is_in_the_note_and_the_failure_notice():
    job = running(Job(3, JobSpec("a", ("python",), memory_mib=32768), 0.0, state=JobState.STARTING), 1.0)
    why = "cannot start 'python' on ws2: not on PATH=/home/a/env/bin; is /home/a/env/bin on ws2?"
    failed = exited(job, 127, 2.0, why=why)
    assert failed.state is JobState.FAILED and failed.note == f"{FAILED_NOTE}{why}"
    [notice] = job_notices(job, failed, {NotifyEvent.FAIL})
    assert notice.reason == why and notice.headline().endswith(f"failed (exit 127): {why}")
    oom = exited(job, 137, 2.0, why=out_of_memory(job, 32666))
    assert oom.note.endswith("out of memory (the kernel killed it): used 31.9 GiB of --mem 32.0 GiB; ask for more "
                             "with --mem")
