"""A man-in-the-middle leader on the LAN, answering mDNS with the lab's name: agents and clients refuse it by the pin.

Three hosts, each a network namespace on one bridge; the test sends nothing anywhere else.

- host 0 runs the lab's real leader (TLS: it listens off loopback). Its join token carries the lab CA's
  fingerprint (the pin) and its first admin's credentials carry the same pin.
- host 1 is the attacker: a labq leader of its own (another data folder, so another CA), behind a small
  TLS relay on host 1's LAN address at the lab's port, which records every byte a victim sends it. The
  attacker replays the real leader's mDNS advert (the same instance name, the lab's name and its public
  cluster id) pointing at the relay: the cluster id is public, so anyone on the LAN can.
- host 2 is the victim's workstation: an agent holding the lab's join token, with no --leader, and a CLI
  holding the lab's credentials.

While the real leader is down, the agent finds only the attacker over mDNS: it refuses it naming both
fingerprints, exits 2 and registers nothing; the CLI pointed at the attacker exits 3 the same way. The
attacker never sees the join secret nor the user's token. Once the real leader is back, the same agent
joins it over mDNS, and the CLI, now holding the lab's CA, still refuses the attacker: the refusals were
the pin's doing, not a broken network.
"""

from __future__ import annotations

import json
import sys
import tomllib

import pytest

from labq.credentials import credentials_text
from labq.protocol.identity import lab_of, parse_join_token
from tests.discovery.hosts import Hosts
from tests.e2e.conftest import TEST_CONFIG

pytestmark = pytest.mark.timeout(240)

PORT = 7733
# the lab's leader, as in test_three_hosts: the end-to-end tests' short leases, on every address of its host
LAB_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"', f'listen = "0.0.0.0:{PORT}"')
# the attacker's leader: TLS with its own CA, reached only through the relay in front of it
ROGUE_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{PORT}"\ntls = "on"')

# Runs on a host: print, as JSON, the leaders of one cluster seen over mDNS within a few seconds.
PROBE = """\
import dataclasses, json, sys
from labq.discovery import find_leaders
print(json.dumps([dataclasses.asdict(f) for f in find_leaders(float(sys.argv[1]), cluster=sys.argv[2])]))
"""

# Runs on the attacker's host: advertise a leader with the given instance name and TXT properties, until TERM.
ADVERTISE = """\
import json, signal, sys, threading
from labq.discovery import Advertiser
name, port, properties, address = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
advertiser = Advertiser("leader", name, port, properties, interfaces=[address]).start()
print("advertising", advertiser.info.name, flush=True)
while not stop.wait(0.2):
    pass
advertiser.close()
print("withdrawn", flush=True)
"""

# Runs on the attacker's host: terminate TLS on ADDRESS:PORT with the rogue leader's own certificate, append
# every byte a client sends to RECORD, and relay it to the rogue leader on 127.0.0.1:UPSTREAM (and back).
RELAY = """\
import select, socket, socketserver, ssl, sys, threading
address, port, upstream, cert, key, record = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:7]
served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
served.load_cert_chain(cert, key)
onward = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
onward.check_hostname, onward.verify_mode = False, ssl.CERT_NONE
lock = threading.Lock()

def note(data):
    with lock, open(record, "ab") as f:
        f.write(data)

class Relay(socketserver.BaseRequestHandler):
    def handle(self):
        note(f"\\n--- a connection from {self.client_address[0]}\\n".encode())
        try:
            down = served.wrap_socket(self.request, server_side=True)
        except (ssl.SSLError, OSError) as err:
            note(f"--- no TLS handshake: {err}\\n".encode())
            return
        try:
            with down, onward.wrap_socket(socket.create_connection(("127.0.0.1", upstream), timeout=30)) as up:
                ends = [down, up]
                for end in ends:  # a TLS record with no data (a session ticket) must not block the relay
                    end.setblocking(False)
                while True:
                    ready = [s for s in ends if s.pending()] or select.select(ends, [], [], 60)[0]
                    if not ready:
                        return
                    for s in ready:
                        try:
                            data = s.recv(65536)
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                            continue
                        if not data:
                            return
                        if s is down:
                            note(data)
                        other = up if s is down else down
                        other.setblocking(True)
                        other.sendall(data)
                        other.setblocking(False)
        except OSError as err:
            note(f"--- connection ended: {err}\\n".encode())

class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

with Server((address, port), Relay) as server:
    print("relaying", flush=True)
    server.serve_forever()
"""


