"""People and tokens: who a request is from, the lab's users and its join token."""

from __future__ import annotations

import getpass

from labq.http_server import same_secret
from labq.leader.auth import JOIN_TOKEN_FILE, Principal, new_token, write_secret
from labq.leader.state import LabState
from labq.models.node import NodeHealth
from labq.protocol import errors
from labq.protocol.identity import join_token, parse_join_token, token_hash
from labq.protocol.requests import UserRequest
from labq.store import DeleteRecord, PutRecord

#: how long ``labq admin user add`` waits for the agents to say whether they have an account for the new user
ACCOUNTS_WAIT_S = 5.0


class Users:
    def __init__(self, state: LabState) -> None:
        self.state = state
        join = state.records.get("cluster", {}).get("join")
        self.join_hash: str | None = join["token_sha256"] if join else None

    def ensure_join_token(self) -> str:
        """The join token's hash; on a new lab, make the token and write it where agents on this machine find it."""
        if self.join_hash is None:
            token = new_token("join")
            write_secret(self.state.config.data_dir / JOIN_TOKEN_FILE, token)
            digest = token_hash(token)
            with self.state.lock:
                self.state.commit([PutRecord("cluster", "join", {"token_sha256": digest})])
            self.join_hash = digest
        return self.join_hash

    def pin_join_token(self, pin: str) -> None:
        """Put the lab CA's pin into the join-token file, so that agents given it trust only this leader."""
        path = self.state.config.data_dir / JOIN_TOKEN_FILE
        try:
            pinned, secret = parse_join_token(path.read_text())
        except (OSError, ValueError):
            return  # moved away or edited by hand: the admin hands out tokens some other way
        if pinned != pin and self.join_hash is not None and same_secret(token_hash(secret), self.join_hash):
            write_secret(path, join_token(pin, secret))

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise errors.unauthorized("this request needs a token (Authorization: Bearer ...); "
                                      "`labq admin user add NAME` makes one")
        digest = token_hash(token)
        state = self.state
        with state.lock:
            for name, user in state.users.items():
                if same_secret(user["token_sha256"], digest):
                    return Principal("user", name, user.get("admin", False))
            for name, session in state.agents.items():
                if same_secret(session.token_sha256, digest):
                    return Principal("agent", name)
            if self.join_hash is not None and same_secret(self.join_hash, digest):
                return Principal("join", "join")
        raise errors.unauthorized("unknown token: ask an admin for a new one (`labq admin user add NAME`)")

    def ensure_admin(self, name: str | None = None) -> tuple[str, str] | None:
        """On a fresh lab, make the person starting the leader its first admin: (name, token)."""
        with self.state.lock:
            if self.state.users:
                return None
            name = name or getpass.getuser()
            return name, self._set_user(name, admin=True)

    def _set_user(self, name: str, admin: bool) -> str:
        token = new_token("user")
        record = {"admin": admin, "token_sha256": token_hash(token), "created_at": self.state.clock()}
        self.state.commit([PutRecord("users", name, record)])
        self.state.users[name] = record
        return token

    def add(self, who: Principal, request: UserRequest) -> tuple[dict, str]:
        """Add the user (or give them a new token); the answer says which nodes have no account for them
        (``no_account_on``: node -> why) and which have not said yet (``not_heard_from``)."""
        admin_only(who, "add users")
        with self.state.lock:
            token = self._set_user(request.name, request.admin)
            self._tell_agents()
            return {"name": request.name, "admin": request.admin, **self._accounts_for(request.name)}, token

    def _tell_agents(self) -> None:
        """The lab's users changed: every agent's long poll answers now, with the new list to map."""
        for session in self.state.agents.values():
            session.version += 1
        self.state.changed.notify_all()

    def _accounts_for(self, user: str, wait_s: float = ACCOUNTS_WAIT_S) -> dict:
        """What the nodes say of ``user``'s account, after waiting (the lock is held, and released while
        waiting) up to ``wait_s`` for each agent that is in touch and reports accounts."""
        state = self.state

        def said(session) -> bool:
            return any(a.user == user for a in session.node.accounts)

        asked = [s for s in state.agents.values() if s.reports_accounts and s.node.health is not NodeHealth.LOST]
        state.changed.wait_for(lambda: all(said(s) for s in asked), timeout=wait_s)
        sessions = sorted(state.agents.values(), key=lambda s: s.name)
        return {"no_account_on": {s.name: problem for s in sessions
                                  if (problem := s.node.account_problem(user)) is not None},
                "not_heard_from": [s.name for s in sessions if not said(s)]}

    def remove(self, who: Principal, name: str) -> dict:
        admin_only(who, "remove users")
        with self.state.lock:
            if name not in self.state.users:
                raise errors.not_found(f"there is no user {name!r}")
            if name == who.name:
                raise errors.conflict("you cannot remove yourself; ask another admin")
            self.state.commit([DeleteRecord("users", name)])
            user = self.state.users.pop(name)
            self._tell_agents()
            return {"name": name, "admin": user.get("admin", False)}

    def listing(self, who: Principal) -> list[dict]:
        admin_only(who, "list users")
        with self.state.lock:
            return [{"name": n, "admin": u.get("admin", False)} for n, u in sorted(self.state.users.items())]


def user_only(who: Principal) -> None:
    if who.kind != "user":
        raise errors.forbidden("this needs a user's token")


def admin_only(who: Principal, what: str) -> None:
    user_only(who)
    if not who.admin:
        raise errors.forbidden(f"only admins may {what}")
