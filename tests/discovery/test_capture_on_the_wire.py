"""A capture on the LAN of a whole submit-to-logs session across machines: nothing secret crosses in clear.

Three hosts, each a network namespace on one bridge; the test sends nothing anywhere else.

- host 0 runs the lab's leader on every address of its host (``tls = "auto"``: TLS, as it listens off loopback);
- host 1 runs an agent, ws1, given the lab's join token and the leader's URL;
- host 2 is a workstation whose CLI holds the first admin's credentials (the leader's URL, token and CA pin).

A raw packet socket opened in the bridge's namespace records every frame on the bridge's ports (each host's
veth end) from before the agent joins until the session ends: host 2 submits a job carrying a secret in its
environment, waits for it, reads its log (which the leader fetches from ws1's log server, across the LAN, with
the node's logs token) and lists the queue. Over TLS the capture holds none of: the admin's token, the
environment value, the log line, a logs token, the join secret, nor any HTTP message at all. The same session
in a lab that its admin put on plain HTTP (``tls = "off"``, ``insecure = true``) shows every one of them: the
capture does see what crosses in clear.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
import tomllib
from pathlib import Path

import pytest

from labq.credentials import credentials_text
from labq.protocol.identity import parse_join_token
from tests.discovery.hosts import Hosts
from tests.e2e.conftest import TEST_CONFIG

pytestmark = pytest.mark.timeout(240)

PORT = 7733  # each namespace has its own ports
# the end-to-end tests' short leases, served on every address of the leader's host
TLS_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"', f'listen = "0.0.0.0:{PORT}"')
# the same, with the admin's word for plain HTTP to the network
PLAIN_CONFIG = TLS_CONFIG.replace("[leader]\n", '[leader]\ntls = "off"\ninsecure = true\n')
SECRET_ENV = "labq-wire-secret-5b7e0c"
LOG_LINE = "labq-wire-log-line-a41f"
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
CLONE_NEWNET = 0x40000000
SO_RCVBUFFORCE = 33  # root may set a receive buffer past net.core.rmem_max: a burst is not dropped


def _in_namespace(ns: str, make):
    """``make()``'s result, made by a thread that entered network namespace ``ns`` (a socket stays in the
    namespace it was made in, whichever thread reads it); the thread ends there, the test's threads never move."""
    done: dict = {}

    def enter() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            where = next((f / ns for f in (Path("/run/netns"), Path("/var/run/netns")) if (f / ns).exists()),
                         Path("/run/netns") / ns)  # where `ip netns add` keeps it
            with open(where) as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
            done["value"] = make()
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            done["error"] = err

    thread = threading.Thread(target=enter, name=f"enter-{ns}")
    thread.start()
    thread.join(10)
    assert done, f"could not enter network namespace {ns} in 10 s"
    if "error" in done:
        raise done["error"]
    return done["value"]


def _packet_socket() -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))  # unbound: every interface
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    sock.settimeout(0.2)
    return sock


