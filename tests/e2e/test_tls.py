"""TLS pinned by the lab's CA: real leaders, agents and CLI processes; a real capture of the loopback traffic.

A leader with ``tls = "on"`` serves HTTPS on loopback, as one listening for other machines does by default
(``tls = "auto"``), so that these tests exercise what crosses a lab's network.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import tomllib

import pytest

from labq.store.replay import read_state
from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(120)

TLS_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "127.0.0.1:0"\ntls = "on"\n')
ETH_P_ALL = 0x0003
SECRET_ENV = "labq-capture-secret-8f2c1e"
LOG_LINE = "labq-capture-log-line-3d9a"


def credentials(lab: Lab) -> dict:
    return tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())


@pytest.fixture
def labs(tmp_path):
    made: list[Lab] = []

    def make(name: str, config: str = TLS_CONFIG) -> Lab:
        made.append(Lab(tmp_path / name, config))
        return made[-1]

    yield make
    for lab in made:
        lab.close()


class Capture:
    """Every packet on the loopback interface while it runs (AF_PACKET: root, as the suite runs in CI)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.packets: list[bytes] = []
        self.running = True
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while self.running:
            try:
                self.packets.append(self.sock.recv(65536))
            except TimeoutError:
                continue
            except OSError:
                return

    def stop(self) -> bytes:
        self.running = False
        self.thread.join(5)
        self.sock.close()
        return b"".join(self.packets)

    def to_port(self, data: bytes, port: int) -> bool:
        return port.to_bytes(2, "big") in data


