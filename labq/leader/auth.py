"""Tokens: made at random, shown once, stored only as hashes."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

JOIN_TOKEN_FILE = "join-token"


@dataclass(frozen=True)
class Principal:
    """Who sent a request."""

    kind: str  #: "user", "agent", "join", or "scraper" (the metrics scrape token: `GET /metrics` alone)
    name: str
    admin: bool = False
    token_id: str | None = None  #: the user's token it came with (``labq.leader.tokens``)
    via: str | None = None  #: the agent that vouched for the user (on its machine's local socket)


def new_token(kind: str) -> str:
    return f"lq{kind[0]}_{secrets.token_urlsafe(32)}"