class Capture:
    """Every frame on every interface of namespace ``ns`` while it runs (the bridge's: each host's veth end)."""

    def __init__(self, ns: str) -> None:
        self.sock = _in_namespace(ns, _packet_socket)
        self.frames: list[bytes] = []
        self.running = True
        self.thread = threading.Thread(target=self._read, name="capture", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while self.running:
            try:
                self.frames.append(self.sock.recv(1 << 18))  # a GSO frame on a veth may exceed 64 KiB
            except TimeoutError:
                continue
            except OSError:
                return

    def stop(self) -> list[bytes]:
        self.running = False
        self.thread.join(5)
        self.sock.close()
        return self.frames


def tcp_flows(frames: list[bytes]) -> dict[tuple[str, int, str, int], int]:
    """Bytes of TCP payload per (source address, source port, destination address, destination port)."""
    flows: dict[tuple[str, int, str, int], int] = {}
    for frame in frames:
        if len(frame) < 34 or int.from_bytes(frame[12:14], "big") != ETH_P_IP:
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6 or len(ip) < ihl + 20:  # TCP only
            continue
        total = int.from_bytes(ip[2:4], "big") or len(ip)  # 0 in a GSO frame: its length is the frame's
        tcp = ip[ihl:]
        key = (socket.inet_ntoa(ip[12:16]), int.from_bytes(tcp[0:2], "big"),
               socket.inet_ntoa(ip[16:20]), int.from_bytes(tcp[2:4], "big"))
        flows[key] = flows.get(key, 0) + max(min(total, len(ip)) - ihl - (tcp[12] >> 4) * 4, 0)
    return flows


def sent(flows: dict[tuple[str, int, str, int], int], src: str, dst: str, *, leader_port: bool) -> int:
    """Bytes of TCP payload from src to dst on the leader's port (or, leader_port=False, on any other)."""
    return sum(n for (a, sport, b, dport), n in flows.items()
               if (a, b) == (src, dst) and (PORT in (sport, dport)) == leader_port)


def session(lan, root: Path, tls: bool) -> dict:
    """Run the three-host session under a capture; what crossed and the secrets that could have."""
    lab = lan(3)
    root.mkdir()
    hosts = Hosts(lab, root)
    scheme = "https" if tls else "http"
    url = f"{scheme}://{lab.addr(0)}:{PORT}"
    try:
        # -- host 0: the leader, with its first admin's credentials in its HOME
        (root / "leader.toml").write_text(TLS_CONFIG if tls else PLAIN_CONFIG)
        leader = hosts.labq_daemon(0, "leader", "leader", "--no-mdns", "--config", str(root / "leader.toml"),
                                   "--data-dir", str(root / "leader" / "data"))
        hosts.wait_log("leader", f"serving {scheme}://", leader)
        join = (root / "leader" / "data" / "join-token").read_text().strip()
        pin, join_secret = parse_join_token(join)
        admin = tomllib.loads((root / "leader" / ".config" / "labq" / "credentials").read_text())
        assert (pin is not None) == tls and admin.get("pin") == pin, (join, admin)

        def cli(*args: str) -> str:
            out = hosts.labq(2, "cli", *args)
            assert out.returncode == 0, (args, out.returncode, out.stdout, out.stderr)
            assert "Traceback" not in out.stderr, out.stderr
            return out.stdout

        # from here on, every frame on the LAN is recorded: the agent's join and the CLI's first contact too
        capture = Capture(lab.bridge_ns)
        try:
            # -- host 1: the agent ws1, told the leader's URL and given the join token
            agent = hosts.labq_daemon(1, "ws1", "agent", "--leader", url, "--gpus", "sim:ws-4x3090", "--name",
                                      "ws1", "--no-mdns", "--local-socket", "off", "--data-dir",
                                      str(root / "ws1" / "data"), LABQ_JOIN_TOKEN=join)

            # -- host 2: the admin's credentials, copied over with the leader's LAN address
            config = root / "cli" / ".config" / "labq"
            config.mkdir(parents=True)
            (config / "credentials").write_text(credentials_text(url, admin["token"], pin))
            (config / "credentials").chmod(0o600)
            hosts.wait(lambda: any(n["name"] == "ws1" and n["health"] == "up" for n in hosts.nodes(2, "cli")),
                       "ws1 to join", 60, lambda: hosts.log("ws1")[-3000:])
            assert agent.poll() is None

            doc = json.loads(cli("submit", "--json", "--env", f"SECRET={SECRET_ENV}", "--", "sh", "-c",
                                 f'test -n "$SECRET" && echo {LOG_LINE}'))
            job = doc["id"] if "id" in doc else doc["job"]["id"]
            last: dict = {}

            def finished() -> bool:
                nonlocal last
                shown = json.loads(cli("show", str(job), "--json"))
                last = shown.get("job", shown)
                return last["state"] in ("succeeded", "failed", "cancelled")

            hosts.wait(finished, f"job {job} to finish", 90, lambda: f"{last}\n{hosts.log('ws1')[-2000:]}")
            assert last["state"] == "succeeded", last
            assert LOG_LINE in cli("logs", str(job))  # the leader fetched it from ws1's log server, across the LAN
            cli("ls", "--all")  # the unfinished jobs: none by now
            assert job in [j["id"] for j in json.loads(cli("ls", "--all", "--history", "--json"))]
        finally:
            frames = capture.stop()
        return {"frames": frames, "addresses": [lab.addr(i) for i in range(3)],
                "secrets": {"the admin's token": admin["token"], "the job's environment value": SECRET_ENV,
                            "the job's log line": LOG_LINE, "a logs token": "Bearer lql_",
                            "the join secret": join_secret, "any HTTP message": "HTTP/1."}}
    finally:
        hosts.close()


def test_a_capture_on_the_lan_of_a_session_across_hosts_holds_no_secret_in_clear_over_tls(lan, tmp_path):
    assert hasattr(socket, "AF_PACKET"), "a Linux machine is needed to capture packets"
    for tls in (True, False):  # the plain lab shows that the capture does see what goes in clear
        got = session(lan, tmp_path / ("tls" if tls else "plain"), tls)
        frames, (leader, ws1, cli) = got["frames"], got["addresses"]
        flows = tcp_flows(frames)
        # the capture saw the session: the CLI's and the agent's conversations with the leader's port, both ways,
        # and the leader's own with ws1's log server (another port of host 1)
        for a, b in ((cli, leader), (leader, cli), (ws1, leader), (leader, ws1)):
            assert sent(flows, a, b, leader_port=True) > 0, (tls, a, b, flows)
        assert sent(flows, leader, ws1, leader_port=False) > 0, (tls, flows)
        assert sent(flows, ws1, leader, leader_port=False) > 0, (tls, flows)
        assert sum(n for (_, sport, _, dport), n in flows.items() if PORT in (sport, dport)) > 10_000, (tls, flows)
        seen = b"".join(frames)
        leaked = [what for what, value in got["secrets"].items() if value.encode() in seen]
        if tls:
            assert leaked == [], f"in clear on the LAN with TLS on: {leaked}"  # not even an HTTP header
        else:
            assert leaked == list(got["secrets"]), f"not seen in clear on the LAN with TLS off: {leaked}"
