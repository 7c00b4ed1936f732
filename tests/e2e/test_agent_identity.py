"""Agents' own certificates: the join secret once per node, mutual TLS after, one-time join tokens, a node's
name that no join token can take, and logs served over TLS. Real leader and agent processes on loopback."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(150)

TLS_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "127.0.0.1:0"\ntls = "on"\n')


@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path / "lab", TLS_CONFIG)
    yield made
    made.close()


def agent(lab: Lab, name: str, *, token: str | None = None, state: str | None = None,
          wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """Start an agent for node ``name``; with ``wait=False`` run it until it exits (a refusal) instead."""
    args = ["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", name, "--data-dir", str(lab.data),
            "--no-mdns", "--local-socket", "off"]
    if state:
        args += ["--state-dir", state]
    env = {"LABQ_JOIN_TOKEN": token} if token else {}
    if not wait:
        return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True,
                              env=lab.env(**env), timeout=60)
    log = lab.root / f"agent-{name}.log"
    start = log.stat().st_size if log.exists() else 0
    proc = lab._spawn(args, f"agent-{name}.log", **env)
    lab.agents[name] = proc
    lab.wait(lambda: f"registered {name}" in log.read_bytes()[start:].decode(errors="replace")
             and any(n["name"] == name and n["health"] == "up" for n in lab.api("nodes")), f"{name} to join",
             detail=lambda: log.read_text())
    return proc


def lab_token(lab: Lab) -> str:
    return (lab.data / "join-token").read_text().strip()


def ca_of(lab: Lab) -> x509.Certificate:
    return x509.load_pem_x509_certificate((lab.data / "tls" / "ca.pem").read_bytes())


def test_an_agent_joins_once_with_the_secret_and_after_that_by_its_certificate(lab):
    lab.start_leader()
    agent(lab, "ws1")
    folder = lab.data / "agents" / "ws1" / "tls"
    cert = x509.load_pem_x509_certificate((folder / "agent.pem").read_bytes())
    assert (folder / "agent.key").stat().st_mode & 0o777 == 0o600
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ws1"
    assert cert.issuer == ca_of(lab).subject
    ca_of(lab).public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["ws1.agent.labq"]
    lab.kill(lab.agents.pop("ws1"))
    pin = lab_token(lab).split(":")[2] + ":" + lab_token(lab).split(":")[3]
    wrong_secret = f"labq-join:v1:{pin}:not-the-lab-secret"
    agent(lab, "ws1", token=wrong_secret)  # the secret is not asked again: its certificate joins it
    assert "by its certificate" in (lab.root / "agent-ws1.log").read_text()
    other = agent(lab, "ws2", token=wrong_secret, wait=False)  # a new name with a wrong secret: refused
    assert other.returncode == 2 and "refused" in other.stderr, other.stderr


def test_a_one_time_join_token_admits_one_agent_and_no_other(lab):
    lab.start_leader()
    made = json.loads(lab.labq("admin", "join", "create", "--expires", "1h", "--json").stdout)
    token = made["token"]
    assert token.startswith("labq-join:v1:sha256:") and made["join"]["expires_at"]
    agent(lab, "ws5", token=token)
    second = agent(lab, "ws6", token=token, wait=False)
    assert second.returncode == 2 and "used by ws5 already" in second.stderr, second.stderr
    assert not [n for n in lab.api("nodes") if n["name"] == "ws6"]
    listed = lab.api("admin", "join", "list")
    assert [(j["id"], j["used_by"]) for j in listed] == [(made["join"]["id"], "ws5")]
    bound = json.loads(lab.labq("admin", "join", "create", "--node", "ws7", "--json").stdout)["token"]
    wrong = agent(lab, "ws8", token=bound, wait=False)
    assert wrong.returncode == 2 and "for node ws7" in wrong.stderr, wrong.stderr
    agent(lab, "ws7", token=bound)
    printed = lab.labq("admin", "join", "create").stdout
    assert "LABQ_JOIN_TOKEN=labq-join:v1:" in printed and "labq agent" in printed, printed


def test_no_join_token_takes_the_name_of_a_node_that_joined_until_an_admin_forgets_it(lab, tmp_path):
    lab.start_leader()
    agent(lab, "ws1")
    lab.kill(lab.agents.pop("ws1"))
    impostor = agent(lab, "ws1", state=str(tmp_path / "elsewhere"), wait=False)  # the lab's token, no certificate
    assert impostor.returncode == 2 and "ws1 has joined already" in impostor.stderr, impostor.stderr
    assert "labq admin node forget ws1" in impostor.stderr
    out = lab.labq("admin", "node", "forget", "ws1").stdout
    assert "ws1" in out and "join again" in out
    assert not [n for n in lab.api("nodes") if n["name"] == "ws1"]
    agent(lab, "ws1", state=str(tmp_path / "elsewhere"))  # the reinstalled machine joins


def test_an_agents_token_without_its_certificate_is_refused(lab):
    """What a thief who read an agent's token on the wire, or from its memory, could do with it alone."""
    lab.start_leader()
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ws3")])).sign(key, hashes.SHA256()))
    node = {"name": "ws3", "gpus": [{"index": 0, "uuid": "SIM-ws3-0", "model": "RTX 3090", "memory_mib": 24576}],
            "topology": {"pcie": [[0]], "nvlinks": [[0]], "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}
    ca_pem = (lab.data / "tls" / "ca.pem").read_text()
    plain = ssl.create_default_context(cadata=ca_pem)
    plain.check_hostname = False

    def post(path: str, body: dict, token: str | None, context: ssl.SSLContext) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(f"{lab.url}{path}", json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    secret = lab_token(lab).rsplit(":", 1)[1]
    status, reply = post("/v1/agents/register", {"node": node, "version": "0",
                                                 "csr": csr.public_bytes(serialization.Encoding.PEM).decode()},
                         secret, plain)
    assert status == 200, reply
    token, cert_pem = reply["agent_token"], reply["certificate"]
    status, refused = post("/v1/agents/ws3/sync", {"attempts": [], "unmanaged_busy": [], "wait_s": 0}, token, plain)
    assert status == 401 and "certificate" in refused["error"]["message"], refused
    folder = lab.root / "ws3-tls"
    folder.mkdir()
    (folder / "cert.pem").write_text(cert_pem)
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    mutual = ssl.create_default_context(cadata=ca_pem)
    mutual.check_hostname = False
    mutual.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    status, synced = post("/v1/agents/ws3/sync", {"attempts": [], "unmanaged_busy": [], "wait_s": 0}, token, mutual)
    assert status == 200, synced
    status, _ = post("/v1/agents/ws3/sync", {"attempts": [], "unmanaged_busy": [], "wait_s": 0}, None, mutual)
    assert status == 200  # its certificate alone is the agent
    status, refused = post("/v1/jobs", {"command": ["true"]}, None, mutual)
    assert status == 403  # and no person
