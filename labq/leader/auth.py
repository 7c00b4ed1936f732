"""Tokens: made at random, shown once, stored only as hashes."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

JOIN_TOKEN_FILE = "join-token"


@dataclass(frozen=True)
class Principal:
    """Who sent a request."""

    kind: str  #: "user", "agent" or "join"
    name: str
    admin: bool = False
    token_id: str | None = None  #: the user's token it came with (``labq.leader.tokens``)
    via: str | None = None  #: the agent that vouched for the user (on its machine's local socket)


def new_token(kind: str) -> str:
    return f"lq{kind[0]}_{secrets.token_urlsafe(32)}"


def write_secret(path: Path, secret: str) -> None:
    """A file only its owner can read, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
