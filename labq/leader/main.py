"""Running the leader as a daemon: open the store, serve the API, stop everything in order."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labq.leader.auth import JOIN_TOKEN_FILE
from labq.leader.collector import freeze_after_full_collections
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.http import LeaderServer, serve
from labq.protocol.identity import cluster_id
from labq.store import StoreError, TinyDBStore, plan_recovery, recover

SWITCH_INTERVAL_S = 0.0005  #: see ``start_leader``

if TYPE_CHECKING:  # the module itself waits for a leader that serves TLS: it loads ``cryptography``
    from labq.leader.certs import ServingCertificate


class StartError(Exception):
    """The leader cannot start; the message says why and what to do."""


@dataclass
class RunningLeader:
    leader: Leader
    server: LeaderServer
    store: TinyDBStore
    thread: threading.Thread
    discovery: list = None  #: the mDNS advertiser and agent browser, once started

    @property
    def pin(self) -> str | None:
        """The lab CA's fingerprint when the leader serves TLS: what clients and agents pin."""
        return self.leader.tls_pin

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        scheme = "https" if self.server.tls is not None else "http"
        return f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"

    def stop(self) -> None:
        for part in self.discovery or ():
            part.close()
        self.server.shutdown()
        self.leader.stop()
        self.server.server_close()
        self.store.close()


def recover_first(data_dir: Path, confirm: Callable[[str], bool]) -> None:
    """``labq leader --recover``: say what going back to the last sound state loses, then do it."""
    try:
        plan = plan_recovery(data_dir)
    except StoreError as err:
        raise StartError(str(err)) from None
    if not confirm(plan.describe()):
        raise StartError("not recovering: nothing was changed")
    kept = recover(plan)
    print(f"recovered: the database is commit {plan.good_seq} again"
          + (f"; the damaged file is kept as {kept}" if kept else ""), file=sys.stderr)


def start_leader(config: LeaderConfig, *, first_admin: str | None = None) -> tuple[RunningLeader, str | None]:
    """Open the store and serve; returns the running leader and, on a new lab, the first admin's token."""
    try:
        store = TinyDBStore(config.data_dir)
    except StoreError as err:
        raise StartError(str(err)) from None
    try:
        leader = Leader(config, store)
        created = leader.ensure_admin(first_admin)
        serving = _serving_certificate(leader) if config.uses_tls else None
        try:
            server = serve(leader, config.host, config.port, serving)
        except OSError as err:
            raise StartError(f"cannot listen on {config.host}:{config.port}: {err.strerror}"
                             + (" (another leader running? choose another port with --listen)"
                                if err.errno == 98 else "")) from None
    except BaseException:
        store.close()
        raise
    # A long queue's pass is pure Python work in the scheduler thread; a request thread that wakes from its socket
    # or its fsync waits for the interpreter lock up to this long each time (5 ms by default: a submit wakes
    # several times, and waited tens of ms behind a pass at 30,000 queued)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    freeze_after_full_collections()  # a full collection walks what is new, not every job (labq.leader.collector)
    leader.start()
    if serving is not None:  # a supervised thread, as the scheduler's: ``Leader.check`` restarts it, stop ends it
        leader.workers.spawn("labq-tls-renewal", lambda: serving.keep_renewed(leader.stopping))
    thread = threading.Thread(target=server.serve_forever, name="labq-http", daemon=True)
    thread.start()
    return RunningLeader(leader, server, store, thread), created[1] if created else None


def _serving_certificate(leader: Leader) -> ServingCertificate:
    """The lab's CA (made on first start) and the leader's serving certificate, whose context the server
    uses and which renews itself in place while the leader runs (``labq.leader.certs.ServingCertificate``)."""
    from labq.leader.certs import LabCA, ServingCertificate

    config = leader.config
    try:
        ca = LabCA.load_or_create(config.data_dir, cluster_id(leader.users.ensure_join_token()))
        serving = ServingCertificate(ca, config.host)
    except (OSError, ValueError) as err:
        raise StartError(f"cannot set up TLS in {config.data_dir / 'tls'}: {err}") from None
    leader.use_tls(ca)
    return serving


def advertise(running: RunningLeader, name: str) -> None:
    """Announce the leader over mDNS and watch for agents, in the background: registering a
    name takes seconds, and discovery is only a hint, so a network without multicast loses nothing."""
    from labq.discovery import Advertiser, Browser

    leader = running.leader
    cluster = cluster_id(leader.users.ensure_join_token())
    running.discovery = []

    def seen(snapshot) -> None:
        leader.agents.seen_over_mdns({f.properties.get("node", f.name): {"url": f.url, "addresses": f.addresses,
                                                                         "cluster": f.cluster}
                                      for f in snapshot.values() if f.cluster == cluster})

    def start() -> None:
        try:
            running.discovery.append(Browser("agent", on_change=seen))
            port = running.server.server_address[1]
            properties = {"name": name, "cluster": cluster, **({"tls": "1"} if running.pin else {})}
            running.discovery.append(Advertiser("leader", name, port, properties).start())
        except Exception as err:  # no multicast here: agents pass --leader instead
            logging.getLogger("labq.leader").warning("cannot advertise over mDNS: %s", err)

    threading.Thread(target=start, name="labq-mdns", daemon=True).start()


def join_token_path(config: LeaderConfig) -> Path:
    return config.data_dir / JOIN_TOKEN_FILE


def configure_logging(level: str) -> None:
    """The daemons' log: one line a record, with anything a user or a peer wrote escaped."""
    from labq.log_text import EscapingFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
