"""A lab's public identity, derived from its join token: pure, so leaders and agents agree on it
without exchanging anything, and it says nothing about the token itself."""

from __future__ import annotations

import hashlib


def token_hash(token: str) -> str:
    """What a leader stores of a token: its SHA-256, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def cluster_id(join_token_sha256: str) -> str:
    """A short public name for a lab, from the hash of its join token (mDNS adverts carry it)."""
    return hashlib.sha256(join_token_sha256.encode()).hexdigest()[:12]


#: the header in which an agent names the lab user it vouches for (its machine's local socket; the leader
#: takes it from an agent alone)
USER_HEADER = "X-Labq-User"

JOIN_PREFIX = "labq-join:v1:"


def join_token(pin: str | None, secret: str) -> str:
    """What an admin copies to a new workstation: the lab CA's pin and the secret (only the secret without TLS)."""
    return f"{JOIN_PREFIX}{pin}:{secret}" if pin else secret


def parse_join_token(text: str) -> tuple[str | None, str]:
    """(the lab CA's pin or None, the secret) of a join token; ValueError for one that cannot be read."""
    text = text.strip()
    if not text.startswith(JOIN_PREFIX):
        return None, text  # a lab without TLS: the secret alone
    pin, sep, secret = text[len(JOIN_PREFIX):].rpartition(":")
    if not sep or not pin.startswith("sha256:") or len(pin) != 71 or not secret:
        raise ValueError("a join token looks like labq-join:v1:sha256:<64 hex digits>:<secret>")
    return pin.lower(), secret


def lab_of(join_token: str) -> str:
    """The cluster id of the lab a join token admits to: a one-time token's secret starts with it
    (``CLUSTER.RANDOM``, ``labq.leader.joins``), the lab's own token hashes to it."""
    secret = parse_join_token(join_token)[1]
    cluster, dot, _ = secret.partition(".")
    if dot and len(cluster) == 12 and all(c in "0123456789abcdef" for c in cluster):
        return cluster
    return cluster_id(token_hash(secret))
