"""People and tokens: who a request is from, the lab's users, their tokens and the join token."""

from __future__ import annotations

import getpass

from labq.http_server import same_secret
from labq.leader.auth import JOIN_TOKEN_FILE, Principal, new_token
from labq.paths import write_secret
from labq.leader.state import LabState
from labq.leader.joins import Joins
from labq.leader.tokens import LOGIN, Tokens
from labq.models.node import NodeHealth
from labq.protocol import errors
from labq.protocol.identity import cluster_id, join_token, parse_join_token, token_hash
from labq.protocol.requests import TokenRequest, UserRequest
from labq.store import DeleteRecord, PutRecord

#: how long ``labq admin user add`` waits for the agents to say whether they have an account for the new user
ACCOUNTS_WAIT_S = 5.0


class Users:
    def __init__(self, state: LabState) -> None:
        self.state = state
        join = state.records.get("cluster", {}).get("join")
        self.join_hash: str | None = join["token_sha256"] if join else None
        self.tokens = Tokens(state.records.get("tokens", {}), state.users)
        self.joins = Joins(state.records.get("joins", {}))

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

    def authenticate(self, token: str | None, vouched_for: str | None = None,
                     certificate: str | None = None) -> Principal:
        """Who sent a request with ``token``, over a connection that showed the lab's ``certificate`` (its
        SHA-256: an agent's). With ``vouched_for`` (``X-Labq-User``), an agent's request for a person on its
        machine, who is then the principal (only an agent may vouch). In a TLS lab an agent is its certificate:
        its token alone, read on the wire or from its memory, is refused."""
        state = self.state
        with state.view:
            agent = self._agent_with(certificate)
            if not token and agent is None:
                if vouched_for is not None:
                    raise errors.unauthorized("only a labq agent may vouch for a user (X-Labq-User), as itself")
                raise errors.unauthorized("this request needs a token (Authorization: Bearer ...); "
                                          "`labq admin user add NAME` makes one")
            if token:
                found = self.tokens.find(token)
                if found is not None and found.user in state.users:
                    if found.expired(state.clock()):
                        raise errors.unauthorized(f"this token ({found.name}, id {found.id}) has expired: ask an "
                                                  f"admin for a new one (`labq admin token create {found.user}`)")
                    if vouched_for is not None:
                        raise errors.forbidden("only a labq agent may vouch for a user (X-Labq-User); a user's "
                                               "token speaks for its user alone")
                    return Principal("user", found.user, state.users[found.user].get("admin", False), found.id)
                agent = self._agent_token(token, agent)
                if agent is None:
                    return self._join(token)
            return self._vouched(agent, vouched_for) if vouched_for is not None else Principal("agent", agent)

    def _agent_with(self, certificate: str | None) -> str | None:
        """The node whose agent's certificate has the SHA-256 ``certificate`` (the view is held)."""
        if certificate is None:
            return None
        return next((name for name, s in self.state.agents.items()
                     if s.cert_sha256 is not None and same_secret(s.cert_sha256, certificate)), None)

    def _agent_token(self, token: str, shown: str | None) -> str | None:
        """The node whose agent's token ``token`` is, None for none; 401 when that agent holds a certificate and
        this connection did not show it (the view is held)."""
        digest = token_hash(token)
        for name, session in self.state.agents.items():
            if same_secret(session.token_sha256, digest):
                if session.cert_sha256 is not None and shown != name:
                    raise errors.unauthorized(f"agent {name}'s token works only with its certificate, and this "
                                              "connection did not show it")
                return name
        if shown is not None:
            raise errors.unauthorized(f"agent {shown}'s certificate came with a token that is not its own")
        return None

    def _join(self, secret: str) -> Principal:
        """The lab's join token, or a one-time one (``labq.leader.joins``); 401 for anything else."""
        if self.join_hash is not None and same_secret(self.join_hash, token_hash(secret)):
            return Principal("join", "lab")
        once = self.joins.find(secret)
        if once is not None:
            return Principal("join", once.id)
        raise errors.unauthorized("unknown token: ask an admin for a new one (`labq admin user add NAME`)")

    def _vouched(self, node: str, user: str) -> Principal:
        """A person on node ``node``, as its agent vouches (the view is held): with a user's rights, never an
        admin's, so that one workstation's agent cannot run the lab."""
        record = self.state.users.get(user)
        if record is None:
            raise errors.ApiError(401, "unknown_user", f"{user} (on {node}) is not a labq user: an admin adds them "
                                                       f"with `labq admin user add {user}`")
        return Principal("user", user, False, via=node)  # an admin's rights need the admin's own token

    def still_valid(self, who: Principal) -> bool:
        """Whether the token ``who`` authenticated with still would (not revoked, not expired): event streams
        ask this, so that a revoked token's streams end."""
        with self.state.view:
            if who.kind == "user" and who.name not in self.state.users:
                return False  # removed
            if who.token_id is None:
                return True
            token = self.tokens.by_id(who.token_id)
            return token is not None and token.user in self.state.users and not token.expired(self.state.clock())

    def ensure_admin(self, name: str | None = None) -> tuple[str, str] | None:
        """On a fresh lab, make the person starting the leader its first admin: (name, token)."""
        with self.state.lock:
            if self.state.users:
                return None
            name = name or getpass.getuser()
            return name, self._set_user(name, admin=True)

    def _set_user(self, name: str, admin: bool, by: str = "") -> str:
        """Add or update the user and give them a new ``login`` token, replacing the old one."""
        state = self.state
        now = state.clock()
        record = {k: v for k, v in state.users.get(name, {"created_at": now}).items() if k != "token_sha256"}
        record["admin"] = admin
        old = [t for t in self.tokens.of(name) if t.name == LOGIN]
        token, secret, changes = self.tokens.make(name, LOGIN, now, None, by or name)
        # the new record holds no old hash: only the old tokens kept apart are deleted
        state.commit([PutRecord("users", name, record), *changes, *self.tokens.removal(old, {})])
        self.tokens.drop(old, {})
        state.users[name] = record
        self.tokens.take(token)
        if old:
            state.events.interrupt()
        return secret

    def add(self, who: Principal, request: UserRequest) -> tuple[dict, str]:
        """Add the user (or give them a new token); the answer says which nodes have no account for them
        (``no_account_on``: node -> why) and which have not said yet (``not_heard_from``)."""
        admin_only(who, "add users")
        with self.state.lock:
            token = self._set_user(request.name, request.admin, who.name)
            self._tell_agents()
        with self.state.view:  # the agents' answers are changes: they must not wait for this wait
            return {"name": request.name, "admin": request.admin, **self._accounts_for(request.name)}, token

    def _tell_agents(self) -> None:
        """The lab's users changed: every agent's long poll answers now, with the new list to map."""
        for session in self.state.agents.values():
            session.version += 1
        self.state.changed.notify_all()

    def _accounts_for(self, user: str, wait_s: float = ACCOUNTS_WAIT_S) -> dict:
        """What the nodes say of ``user``'s account, after waiting (the view is held, and let go while waiting)
        up to ``wait_s`` for each agent that is in touch and reports accounts."""
        state = self.state

        def said(session) -> bool:
            return any(a.user == user for a in session.node.accounts)

        asked = [s for s in state.agents.values() if s.reports_accounts and s.node.health is not NodeHealth.LOST]
        state.lock.wait_for(lambda: all(said(s) for s in asked), timeout=wait_s)
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
            tokens = self.tokens.of(name)
            self.state.commit([DeleteRecord("users", name),
                               *self.tokens.removal(tokens, {})])
            self.tokens.drop(tokens, {})
            user = self.state.users.pop(name)
            self._tell_agents()
            self.state.events.interrupt()
            return {"name": name, "admin": user.get("admin", False)}

    def listing(self, who: Principal) -> list[dict]:
        admin_only(who, "list users")
        with self.state.view:
            return [{"name": n, "admin": u.get("admin", False)} for n, u in sorted(self.state.users.items())]


    # -- tokens ---------------------------------------------------------------------------

    def create_token(self, who: Principal, request: TokenRequest) -> tuple[dict, str]:
        """A new token for ``request.user`` (admins): (what ``token list`` shows of it, the secret, shown once)."""
        admin_only(who, "create tokens")
        state = self.state
        with state.lock:
            if request.user not in state.users:
                raise errors.not_found(f"there is no user {request.user!r}: add them first (`labq admin user add "
                                       f"{request.user}`)")
            now = state.clock()
            if any(t.name == request.name and not t.expired(now) for t in self.tokens.of(request.user)):
                raise errors.conflict(f"{request.user} has a token named {request.name!r} already: revoke it or "
                                      "choose another --name")
            expires = now + request.expires_s if request.expires_s else None
            token, secret, changes = self.tokens.make(request.user, request.name, now, expires, who.name)
            state.commit(changes)
            self.tokens.take(token)
            return token.public(now), secret

    def token_listing(self, who: Principal, user: str | None = None) -> list[dict]:
        """Everyone's tokens for an admin (or ``user``'s); a user sees their own."""
        user_only(who)
        if not who.admin:
            if user not in (None, who.name):
                raise errors.forbidden("only admins may list other users' tokens")
            user = who.name
        with self.state.view:
            now = self.state.clock()
            return [{**t.public(now), "this_request": t.id == who.token_id} for t in self.tokens.of(user)]

    def revoke_token(self, who: Principal, token_id: str) -> dict:
        """Revoke a token (an admin any, a user their own): it fails on its next request and its event streams
        end now."""
        user_only(who)
        state = self.state
        with state.lock:
            token = self.tokens.by_id(token_id)
            if token is None or not who.admin and token.user != who.name:
                raise errors.not_found(f"there is no token {token_id!r}" + ("" if who.admin else " of yours")
                                       + " (`labq admin token list` shows their ids)")
            state.commit(self.tokens.removal([token], state.users))
            self.tokens.drop([token], state.users)
            found = token.public(state.clock())
        state.events.interrupt()
        return found


    # -- one-time join tokens ---------------------------------------------------------------

    def create_join(self, who: Principal, node: str | None, expires_s: float) -> tuple[dict, str]:
        """A join token for one agent (admins): (what ``join list`` shows of it, the token to hand over)."""
        admin_only(who, "make join tokens")
        state = self.state
        with state.lock:
            if node is not None and (s := state.agents.get(node)) is not None and s.cert_sha256 is not None:
                raise errors.conflict(f"node {node} has joined already: `labq admin node forget {node}` first, if "
                                      "that machine was reinstalled")
            now = state.clock()
            join, secret, changes = self.joins.make(cluster_id(self.ensure_join_token()), now, expires_s, who.name,
                                                    node)
            state.commit(changes)
            self.joins.take(join)
            return join.public(now), secret

    def join_listing(self, who: Principal) -> list[dict]:
        admin_only(who, "list join tokens")
        with self.state.view:
            return self.joins.listing(self.state.clock())

    def revoke_join(self, who: Principal, join_id: str) -> dict:
        admin_only(who, "revoke join tokens")
        state = self.state
        with state.lock:
            join, changes = self.joins.revoke(join_id)
            state.commit(changes)
            self.joins.drop(join)
            return join.public(state.clock())


def user_only(who: Principal) -> None:
    if who.kind != "user":
        raise errors.forbidden("this needs a user's token")


def admin_only(who: Principal, what: str) -> None:
    user_only(who)
    if not who.admin:
        raise errors.forbidden(f"only admins may {what}")
