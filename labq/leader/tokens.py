"""People's tokens: made at random, shown once, kept only as hashes, each with an owner, a name and maybe an
expiry; an admin lists and revokes them (``labq admin token``).

A token's id is the first hex digits of its hash: public (it says nothing of the token) and stable, so
``token list`` can name what ``token revoke`` takes. Labs made before tokens had names kept one hash in
each user's record; those read here as the user's ``login`` token and are revoked by dropping the hash.
Nothing here logs or returns a token after ``create``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from labq.leader.auth import new_token
from labq.protocol.identity import token_hash
from labq.store import Change, DeleteRecord, PutRecord

TABLE = "tokens"
ID_DIGITS = 12
LOGIN = "login"  #: the name of the token ``labq admin user add`` makes (and replaces)


@dataclass(frozen=True)
class Token:
    id: str
    user: str
    name: str
    sha256: str
    created_at: float
    expires_at: float | None = None
    created_by: str = ""
    in_user_record: bool = False  #: a lab's old form: the hash kept in the user's record

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def record(self) -> dict:
        return {"user": self.user, "name": self.name, "token_sha256": self.sha256, "created_at": self.created_at,
                "expires_at": self.expires_at, "created_by": self.created_by}

    def public(self, now: float) -> dict:
        """What ``token list`` shows: never the hash."""
        return {"id": self.id, "user": self.user, "name": self.name, "created_at": self.created_at,
                "expires_at": self.expires_at, "created_by": self.created_by, "expired": self.expired(now)}


class Tokens:
    """The lab's tokens by hash. The caller holds the lab's lock and commits the changes these return."""

    def __init__(self, records: dict[str, dict], users: dict[str, dict]) -> None:
        self._by_hash: dict[str, Token] = {}
        for token_id, rec in records.items():
            self._add(Token(token_id, rec["user"], rec.get("name", LOGIN), rec["token_sha256"],
                            rec.get("created_at", 0.0), rec.get("expires_at"), rec.get("created_by", "")))
        for name, user in users.items():
            if user.get("token_sha256"):
                digest = user["token_sha256"]
                self._add(Token(digest[:ID_DIGITS], name, LOGIN, digest, user.get("created_at", 0.0),
                                in_user_record=True))

    def _add(self, token: Token) -> None:
        self._by_hash[token.sha256] = token

    def find(self, secret: str) -> Token | None:
        """The token whose hash ``secret`` has; the hashes are compared in constant time."""
        digest = token_hash(secret)
        token = self._by_hash.get(digest)
        if token is not None and hmac.compare_digest(token.sha256, digest):
            return token
        return None

    def by_id(self, token_id: str) -> Token | None:
        return next((t for t in self._by_hash.values() if t.id == token_id), None)

    def of(self, user: str | None = None) -> list[Token]:
        """The tokens of ``user`` (everyone's for None), oldest first."""
        return sorted((t for t in self._by_hash.values() if user is None or t.user == user),
                      key=lambda t: (t.user, t.created_at, t.id))

    def make(self, user: str, name: str, now: float, expires_at: float | None,
             created_by: str) -> tuple[Token, str, list[Change]]:
        """A new token: (its entry, the secret to show once, the changes to commit before ``take``)."""
        secret = new_token("user")
        digest = token_hash(secret)
        token = Token(digest[:ID_DIGITS], user, name, digest, now, expires_at, created_by)
        return token, secret, [PutRecord(TABLE, token.id, token.record())]

    def take(self, token: Token) -> None:
        """A made token, once committed, authenticates."""
        self._add(token)

    def removal(self, tokens: list[Token], users: dict[str, dict]) -> list[Change]:
        """The changes that revoke ``tokens``; ``drop`` them once committed. An old-form token is revoked by
        rewriting its user's record from ``users``; pass ``{}`` where the caller rewrites or deletes it."""
        changes: list[Change] = []
        for token in tokens:
            if token.in_user_record and token.user in users:
                record = {k: v for k, v in users[token.user].items() if k != "token_sha256"}
                changes.append(PutRecord("users", token.user, record))
            elif not token.in_user_record:
                changes.append(DeleteRecord(TABLE, token.id))
        return changes

    def drop(self, tokens: list[Token], users: dict[str, dict]) -> None:
        for token in tokens:
            self._by_hash.pop(token.sha256, None)
            if token.in_user_record and token.user in users:
                users[token.user] = {k: v for k, v in users[token.user].items() if k != "token_sha256"}
