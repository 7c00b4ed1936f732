"""The lab's CA: what it signs, for how long, and that only the leader's certificate may serve."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from labq.leader.certs import RENEW_BEFORE_S, LabCA, server_context, serving_files
from labq.tls import client_context, fingerprint

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
