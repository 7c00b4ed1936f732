"""Join tokens for one workstation each (``labq admin join create``): used by one agent, then spent.

The lab's own join token (the file in the leader's data folder) admits any new node name; it is for the
leader's machine and for labs that copy it on purpose. A token made here admits one agent: the first
node name that joins with it (or the one it was made for) holds it, and any other name is refused, so a
copy that leaks after the workstation joined admits nobody. It expires unjoined after a while (24 h by
default). Its secret starts with the lab's cluster id, which is public (mDNS adverts carry it), so an
agent given it finds its leader as with the lab's token.

Once a node has joined it holds a certificate of the lab's CA, and no join token of any kind can take its
name (``labq admin node forget NAME`` lets a reinstalled machine join again).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, replace

from labq.protocol import errors
from labq.protocol.identity import token_hash
from labq.store import Change, DeleteRecord, PutRecord

TABLE = "joins"
ID_DIGITS = 12


@dataclass(frozen=True)
class OneTimeJoin:
    id: str
    sha256: str
    created_at: float
    expires_at: float
    created_by: str
    node: str | None = None  #: the only name that may join with it, when the admin named one
    used_by: str | None = None  #: the name that joined with it

    def record(self) -> dict:
        return {"token_sha256": self.sha256, "created_at": self.created_at, "expires_at": self.expires_at,
                "created_by": self.created_by, "node": self.node, "used_by": self.used_by}

    def public(self, now: float) -> dict:
        return {"id": self.id, "node": self.node, "used_by": self.used_by, "created_at": self.created_at,
                "expires_at": self.expires_at, "created_by": self.created_by,
                "expired": self.used_by is None and now >= self.expires_at}


class Joins:
    """The lab's one-time join tokens by hash. The caller holds the lab's lock and commits what these return."""

    def __init__(self, records: dict[str, dict]) -> None:
        self._by_hash = {rec["token_sha256"]: OneTimeJoin(i, rec["token_sha256"], rec["created_at"],
                                                          rec["expires_at"], rec.get("created_by", ""),
                                                          rec.get("node"), rec.get("used_by"))
                         for i, rec in records.items()}

    def find(self, secret: str) -> OneTimeJoin | None:
        digest = token_hash(secret)
        found = self._by_hash.get(digest)
        return found if found is not None and hmac.compare_digest(found.sha256, digest) else None

    def find_id(self, join_id: str) -> OneTimeJoin:
        found = next((j for j in self._by_hash.values() if j.id == join_id), None)
        if found is None:
            raise errors.unauthorized("this join token was revoked")
        return found

    def listing(self, now: float) -> list[dict]:
        return [j.public(now) for j in sorted(self._by_hash.values(), key=lambda j: (j.created_at, j.id))]

    def make(self, cluster: str, now: float, expires_s: float, created_by: str,
             node: str | None) -> tuple[OneTimeJoin, str, list[Change]]:
        secret = f"{cluster}.{secrets.token_urlsafe(32)}"
        digest = token_hash(secret)
        join = OneTimeJoin(digest[:ID_DIGITS], digest, now, now + expires_s, created_by, node)
        return join, secret, [PutRecord(TABLE, join.id, join.record())]

    def take(self, join: OneTimeJoin) -> None:
        self._by_hash[join.sha256] = join

    def spend(self, join: OneTimeJoin, node: str, now: float) -> tuple[OneTimeJoin, list[Change]]:
        """``node`` joins with ``join``: the spent token and what to commit; 401/403 with why it may not."""
        if join.used_by is not None and join.used_by != node:
            raise errors.forbidden(f"this join token was used by {join.used_by} already: it admits one agent "
                                   "(an admin makes another with `labq admin join create`)")
        if join.node is not None and join.node != node:
            raise errors.forbidden(f"this join token is for node {join.node}, not {node}")
        if join.used_by is None and now >= join.expires_at:
            raise errors.unauthorized("this join token expired before it was used: an admin makes another with "
                                      "`labq admin join create`")
        spent = replace(join, used_by=node)
        return spent, ([] if spent == join else [PutRecord(TABLE, join.id, spent.record())])

    def revoke(self, join_id: str) -> tuple[OneTimeJoin, list[Change]]:
        found = next((j for j in self._by_hash.values() if j.id == join_id), None)
        if found is None:
            raise errors.not_found(f"there is no join token {join_id!r} (`labq admin join list` shows them)")
        return found, [DeleteRecord(TABLE, found.id)]

    def drop(self, join: OneTimeJoin) -> None:
        self._by_hash.pop(join.sha256, None)