def test_a_tls_lab_pins_its_ca_in_the_join_token_and_the_credentials(labs):
    lab = labs("lab")
    lab.start_leader()
    assert lab.url.startswith("https://127.0.0.1:")
    saved = credentials(lab)
    pin = saved["pin"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", pin) and saved["leader"] == lab.url
    join = (lab.data / "join-token").read_text().strip()
    assert join.startswith(f"labq-join:v1:{pin}:")
    tls = lab.data / "tls"
    assert {p.name for p in tls.iterdir()} >= {"ca.pem", "ca.key", "leader.pem", "leader.key"}
    for key in ("ca.key", "leader.key"):
        assert (tls / key).stat().st_mode & 0o777 == 0o600
    openssl = subprocess.run(["openssl", "x509", "-in", str(tls / "ca.pem"), "-noout", "-fingerprint", "-sha256"],
                             capture_output=True, text=True)
    if openssl.returncode == 0:  # the pin is the fingerprint openssl shows
        assert openssl.stdout.strip().split("=", 1)[1].replace(":", "").lower() == pin.removeprefix("sha256:")
    assert lab.labq("whoami").stdout.strip()


def test_a_job_runs_over_tls_and_no_token_or_environment_value_crosses_loopback_in_clear(labs):
    assert hasattr(socket, "AF_PACKET"), "a Linux machine is needed to capture loopback packets"
    for tls in (True, False):  # the plain lab shows that the capture does see what goes in clear
        lab = labs("tls" if tls else "plain", TLS_CONFIG if tls else TEST_CONFIG)
        lab.start_leader()
        lab.start_agent()
        port = int(lab.url.rsplit(":", 1)[1])
        token = credentials(lab)["token"]
        capture = Capture()
        try:
            job = lab.submit("sh", "-c", f"test -n \"$SECRET\" && echo {LOG_LINE}", env=f"SECRET={SECRET_ENV}")
            assert lab.wait_state(job, "succeeded", "failed")["state"] == "succeeded"
            lab.labq("ls", "--all")
            assert LOG_LINE in lab.labq("logs", str(job)).stdout  # the leader fetched it from the agent
        finally:
            seen = capture.stop()
        assert capture.to_port(seen, port) and len(seen) > 10_000, "the capture saw the leader's traffic"
        # this lab's own logs token (the capture sees all of loopback: other tests' labs too)
        logs_token = next(rec["logs_token"] for _, rec in read_state(lab.data).tables["agents"].values())
        assert logs_token.startswith("lql_")
        leaked = [what for what, value in (("the token", token), ("the job's environment value", SECRET_ENV),
                                           ("the job's log", LOG_LINE), ("the logs token", f"Bearer {logs_token}"))
                  if value.encode() in seen]
        if tls:
            assert leaked == [], f"in clear on loopback: {leaked}"
        else:
            assert leaked == ["the token", "the job's environment value", "the job's log", "the logs token"]


def test_clients_and_agents_pinned_to_the_lab_refuse_another_leader_naming_both_fingerprints(labs):
    lab, rogue = labs("lab"), labs("rogue")
    lab.start_leader()
    rogue.start_leader()
    pin, rogue_pin = credentials(lab)["pin"], credentials(rogue)["pin"]
    assert pin != rogue_pin
    lab.labq("whoami")  # the lab's CA is now kept next to the credentials
    for attempt in ("with the CA kept", "again"):
        out = lab.labq("whoami", "--leader", rogue.url, check=False)
        assert out.returncode == 3, (attempt, out.stderr)
        assert rogue_pin in out.stderr and pin in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    fresh = lab.root / "fresh-home"  # never met the lab's leader: nothing kept, the pin alone decides
    env = dict(lab.env(), HOME=str(fresh), XDG_CONFIG_HOME=str(fresh / ".config"), LABQ_LEADER=rogue.url,
               LABQ_TOKEN=credentials(lab)["token"], LABQ_PIN=pin)
    out = subprocess.run([sys.executable, "-m", "labq.cli", "whoami"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 3 and rogue_pin in out.stderr and pin in out.stderr, out.stderr
    agent = subprocess.run([sys.executable, "-m", "labq.cli", "agent", "--leader", rogue.url, "--gpus",
                            "sim:ws-4x3090", "--name", "ws9", "--no-mdns", "--data-dir", str(lab.data)],
                           capture_output=True, text=True, env=lab.env(), timeout=60)
    assert agent.returncode == 2, agent.stderr
    assert "not joining" in agent.stderr and rogue_pin in agent.stderr and pin in agent.stderr, agent.stderr
    assert rogue.api("nodes") == []  # the rogue got nothing: not even a registration


def test_plain_http_off_loopback_needs_the_admins_word(labs, tmp_path):
    config = tmp_path / "plain.toml"
    config.write_text(TEST_CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "0.0.0.0:0"\ntls = "off"\n'))
    env = Lab(tmp_path / "x").env()
    out = subprocess.run([sys.executable, "-m", "labq.cli", "leader", "--no-mdns", "--config", str(config),
                          "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "in clear" in out.stderr and "insecure = true" in out.stderr, out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made
    lab = labs("insecure", TEST_CONFIG.replace('listen = "127.0.0.1:0"\n',
                                               'listen = "0.0.0.0:0"\ntls = "off"\ninsecure = true\n'))
    lab.start_leader()
    assert lab.url.startswith("http://")
    assert "warning: plain HTTP" in (lab.root / "leader.log").read_text()
    nodes = lab.labq("nodes")
    assert "warning: the leader serves plain HTTP to the network" in nodes.stderr  # every admin sees it
    assert "warning" not in lab.labq("nodes", "--json").stdout
    tls = labs("tls")
    tls.start_leader()
    assert "warning" not in tls.labq("nodes").stderr


def test_the_ca_is_public_and_everything_else_still_needs_a_token(labs):
    import json
    import ssl
    import urllib.request

    lab = labs("lab")
    lab.start_leader()
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(f"{lab.url}/v1/tls/ca", context=unverified, timeout=10) as answer:
        doc = json.loads(answer.read())
    assert doc["fingerprint"] == credentials(lab)["pin"] and "BEGIN CERTIFICATE" in doc["ca"]
    assert "PRIVATE" not in doc["ca"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{lab.url}/v1/jobs", context=unverified, timeout=10)
    assert refused.value.code == 401
    with pytest.raises(OSError):  # plain HTTP to the TLS port: no answer, no crash
        urllib.request.urlopen(lab.url.replace("https://", "http://") + "/v1/whoami", timeout=10)
    assert lab.labq("whoami").returncode == 0  # the leader goes on serving


def test_an_admin_adds_a_user_who_logs_in_with_one_line_that_pins_the_lab(labs):
    import shlex

    lab = labs("lab")
    lab.start_leader()
    printed = lab.labq("admin", "user", "add", "bob", "--print").stdout
    line = next(line for line in printed.splitlines() if line.startswith("labq login "))
    argv = shlex.split(line)
    assert argv[2] == lab.url and argv[argv.index("--pin") + 1] == credentials(lab)["pin"]
    bob = lab.root / "bob"
    env = dict(lab.env(), HOME=str(bob), XDG_CONFIG_HOME=str(bob / ".config"))

    def labq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, env=env,
                              timeout=60)

    wrong = list(argv[1:])
    wrong[wrong.index("--pin") + 1] = "sha256:" + "0" * 64
    refused = labq(*wrong)
    assert refused.returncode == 3 and "refusing it" in refused.stderr
    assert not (bob / ".config" / "labq" / "credentials").exists()  # nothing saved for a leader not trusted
    assert labq("login", lab.url, "--pin", "sha256:zz", "--token", "x").returncode == 2
    done = labq(*argv[1:])
    assert done.returncode == 0 and "as bob, pinned to CA" in done.stdout, done.stderr
    saved = tomllib.loads((bob / ".config" / "labq" / "credentials").read_text())
    assert saved["pin"] == credentials(lab)["pin"] and saved["leader"] == lab.url
    assert (bob / ".config" / "labq" / "credentials").stat().st_mode & 0o777 == 0o600
    assert labq("whoami").stdout.startswith("bob at https://")


def test_a_token_made_for_a_laptop_logs_in_with_the_pin_and_revoking_it_ends_its_watch(labs):
    import shlex

    lab = labs("lab")
    lab.start_leader()
    lab.labq("admin", "user", "add", "bob", "--print")
    made = lab.labq("admin", "token", "create", "bob", "--name", "laptop", "--expires", "30d").stdout
    assert "made token" in made and "for bob, valid until" in made, made
    argv = shlex.split(next(line for line in made.splitlines() if line.startswith("labq login ")))
    assert argv[argv.index("--pin") + 1] == credentials(lab)["pin"]
    laptop = lab.root / "laptop"
    env = dict(lab.env(), HOME=str(laptop), XDG_CONFIG_HOME=str(laptop / ".config"))

    def labq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, env=env,
                              timeout=60)

    assert labq(*argv[1:]).returncode == 0
    assert labq("whoami").stdout.startswith("bob at https://")
    listed = lab.api("admin", "token", "list")
    laptops = [t for t in listed if t["name"] == "laptop"]
    assert len(laptops) == 1 and laptops[0]["user"] == "bob" and laptops[0]["expires_at"]
    secret = argv[argv.index("--token") + 1]
    assert secret not in lab.labq("admin", "token", "list").stdout
    watch = subprocess.Popen([sys.executable, "-m", "labq.cli", "ls", "--watch"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    shown: list[str] = []
    reader = threading.Thread(target=lambda: shown.extend(iter(lambda: watch.stdout.read(1), "")), daemon=True)
    reader.start()

    def frames() -> int:  # into a pipe, the watch writes each frame whole, after a clear-screen
        return "".join(shown).count("\x1b[2J")

    try:
        lab.wait(lambda: frames() >= 1, "the watch's first frame")
        lab.submit("true")  # an event: the watch redraws once its event stream is open
        lab.wait(lambda: frames() >= 2, "the watch to redraw on an event", detail=lambda: watch.poll())
        revoked = lab.labq("admin", "token", "revoke", laptops[0]["id"]).stdout
        assert "no longer works" in revoked
        watch.wait(timeout=30)
        err = watch.stderr.read()
    finally:
        watch.kill()
    assert watch.returncode == 3, err  # a refused token: the credentials' exit status
    assert "token" in err and "Traceback" not in err
    assert labq("whoami").returncode == 3
    assert lab.labq("whoami").returncode == 0
