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


def lab_of(join_token: str) -> str:
    """The cluster id of the lab a join token admits to."""
    return cluster_id(token_hash(join_token))
