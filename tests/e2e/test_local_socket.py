"""No token on a lab's machines: the agent's local socket vouches for the caller's Unix account.

Real leader and agent processes; two real Unix accounts made by the test (``useradd``, removed after). Each
person's ``labq`` runs in a process of its own that has dropped to that account (a fork that calls
``setuid``, then labq's CLI, as ``runuser`` would: this machine's Python lives in a folder only root may
enter, so the test's process forks rather than executes a new one). The kernel tells the agent who
connected; nothing a process sends can change that.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(150)

TLS_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "127.0.0.1:0"\ntls = "on"\n')


@pytest.fixture
def accounts():
    """Two Unix accounts that exist only for this test."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the local socket test needs root and useradd (CI runs as root)")
        pytest.skip("needs root and useradd")
    names = [f"lq{secrets.token_hex(3)}" for _ in range(2)]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True, timeout=30)
    try:
        yield [pwd.getpwnam(name) for name in names]
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)


def as_account(account: pwd.struct_passwd, socket_path: Path, *args: str, raw: bytes | None = None):
    """Run ``labq ARGS`` (or send ``raw`` bytes on the socket) in a child process that is ``account``:
    (exit status, stdout, stderr)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the account, then be its labq
        code = 70
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - pytest's capture is not this process's
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            for key in [k for k in os.environ if k.startswith("LABQ_")]:
                del os.environ[key]
            os.environ.update(HOME="/nonexistent", XDG_CONFIG_HOME="/nonexistent/.config",
                              LABQ_SOCKET=str(socket_path))
            if raw is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(30)
                sock.connect(str(socket_path))
                sock.sendall(raw)
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                os.write(1, b"".join(chunks))
                code = 0
            else:
                from labq.cli import main

                code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException as err:  # noqa: BLE001 - the child says what went wrong, then exits
            os.write(2, f"child failed: {type(err).__name__}: {err}".encode())
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        stdout, stderr = out.read(), err.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout.decode(errors="replace"), stderr.decode(errors="replace")


@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path / "lab", TLS_CONFIG)
    yield made
    made.close()


@pytest.fixture
def socket_dir():
    folder = Path(tempfile.mkdtemp(prefix="labq-sock-"))
    folder.chmod(0o755)  # every account may reach the socket in it
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_agent_with_socket(lab: Lab, path: Path) -> None:
    lab.agents["ws1"] = lab._spawn(["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", "ws1",
                                    "--data-dir", str(lab.data), "--local-socket", str(path)], "agent-ws1.log")
    lab.wait(lambda: answers(path) and any(n["name"] == "ws1" and n["health"] == "up" for n in lab.api("nodes")),
             "the agent to join and serve its local socket")


def answers(path: Path) -> bool:
    """Whether an agent listens on the socket at ``path`` (a file alone may be a dead agent's)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def test_two_people_on_one_workstation_use_the_queue_without_tokens_each_as_their_own_account(
        lab, accounts, socket_dir):
    alice, bob = accounts
    lab.start_leader()
    lab.labq("admin", "user", "add", alice.pw_name, "--print")
    lab.labq("admin", "user", "add", bob.pw_name, "--admin", "--print")
    path = socket_dir / "agent.sock"
    start_agent_with_socket(lab, path)
    assert path.stat().st_mode & 0o777 == 0o666

    code, out, err = as_account(alice, path, "whoami")
    assert code == 0, err
    assert out.strip() == f"{alice.pw_name} via the agent of ws1 (unix:{path})"
    code, out, err = as_account(alice, path, "submit", "--json", "--", "sleep", "60")
    assert code == 0, err
    job_id = json.loads(out)["id"]
    assert lab.job(job_id)["spec"]["user"] == alice.pw_name
    trail = [json.loads(line) for line in
             lab.labq("events", "--json", "--job", str(job_id), "--kind", "user").stdout.splitlines()]
    assert [(e["action"], e["user"], e.get("via"), e.get("token")) for e in trail] == [
        ("submit", alice.pw_name, "ws1", None)]  # the audit trail says how she came: ws1's agent vouched
    code, out, err = as_account(bob, path, "ls", "--json")
    assert code == 0 and json.loads(out) == [], (out, err)  # bob's own queue: empty
    code, _, err = as_account(bob, path, "cancel", str(job_id))
    assert code == 1 and "belongs to" in err, err  # a refusal: bob has a user's rights, not alice's
    code, out, _ = as_account(bob, path, "whoami")
    assert code == 0 and "(admin)" not in out  # an admin's rights need the admin's own token
    code, _, err = as_account(bob, path, "admin", "user", "ls")
    assert code == 1 and "only admins" in err, err
    code, _, err = as_account(alice, path, "cancel", str(job_id))
    assert code == 0, err
    assert lab.wait_state(job_id, "cancelled", "failed")["state"] == "cancelled"  # its agent stops it first


