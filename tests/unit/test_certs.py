"""The lab's CA: what it signs, for how long, and that only the leader's certificate may serve."""

from __future__ import annotations

import datetime
import logging
import shutil
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from labq.agent.identity import AgentIdentity

from labq.leader.certs import (CHECK_EVERY_S, RENEW_BEFORE_S, SERVING_DAYS, LabCA, ServingCertificate,
                               server_context, serving_files)
from labq.leader.config import LeaderConfig
from labq.leader.main import start_leader
from labq.tls import agent_name, client_context, fingerprint

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.timezone.utc)


def test_the_ca_is_made_once_and_its_keys_are_the_owners_alone(tmp_path):
    ca = LabCA.load_or_create(tmp_path, "lab", NOW)
    again = LabCA.load_or_create(tmp_path, "lab", NOW + datetime.timedelta(days=400))
    assert again.fingerprint == ca.fingerprint == fingerprint(ca.cert_pem)
    assert (tmp_path / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_serving_certificate_is_renewed_a_month_before_it_ends_and_only_then(tmp_path):
    ca = LabCA.load_or_create(tmp_path, "lab", NOW)
    cert_path, key_path = serving_files(ca, "127.0.0.1", NOW)
    first = cert_path.read_bytes()
    leaf = x509.load_pem_x509_certificate(first)
    assert ExtendedKeyUsageOID.SERVER_AUTH in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert "127.0.0.1" in {str(a) for a in leaf.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)}
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert serving_files(ca, "127.0.0.1", NOW + datetime.timedelta(days=300))[0].read_bytes() == first
    late = NOW + datetime.timedelta(days=365) - datetime.timedelta(seconds=RENEW_BEFORE_S - 60)
    renewed = x509.load_pem_x509_certificate(serving_files(ca, "127.0.0.1", late)[0].read_bytes())
    assert renewed.not_valid_after_utc > leaf.not_valid_after_utc  # same CA: clients and agents notice nothing


