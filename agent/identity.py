"""The agent's own certificate: a key made on this machine and never sent, signed by the lab's CA at join.

With it the agent speaks mutual TLS to its leader, and serves job logs over TLS as ``NODE.agent.labq``;
the join secret is needed only for the first join of a node name. The files live in the agent's state
folder, ``tls/agent.key`` (0600) and ``tls/agent.pem``.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from labq.paths import write_secret

#: a certificate with less than this left is replaced at the agent's next join
RENEW_BEFORE_S = 30 * 86400


class AgentIdentity:
    def __init__(self, folder: Path, node: str) -> None:
        self.folder, self.node = folder, node
        self.key_path, self.cert_path = folder / "agent.key", folder / "agent.pem"

    def _key(self) -> ec.EllipticCurvePrivateKey:
        try:
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
            if isinstance(key, ec.EllipticCurvePrivateKey):
                return key
        except (OSError, ValueError):
            pass  # none yet, or unreadable: a new one (the certificate of the old one is no use without it)
        key = ec.generate_private_key(ec.SECP256R1())
        write_secret(self.key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()).decode())
        return key

    def request(self) -> str:
        """A certificate signing request (PEM) for this node's name, with this machine's key."""
        key = self._key()
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.node[:64])]))
               .sign(key, hashes.SHA256()))
        return csr.public_bytes(serialization.Encoding.PEM).decode()

    def save(self, cert_pem: str) -> None:
        """Keep the certificate the leader signed: it must be for this node and this machine's key."""
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names or names[0].value != self.node[:64]:
            raise ValueError(f"the leader sent a certificate for {names[0].value if names else 'nobody'!r}, "
                             f"not for {self.node!r}")
        if cert.public_key() != self._key().public_key():
            raise ValueError("the leader sent a certificate for another key than this machine's")
        write_secret(self.cert_path, cert_pem.strip())

    def files(self, now: datetime.datetime | None = None) -> tuple[Path, Path] | None:
        """(certificate, key) while a certificate for this node and key is kept and valid; else None."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        try:
            cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        except (OSError, ValueError):
            return None
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not names or names[0].value != self.node[:64] or cert.public_key() != key.public_key():
            return None
        if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
            return None
        return self.cert_path, self.key_path

    def due(self, now: datetime.datetime | None = None) -> bool:
        """Whether to ask for a new certificate at the next join (none, or one near its end)."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        if self.files(now) is None:
            return True
        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        return (cert.not_valid_after_utc - now).total_seconds() < RENEW_BEFORE_S