def test_what_a_process_sends_cannot_change_who_the_agent_vouches_for(lab, accounts, socket_dir):
    alice, bob = accounts
    lab.start_leader()
    lab.labq("admin", "user", "add", alice.pw_name, "--print")  # bob is no lab user
    admin_token = lab.root.joinpath("home/.config/labq/credentials").read_text().split('token = "')[1].split('"')[0]
    path = socket_dir / "agent.sock"
    start_agent_with_socket(lab, path)
    forged = (f"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin_token}\r\n"
              f"X-Labq-User: root\r\nX-Labq-User: {bob.pw_name}\r\n\r\n").encode()
    code, out, _ = as_account(alice, path, raw=forged)
    assert code == 0 and out.startswith("HTTP/1.1 200"), out
    answer = json.loads(out.split("\r\n\r\n", 1)[1])
    assert answer == {"user": alice.pw_name, "kind": "user", "admin": False, "via": "ws1"}
    code, _, err = as_account(bob, path, "whoami")
    assert code == 3 and f"{bob.pw_name} (on ws1) is not a labq user" in err, err
    assert "Traceback" not in err
    nobody = pwd.getpwnam("nobody")
    code, _, err = as_account(nobody, path, "submit", "--", "true")
    assert code == 3 and "not a labq user" in err, err

    # straight to the leader: only an agent's token may vouch
    alice_token = lab.labq("admin", "user", "add", alice.pw_name, "--print").stdout.split("--token ")[1].split()[0]
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    for token in (alice_token, admin_token):
        request = urllib.request.Request(f"{lab.url}/v1/whoami", headers={"Authorization": f"Bearer {token}",
                                                                           "X-Labq-User": bob.pw_name})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=10)
        assert refused.value.code == 403


def test_a_socket_of_an_agent_that_died_is_taken_over_and_one_that_serves_is_not(lab, socket_dir):
    lab.start_leader()
    path = socket_dir / "agent.sock"
    start_agent_with_socket(lab, path)
    second = lab._spawn(["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", "ws2",
                         "--data-dir", str(lab.data), "--local-socket", str(path)], "agent-ws2.log")
    lab.wait(lambda: any(n["name"] == "ws2" and n["health"] == "up" for n in lab.api("nodes")), "ws2 to join")
    assert "another labq agent serves" in (lab.root / "agent-ws2.log").read_text()
    lab.kill(lab.agents["ws1"])  # kill -9: its socket file stays behind
    lab.kill(second)
    assert path.exists() and not answers(path)
    start_agent_with_socket(lab, path)  # a new agent takes over the dead one's socket
    code = subprocess.run([sys.executable, "-m", "labq.cli", "whoami"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in lab.env(LABQ_SOCKET=str(path)).items()
                               if k not in ("HOME", "XDG_CONFIG_HOME")} | {"HOME": str(socket_dir)})
    assert code.returncode == 0 and "via the agent of ws1" in code.stdout, code.stderr