def _serve_once(context: ssl.SSLContext) -> tuple[int, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello")
        except (ssl.SSLError, OSError):
            pass
        finally:
            listener.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return port, thread


def _connect(port: int, context: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            return tls.recv(5)


def test_a_client_of_the_lab_trusts_the_leaders_certificate_and_not_an_agents(tmp_path):
    ca = LabCA.load_or_create(tmp_path, "lab")
    trusting = client_context(ca.cert_pem)
    port, thread = _serve_once(server_context(ca, *serving_files(ca, "127.0.0.1")))
    assert _connect(port, trusting) == b"hello"
    thread.join(10)
    agent_cert, agent_key = ca.issue("ws1", serving=False)  # what an agent gets: for clients only
    (tmp_path / "a.pem").write_bytes(agent_cert)
    (tmp_path / "a.key").write_bytes(agent_key)
    posing = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    posing.load_cert_chain(tmp_path / "a.pem", tmp_path / "a.key")
    port, thread = _serve_once(posing)
    with pytest.raises(ssl.SSLCertVerificationError):
        _connect(port, trusting)
    thread.join(10)
    other = LabCA.load_or_create(tmp_path / "other", "other")
    port, thread = _serve_once(server_context(other, *serving_files(other, "127.0.0.1")))
    with pytest.raises(ssl.SSLCertVerificationError):  # another lab's leader
        _connect(port, trusting)
    thread.join(10)


def test_an_agents_certificate_serves_its_logs_under_its_name_and_poses_as_no_leader_and_no_other_agent(tmp_path):
    """What the CA signs for an agent at join: for its own key (the request's), as ``NODE.agent.labq``."""
    ca = LabCA.load_or_create(tmp_path, "lab")
    identity = AgentIdentity(tmp_path / "ws1", "ws1")
    identity.save(ca.sign_agent(identity.request(), "ws1"))
    assert identity.files() == (identity.cert_path, identity.key_path) and not identity.due()
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(*identity.files())
    for expect, trusted in ((agent_name("ws1"), True), (agent_name("ws2"), False), ("leader.labq", False)):
        port, thread = _serve_once(serving)
        if trusted:
            assert _connect(port, client_context(ca.cert_pem, expect=expect)) == b"hello"
        else:
            with pytest.raises(ssl.SSLCertVerificationError):
                _connect(port, client_context(ca.cert_pem, expect=expect))
        thread.join(10)
    other = AgentIdentity(tmp_path / "ws2", "ws2")  # a certificate for another name, or another key, is not kept
    with pytest.raises(ValueError, match="not for 'ws2'"):
        other.save(ca.sign_agent(identity.request(), "ws1"))
    forged = (x509.CertificateSigningRequestBuilder()  # someone else's key, in ws1's name
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ws1")]))
              .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256()))
    with pytest.raises(ValueError, match="another key"):
        identity.save(ca.sign_agent(forged.public_bytes(serialization.Encoding.PEM).decode(), "ws1"))
    with pytest.raises(ValueError, match="cannot be read"):
        ca.sign_agent("-----BEGIN CERTIFICATE REQUEST-----\nnot base64\n-----END CERTIFICATE REQUEST-----", "ws1")


def _serve_echo(context: ssl.SSLContext, connections: int) -> int:
    """A TLS server on loopback that takes ``connections`` connections, each in its own thread as the
    leader's server does, and sends back what it reads until the client closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                while data := tls.recv(1024):
                    tls.sendall(data)
        except (ssl.SSLError, OSError):
            pass

    def accept() -> None:
        with listener:
            for _ in range(connections):
                threading.Thread(target=echo, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


@contextmanager
def _open(port: int, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw) as tls:
            yield tls


def _talks(tls: ssl.SSLSocket) -> bool:
    tls.sendall(b"ping")
    return tls.recv(4) == b"ping"


def _shown(tls: ssl.SSLSocket) -> x509.Certificate:
    """The certificate the server presented on this connection."""
    return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_a_running_leader_renews_its_certificate_in_place_and_open_connections_keep_theirs(tmp_path, caplog):
    now = datetime.datetime.now(datetime.timezone.utc)  # the handshakes below check the real time
    issued = now - datetime.timedelta(days=SERVING_DAYS - 20)  # twenty days left: due
    ca = LabCA.load_or_create(tmp_path, "lab", issued)
    serving = ServingCertificate(ca, "127.0.0.1", issued)
    old = serving.serving
    assert (old.not_valid_after_utc - now).total_seconds() < RENEW_BEFORE_S
    trusting = client_context(ca.cert_pem)  # what agents and clients hold: the lab CA, pinned
    port = _serve_echo(serving, connections=2)  # the server wraps with it, as the leader's does
    with _open(port, trusting) as before:
        assert _talks(before) and _shown(before) == old
        with caplog.at_level(logging.INFO, logger="labq.leader"):
            assert serving.renew_if_due(now)
        new = serving.serving  # the same server, not restarted, wraps the next connection
        assert new.not_valid_after_utc > old.not_valid_after_utc and new.serial_number != old.serial_number
        assert new.issuer == old.issuer == ca.cert.subject
        assert x509.load_pem_x509_certificate(serving.cert_path.read_bytes()) == new
        with _open(port, trusting) as after:  # a new handshake on the same server: the new certificate
            assert _talks(after) and _shown(after) == new
        assert _talks(before)  # the connection opened before the renewal goes on
    said = [r for r in caplog.records if r.name == "labq.leader"]
    assert len(said) == 1 and said[0].levelno == logging.INFO and f"{new.serial_number:x}" in said[0].getMessage()
    key_body = "".join(serving.key_path.read_text().splitlines()[1:-1])
    assert "PRIVATE KEY" not in caplog.text and key_body[:40] not in caplog.text
    assert not serving.renew_if_due(now)  # a year left again


def test_a_certificate_not_due_is_not_rewritten(tmp_path):
    ca = LabCA.load_or_create(tmp_path, "lab", NOW)
    serving = ServingCertificate(ca, "127.0.0.1", NOW)
    first = serving.serving

    def on_disk() -> tuple[int, bytes, int, bytes]:
        return (serving.cert_path.stat().st_mtime_ns, serving.cert_path.read_bytes(),
                serving.key_path.stat().st_mtime_ns, serving.key_path.read_bytes())

    was = on_disk()
    just_not_due = NOW + datetime.timedelta(days=SERVING_DAYS, seconds=-RENEW_BEFORE_S - 3600)
    for now in (NOW, NOW + datetime.timedelta(days=300), just_not_due):
        assert not serving.renew_if_due(now)
    assert on_disk() == was and serving.serving.serial_number == first.serial_number


def test_a_certificate_another_ca_signed_is_replaced_by_one_of_the_labs(tmp_path):
    ca = LabCA.load_or_create(tmp_path, "lab", NOW)
    serving = ServingCertificate(ca, "127.0.0.1", NOW)
    other = LabCA.load_or_create(tmp_path / "other", "other", NOW)
    shutil.copy(serving_files(other, "127.0.0.1", NOW)[0], serving.cert_path)
    shutil.copy(other.folder / "leader.key", serving.key_path)
    assert serving.renew_if_due(NOW)
    assert serving.serving.issuer == ca.cert.subject != other.cert.subject
    assert x509.load_pem_x509_certificate(serving.cert_path.read_bytes()) == serving.serving


class _Rounds(threading.Event):
    """The renewal thread's stop signal, stepped by the test instead of the clock: each ``wait`` is one
    round of the loop, ``before`` runs ahead of round ``n``; after the last round the loop is told to stop."""

    def __init__(self, before: list[Callable[[], None]]) -> None:
        super().__init__()
        self.before, self.waits = before, []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) > len(self.before):
            return True
        self.before[len(self.waits) - 1]()
        return False


def test_the_renewal_thread_outlives_a_failed_renewal_and_tries_again_sooner(tmp_path, caplog):
    issued = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=SERVING_DAYS - 20)
    ca = LabCA.load_or_create(tmp_path, "lab", issued)
    serving = ServingCertificate(ca, "127.0.0.1", issued)
    old, key = serving.serving, serving.key_path

    def break_the_key_file() -> None:  # a real write that fails: the key cannot replace a folder
        key.unlink()
        key.mkdir()

    rounds = _Rounds([break_the_key_file, key.rmdir])
    with caplog.at_level(logging.INFO, logger="labq.leader"):
        serving.keep_renewed(rounds)  # returns only when told to stop
    assert rounds.waits[0] == rounds.waits[2] == CHECK_EVERY_S and rounds.waits[1] < CHECK_EVERY_S
    assert serving.serving != old and serving.serving.issuer == ca.cert.subject
    levels = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records if r.name == "labq.leader"]
    assert levels[0] == (logging.WARNING, "cannot renew the leader's TLS certificate")
    assert [lv for lv, _ in levels[1:]] == [logging.INFO, logging.INFO]  # renewed; works again


def test_a_leader_serving_tls_runs_the_renewal_thread_until_it_stops(tmp_path):
    running, _ = start_leader(LeaderConfig(host="127.0.0.1", port=0, data_dir=tmp_path, tls="on"), first_admin="ada")
    try:
        renewal = [t for t in running.leader.workers.threads if t.name == "labq-tls-renewal"]
        assert len(renewal) == 1 and renewal[0].is_alive()
        with socket.create_connection(running.server.server_address[:2], timeout=10) as raw:
            with client_context(running.leader.tls_ca).wrap_socket(raw) as tls:
                shown = _shown(tls)
        assert shown == x509.load_pem_x509_certificate((tmp_path / "tls" / "leader.pem").read_bytes())
    finally:
        running.stop()
    renewal[0].join(10)
    assert not renewal[0].is_alive()
