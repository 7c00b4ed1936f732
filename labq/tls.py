"""Trusting a leader by its CA's fingerprint, as ``kubeadm join --discovery-token-ca-cert-hash`` does.

The leader is its lab's own certificate authority (``labq.leader.certs``). Everyone else knows it by one
short string, the SHA-256 fingerprint of that CA's certificate (``sha256:<hex>``), which the join token
and the credentials file carry next to the leader's address. The first time a client meets a leader it
fetches the CA certificate over a connection that carries no secret, checks it against the pin, keeps
it, and from then on verifies every connection with it: a leader that cannot show a certificate of that
CA gets nothing, not even a token.

Only ``ssl`` and ``hashlib`` here: the CLI imports this on every call to an ``https://`` leader.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
from pathlib import Path
from urllib.parse import urlsplit

PIN = re.compile(r"sha256:[0-9a-f]{64}")
#: the name every leader's certificate has and clients check, whatever address they reached it by: the CA
#: signs it for the leader alone, so another certificate of the lab (an agent's) cannot pose as the leader
LEADER_NAME = "leader.labq"
CA_PATH = "/v1/tls/ca"  #: where a leader serves its CA certificate, to anyone (it is public)
MAX_CA_BYTES = 64 * 1024


class PinError(Exception):
    """The leader cannot be trusted (another CA than the pin, no TLS, no CA): a sentence that says which."""


def fingerprint(cert_pem: str) -> str:
    """``sha256:<hex>`` of a PEM certificate's DER bytes, as ``openssl x509 -fingerprint -sha256`` hashes it."""
    return "sha256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert_pem)).hexdigest()


def check_pin(pin: str) -> str:
    """The pin, normalised (lower case); ValueError for what is not ``sha256:`` and 64 hex digits."""
    normal = pin.strip().lower()
    if not PIN.fullmatch(normal):
        raise ValueError(f"{pin[:80]!r} is not a CA pin: it looks like sha256: and 64 hex digits")
    return normal


def agent_name(node: str) -> str:
    """The name in the certificate of node ``node``'s agent, which serves its logs under it."""
    return f"{node}.agent.labq"


class _Expecting(ssl.SSLContext):
    """A client context that checks the server's certificate for one name, whatever address it dialled."""

    expected = LEADER_NAME

    def wrap_socket(self, sock, server_side=False, do_handshake_on_connect=True, suppress_ragged_eofs=True,
                    server_hostname=None, session=None):
        return super().wrap_socket(sock, server_side=server_side, do_handshake_on_connect=do_handshake_on_connect,
                                   suppress_ragged_eofs=suppress_ragged_eofs, server_hostname=self.expected,
                                   session=session)


def client_context(ca_pem: str, cert: tuple[Path, Path] | None = None, expect: str = LEADER_NAME) -> ssl.SSLContext:
    """A context that accepts only a server whose certificate the lab's CA signed for the name ``expect``.

    The name, not the address: the pin names the lab, the CA signs ``leader.labq`` for its leader alone
    (and ``NODE.agent.labq`` for each agent), so a leader reached by any of its addresses, found over mDNS
    or typed, is still that lab's leader, and nothing else the CA signed can pose as it.
    ``cert`` is (certificate, key) for mutual TLS.
    """
    context = _Expecting(ssl.PROTOCOL_TLS_CLIENT)
    context.expected = expect
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=ca_pem)
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only to fetch the public CA certificate, checked against the pin
    return context


def fetch_ca(url: str, pin: str, timeout: float = 10.0) -> str:
    """The leader's CA certificate, fetched without a secret and checked against ``pin``; PinError if not."""
    from labq.transport import Request, socket_transport

    parts = urlsplit(url)
    if parts.scheme != "https":
        raise PinError(f"{url} is not an https:// address: a pinned leader speaks TLS")
    where = f"{parts.hostname}:{parts.port}"
    try:
        answer = socket_transport(Request("GET", f"{url.rstrip('/')}{CA_PATH}", timeout=timeout, tls=_unverified()))
        try:
            body = answer.read()[:MAX_CA_BYTES]
        finally:
            answer.close()
        pem = json.loads(body)["ca"] if answer.status == 200 else None
    except ssl.SSLError as err:
        raise PinError(f"the leader at {where} does not speak TLS as labq does ({err.reason or err})") from None
    except (ValueError, KeyError, TypeError):
        pem = None
    if not isinstance(pem, str):
        raise PinError(f"the server at {where} shows no labq CA certificate: it is not a labq leader")
    try:
        shown = fingerprint(pem)
    except ValueError:
        raise PinError(f"the server at {where} shows a CA certificate that cannot be read") from None
    if shown != pin:
        raise PinError(f"the leader at {where} presents CA {shown}, but this lab's pin is {pin}: refusing it "
                       "(another leader answers at that address; check the address, or the pin you were given)")
    return pem


def pinned_context(url: str, pin: str, cache: Path | None, timeout: float = 10.0,
                   cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context for the leader at ``url`` pinned to ``pin``; the CA is kept in ``cache`` (a folder)
    once fetched, so that later calls make no extra request."""
    kept = cache / f"ca-{pin.removeprefix('sha256:')[:32]}.pem" if cache is not None else None
    pem = None
    if kept is not None:
        try:
            pem = kept.read_text()
            if fingerprint(pem) != pin:
                pem = None
        except (OSError, ValueError):
            pem = None
    if pem is None:
        pem = fetch_ca(url, pin, timeout)
        if kept is not None:
            try:
                kept.parent.mkdir(parents=True, exist_ok=True)
                partial = kept.with_name(f"{kept.name}.{os.getpid()}")
                partial.write_text(pem)
                os.replace(partial, kept)
            except OSError:
                pass  # a read-only home: fetch again next time
    return client_context(pem, cert)
