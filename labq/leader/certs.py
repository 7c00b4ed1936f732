"""The lab's certificate authority, kept by the leader in ``<data>/tls/``.

On first start: a CA (EC P-256, ten years) and the leader's serving certificate signed by it, for the
leader's names and addresses, one year, renewed by the leader itself when less than ``RENEW_BEFORE_S``
is left or a name or address is missing (agents and clients trust the CA, so nothing else changes). Keys
are 0600, written whole or not at all (``labq.paths.write_secret``). The serving certificate alone may serve (``serverAuth``); the
certificates the CA signs for agents are for clients only, so an agent cannot pose as its leader.

A leader runs for months, so the renewal also happens while it runs (``ServingCertificate``): a new
context with the new chain takes the old one's place for new handshakes, and connections already open
keep the certificate they were shown.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from labq.paths import write_secret
from labq.tls import LEADER_NAME, agent_name, fingerprint
from labq.workers import Backoff, RetryLog

CA_DAYS = 3650
SERVING_DAYS = 365
AGENT_DAYS = 365
RENEW_BEFORE_S = 30 * 86400
#: how often a running leader looks at its serving certificate: twice a day, against a month of warning
CHECK_EVERY_S = 12 * 3600
TLS_DIR = "tls"

log = logging.getLogger("labq.leader")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class LabCA:
    folder: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.cert_pem)

    @classmethod
    def load_or_create(cls, data_dir: Path, lab_name: str, now: datetime.datetime | None = None) -> LabCA:
        folder = data_dir / TLS_DIR
        cert_path, key_path = folder / "ca.pem", folder / "ca.key"
        if cert_path.exists() and key_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            return cls(folder, x509.load_pem_x509_certificate(cert_path.read_bytes()), key)
        now = now or datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"labq lab CA {lab_name}"[:64])])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        write_secret(key_path, _key_pem(key).decode())
        write_secret(cert_path, cert.public_bytes(serialization.Encoding.PEM).decode())
        return cls(folder, cert, key)

    def issue(self, common_name: str, *, serving: bool, names: tuple[str, ...] = (),
              addresses: tuple[str, ...] = (), days: int = SERVING_DAYS,
              now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for ``common_name``: for serving (the leader) or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.SERVER_AUTH if serving else ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = self._sign(key.public_key(), common_name, usages, names, addresses, days, now)
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    def sign_agent(self, request_pem: str, node: str, now: datetime.datetime | None = None) -> str:
        """The certificate of the agent of ``node``, for the key of its signing request (the key never leaves
        the agent's machine): a client of the leader, and the server of its own logs as ``NODE.agent.labq``,
        a name no leader's certificate has, so an agent can pose as neither its leader nor another agent.
        ValueError for a request that is not one, or not signed by its own key."""
        try:
            request = x509.load_pem_x509_csr(request_pem.encode())
        except ValueError:
            raise ValueError("the certificate signing request cannot be read") from None
        if not request.is_signature_valid:
            raise ValueError("the certificate signing request is not signed by its key")
        key = request.public_key()
        if not isinstance(key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
            raise ValueError("the certificate signing request's key is neither EC nor RSA")
        cert = self._sign(key, node, [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
                          (agent_name(node),), (), AGENT_DAYS, now)
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    def _sign(self, public_key, common_name: str, usages: list, names: tuple[str, ...], addresses: tuple[str, ...],
              days: int, now: datetime.datetime | None) -> x509.Certificate:
        now = now or datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
                   .issuer_name(self.cert.subject).public_key(public_key)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                                  critical=False))
        sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(self.key, hashes.SHA256())


def leader_names(host: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names and addresses the leader's certificate is for: this machine's, loopback, the listen address."""
    names = {"localhost", socket.gethostname(), LEADER_NAME}
    addresses = {"127.0.0.1", "::1"}
    try:
        names.add(socket.getfqdn())
        for info in socket.getaddrinfo(socket.gethostname(), None):
            addresses.add(info[4][0].split("%")[0])
    except OSError:
        pass
    if host and host not in ("0.0.0.0", "::", ""):
        try:
            addresses.add(str(ipaddress.ip_address(host)))
        except ValueError:
            names.add(host)
    return tuple(sorted(n for n in names if n)), tuple(sorted(addresses))


def serving_files(ca: LabCA, host: str, now: datetime.datetime | None = None) -> tuple[Path, Path]:
    """The leader's serving certificate (with the CA after it) and key, made or renewed as needed."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    cert_path, key_path = ca.folder / "leader.pem", ca.folder / "leader.key"
    names, addresses = leader_names(host)
    if _why_renew(ca, cert_path, key_path, names, addresses, now) is not None:
        _write_serving(ca, cert_path, key_path, names, addresses, now)
    return cert_path, key_path


def _why_renew(ca: LabCA, cert_path: Path, key_path: Path, names: tuple[str, ...], addresses: tuple[str, ...],
               now: datetime.datetime) -> str | None:
    """Why the serving certificate on disk must be made again (for the log), or None while it is good."""
    if not (cert_path.exists() and key_path.exists()):
        return "there is none"
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return "it is unreadable"  # or odd: make a new one
    has = set(sans.get_values_for_type(x509.DNSName)) | {str(a) for a in sans.get_values_for_type(x509.IPAddress)}
    left = (cert.not_valid_after_utc - now).total_seconds()
    if left <= RENEW_BEFORE_S:
        return f"{max(left, 0) / 86400:.0f} days were left"
    missing = (set(names) | set(addresses)) - has
    if missing:
        return f"it lacked {', '.join(sorted(missing))}"
    if cert.issuer != ca.cert.subject:
        return "another CA had signed it"
    return None


def _write_serving(ca: LabCA, cert_path: Path, key_path: Path, names: tuple[str, ...], addresses: tuple[str, ...],
                   now: datetime.datetime) -> None:
    cert_pem, key_pem = ca.issue("labq leader", serving=True, names=names, addresses=addresses, now=now)
    write_secret(key_path, key_pem.decode())
    write_secret(cert_path, cert_pem.decode() + ca.cert_pem)


def server_context(ca: LabCA, cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """The leader's side: its certificate chain; a client certificate of the lab's CA is asked for, not
    required (people's clients have tokens, agents present theirs)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_path, key_path)
    context.load_verify_locations(cadata=ca.cert_pem)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


class ServingCertificate:
    """The leader's serving certificate while it runs, renewed in place.

    The server wraps every accepted connection with this object (``wrap_socket``), which hands it to its
    current context; a renewal makes a new context and puts it in place in one assignment, so new
    handshakes present the new certificate, none ever sees a context half loaded, no restart is needed,
    and no open connection is cut off (an agent's long poll goes on with the certificate it was shown).
    Agents and clients pin the CA, not this certificate, so they take the new one without a word.
    """

    def __init__(self, ca: LabCA, host: str, now: datetime.datetime | None = None) -> None:
        self.ca, self.host = ca, host
        self.cert_path, self.key_path = serving_files(ca, host, now)
        self.context = server_context(ca, self.cert_path, self.key_path)
        #: the certificate new connections are shown
        self.serving = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        self._lock = threading.Lock()

    def renew_if_due(self, now: datetime.datetime | None = None) -> bool:
        """Make a new certificate when ``serving_files`` would (less than ``RENEW_BEFORE_S`` left, a name or
        address missing, another issuer) and serve it from the next handshake on; True when it did.

        The certificate on disk is also served when it is not the one served now (a load that failed after
        the files were written is taken up at the next check rather than never).
        """
        now = now or datetime.datetime.now(datetime.timezone.utc)
        with self._lock:
            names, addresses = leader_names(self.host)
            why = _why_renew(self.ca, self.cert_path, self.key_path, names, addresses, now)
            if why is not None:
                _write_serving(self.ca, self.cert_path, self.key_path, names, addresses, now)
            on_disk = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            if on_disk == self.serving:
                return False
            self.context = server_context(self.ca, self.cert_path, self.key_path)  # whole, then in place
            self.serving = on_disk
        log.info("renewed the leader's TLS certificate (%s): serial %x, valid until %s; the lab CA is unchanged",
                 why or "a new one was on disk", on_disk.serial_number, on_disk.not_valid_after_utc.isoformat())
        return True

    def wrap_socket(self, sock, server_side: bool = True, **options):
        """A connection the server accepted, over TLS with the certificate served now."""
        return self.context.wrap_socket(sock, server_side=server_side, **options)

    def keep_renewed(self, stopping: threading.Event, every_s: float = CHECK_EVERY_S) -> None:
        """The renewal thread's body: a look every ``every_s`` until ``stopping``; a failed look (a full
        disk, say) is logged and tried again after a backoff, never the end of the thread."""
        backoff = Backoff(first=min(60.0, every_s), cap=min(3600.0, every_s))
        trouble = RetryLog(log, "cannot renew the leader's TLS certificate")
        wait = every_s  # the leader has just made or checked it at start
        while not stopping.wait(wait):
            try:
                self.renew_if_due()
            except Exception as err:  # noqa: BLE001 - the certificate has a month of margin: say so, try again
                trouble.failed(err)
                wait = backoff.next()
            else:
                trouble.ok()
                backoff.reset()
                wait = every_s