class RogueHosts(Hosts):
    """The LAN's hosts, and what each sees over mDNS."""

    def leaders(self, host: int, cluster: str, wait_s: float = 3.0) -> list[dict]:
        """The leaders of ``cluster`` that host sees over mDNS, from a fresh browser (nothing cached)."""
        path = self.root / "probe.py"
        path.write_text(PROBE)
        out = self.run(host, [sys.executable, str(path), str(wait_s), cluster], "probe")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


def test_a_rogue_leader_advertising_the_lab_over_mdns_is_refused_by_the_pin(lan, tmp_path):
    lab = lan(3)
    hosts = RogueHosts(lab, tmp_path)
    lab_url, rogue_url = f"https://{lab.addr(0)}:{PORT}", f"https://{lab.addr(1)}:{PORT}"
    try:
        # -- host 0: the lab's leader; its join token and first admin's credentials carry the lab's pin
        (tmp_path / "lab.toml").write_text(LAB_CONFIG)
        lab_argv = ["leader", "--config", str(tmp_path / "lab.toml"), "--data-dir", str(tmp_path / "lab" / "data")]
        leader = hosts.labq_daemon(0, "lab", *lab_argv)
        hosts.wait_log("lab", "serving https://", leader)
        join = (tmp_path / "lab" / "data" / "join-token").read_text().strip()
        pin, secret = parse_join_token(join)
        admin = tomllib.loads((tmp_path / "lab" / ".config" / "labq" / "credentials").read_text())
        assert admin["pin"] == pin and pin in hosts.log("lab")
        cluster = lab_of(join)

        # what anyone on the LAN sees of the lab: its advert (instance name, lab name, cluster id, tls)
        seen: list[dict] = []
        hosts.wait(lambda: bool(seen.extend(hosts.leaders(2, cluster)) or seen), "the lab's mDNS advert", 60)
        advert = seen[0]
        assert (advert["url"], advert["cluster"], advert["properties"]["tls"]) == (lab_url, cluster, "1"), advert
        hosts.stop(leader)  # the lab's leader is down (a reboot, a power cut): its advert is withdrawn

        # -- host 1: the attacker, a labq leader with another CA behind a recording relay, advertising the lab
        (tmp_path / "rogue.toml").write_text(ROGUE_CONFIG)
        rogue = hosts.labq_daemon(1, "rogue", "leader", "--no-mdns", "--log-level", "debug", "--config",
                                  str(tmp_path / "rogue.toml"), "--data-dir", str(tmp_path / "rogue" / "data"))
        hosts.wait_log("rogue", "serving https://127.0.0.1", rogue)
        rogue_pin = tomllib.loads((tmp_path / "rogue" / ".config" / "labq" / "credentials").read_text())["pin"]
        assert rogue_pin != pin
        tls = tmp_path / "rogue" / "data" / "tls"
        record = tmp_path / "relay.bytes"
        relay = hosts.script(1, "relay", RELAY, lab.addr(1), str(PORT), str(PORT), str(tls / "leader.pem"),
                             str(tls / "leader.key"), str(record))
        hosts.wait_log("relay", "relaying", relay)
        fake = hosts.script(1, "advertiser", ADVERTISE, advert["name"], str(PORT), json.dumps(advert["properties"]),
                            lab.addr(1))
        hosts.wait_log("advertiser", "advertising", fake)
        seen.clear()
        hosts.wait(lambda: bool(seen.extend(hosts.leaders(2, cluster)) or seen), "the rogue's advert", 60)
        assert [(f["name"], f["url"], f["properties"]) for f in seen] == [
            (advert["name"], rogue_url, advert["properties"])], seen  # the lab's very advert, at the rogue

        # -- host 2 (a): an agent with the lab's join token and no --leader finds only the rogue, and refuses it
        agent_argv = ["agent", "--gpus", "sim:flat:2", "--name", "victim", "--data-dir",
                      str(tmp_path / "victim" / "data")]
        agent = hosts.labq_daemon(2, "victim", *agent_argv, LABQ_JOIN_TOKEN=join)
        assert agent.wait(timeout=90) == 2, hosts.log("victim")
        said = hosts.log("victim")
        assert f"found the leader over mDNS: {rogue_url}" in said, said
        assert "not joining" in said and rogue_pin in said and pin in said, said
        assert "Traceback" not in said, said
        assert hosts.nodes(1, "rogue") == []  # not even a registration
        assert f"a connection from {lab.addr(2)}" in record.read_text(errors="replace")  # the rogue was reached

        # -- host 2 (b): the lab's credentials, pointed at the rogue: exit 3 naming both, nothing sent
        (tmp_path / "user" / ".config" / "labq").mkdir(parents=True)
        (tmp_path / "user" / ".config" / "labq" / "credentials").write_text(
            credentials_text(lab_url, admin["token"], pin))
        out = hosts.labq(2, "user", "whoami", "--leader", rogue_url)
        assert out.returncode == 3, (out.returncode, out.stderr)
        assert rogue_pin in out.stderr and pin in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr

        # -- host 2 (c): the lab's leader is back; the same agent, still with no --leader, joins it
        hosts.stop(fake)  # the attacker withdraws, or mDNS would show two leaders of the lab (and pick none)
        assert "withdrawn" in hosts.log("advertiser")
        before = len(hosts.log("lab"))
        leader = hosts.labq_daemon(0, "lab", *lab_argv)
        hosts.wait_log("lab", "serving https://", leader, after=before)
        hosts.wait(lambda: [f["url"] for f in hosts.leaders(2, cluster)] == [lab_url], "the lab's advert again", 60)
        before = len(hosts.log("victim"))
        agent = hosts.labq_daemon(2, "victim", *agent_argv, LABQ_JOIN_TOKEN=join)
        hosts.wait(lambda: any(n["name"] == "victim" and n["health"] == "up" for n in hosts.nodes(0, "lab")),
                   "the agent to join the lab", 60, lambda: hosts.log("victim")[before:])
        assert agent.poll() is None
        assert f"found the leader over mDNS: {lab_url}" in hosts.log("victim")[before:]
        # the user's CLI reaches the lab (and keeps its CA), and with the CA kept still refuses the rogue
        assert hosts.labq(2, "user", "whoami").returncode == 0
        out = hosts.labq(2, "user", "whoami", "--leader", rogue_url)
        assert out.returncode == 3 and rogue_pin in out.stderr and pin in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr

        # what the attacker got: connections and the public CA's fetches, never a secret nor a registration
        assert hosts.nodes(1, "rogue") == []
        got = record.read_bytes()
        assert b"GET /v1/tls/ca " in got, got[-2000:]
        assert secret.encode() not in got and admin["token"].encode() not in got, got[-2000:]
        assert b"/v1/agents/" not in got and b"Authorization" not in got, got[-2000:]
        rogue_log = hosts.log("rogue")
        assert "/v1/tls/ca" in rogue_log, rogue_log[-3000:]  # the rogue's log shows each request (debug)
        assert secret not in rogue_log and admin["token"] not in rogue_log and "/v1/agents/" not in rogue_log
        assert "Traceback" not in hosts.log("relay"), hosts.log("relay")
    finally:
        hosts.close()
