"""mDNS discovery of labq leaders and agents: a hint, never a trust decision.

The leader advertises ``_labq-leader._tcp.local.`` and each agent ``_labq-agent._tcp.local.``
with TXT records (``version``, ``name``/``node``, ``gpus``, ``cluster``). An agent started without
``--leader`` browses for the leader of its cluster; the leader browses for agents so it can list
"seen but not admitted" nodes. Admission always needs the join token: anyone on the LAN can
advertise anything, and many campus networks drop multicast, so a static ``--leader`` must work.

Only this module imports zeroconf; the CLI fast path never imports it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import ifaddr
from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

from labq import __version__

SERVICE_TYPES = {"leader": "_labq-leader._tcp.local.", "agent": "_labq-agent._tcp.local."}
DEFAULT_TTL_S = 120
"""Record TTL we advertise. zeroconf's default for PTR/SRV/TXT is 4500 s, so a node whose link
dies without a goodbye would linger in every browser for 75 minutes; 120 s bounds that."""
SETTLE_S = 0.4
"""After the first match, wait this long so a second leader of the same cluster is seen too."""


class DiscoveryError(Exception):
    """mDNS found no usable leader, or an ambiguous one; the message says what to pass instead."""


@dataclass(frozen=True)
class Found:
    """One advertised service as a browser resolved it."""

    name: str  #: instance name (leader name or agent node name), without the service type
    url: str  #: ``http(s)://ADDR:PORT`` built from the first advertised IPv4 address
    cluster: str  #: cluster id from TXT (empty when absent)
    version: str  #: labq version of the advertiser
    addresses: tuple[str, ...]  #: every advertised IPv4 address
    properties: dict[str, str] = field(default_factory=dict)  #: all TXT records, decoded


VIRTUAL_PREFIXES = ("docker", "br-", "veth", "virbr", "cni", "flannel", "cali", "tailscale", "zt")
"""Container and overlay bridges: unreachable from the lab's LAN, yet on every GPU workstation."""


def _link_usable(name: str) -> bool:
    try:
        with open(f"/sys/class/net/{name}/operstate") as f:
            return f.read().strip() != "down"
    except OSError:
        return True  # not Linux, or no sysfs: trust the address list


def _default_route_interface() -> str | None:
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return None
    return next((r[0] for r in rows if len(r) > 1 and r[1] == "00000000"), None)


def host_addresses(interfaces: Iterable[str] | None = None) -> list[str]:
    """IPv4 addresses to advertise: the explicit list, else those of links that are up and not
    container bridges, the default-route one first (it becomes the url a finder uses); loopback
    only when it is all the host has, so a lone laptop still finds its own leader."""
    if interfaces is not None:
        return [str(ipaddress.IPv4Address(a)) for a in interfaces]
    default = _default_route_interface()
    ranked: list[tuple[int, str]] = []
    for adapter in ifaddr.get_adapters():
        name = adapter.name if isinstance(adapter.name, str) else adapter.nice_name
        if name.startswith(VIRTUAL_PREFIXES) or not _link_usable(name):
            continue
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.IPv4Address(ip.ip).is_loopback:
                ranked.append((0 if name == default else 1, ip.ip))
    found = list(dict.fromkeys(ip for _, ip in sorted(ranked, key=lambda r: r[0])))
    return found or ["127.0.0.1"]


def _label(text: str) -> str:
    """A DNS-safe host label (the SRV target) for an instance name."""
    return re.sub(r"[^A-Za-z0-9-]", "-", text).strip("-")[:50] or "labq"


class Advertiser:
    """Registers one labq service on start() and withdraws it (with goodbye packets) on close().

    Owns its Zeroconf instance so close() leaves no thread behind; safe to close twice.
    """

    def __init__(self, kind: str, name: str, port: int, properties: dict[str, str | int],
                 interfaces: Iterable[str] | None = None, ttl_s: int = DEFAULT_TTL_S) -> None:
        self.type_ = SERVICE_TYPES[kind]
        self.addresses = host_addresses(interfaces)
        props = {"version": __version__, **{k: str(v) for k, v in properties.items()}}
        self.info = ServiceInfo(
            self.type_, f"{name}.{self.type_}", port=port, properties=props,
            server=f"{_label(name)}-{port}.local.", host_ttl=ttl_s, other_ttl=ttl_s,
            addresses=[socket.inet_aton(a) for a in self.addresses])
        self._zc: Zeroconf | None = None

    def start(self) -> Advertiser:
        """Probe for a name conflict and announce; a taken instance name gets a suffix."""
        self._zc = Zeroconf(interfaces=self.addresses, ip_version=IPVersion.V4Only)
        try:
            self._zc.register_service(self.info, allow_name_change=True)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        zc, self._zc = self._zc, None
        if zc is None:
            return
        try:
            zc.unregister_service(self.info)
        finally:
            zc.close()

    def __enter__(self) -> Advertiser:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _found(info: ServiceInfo, type_: str) -> Found | None:
    addresses = tuple(info.parsed_addresses(IPVersion.V4Only))
    if not addresses or info.port is None:
        return None
    props = {(k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else "")
             for k, v in info.properties.items()}
    outside = [a for a in addresses if not ipaddress.IPv4Address(a).is_loopback] or list(addresses)
    scheme = "https" if props.get("tls") == "1" else "http"  # a hint: an agent that holds a pin uses TLS anyway
    return Found(name=info.name.removesuffix("." + type_), url=f"{scheme}://{outside[0]}:{info.port}",
                 cluster=props.get("cluster", ""), version=props.get("version", ""),
                 addresses=addresses, properties=props)


class Browser:
    """Keeps a live dict (instance name -> Found) of one kind of labq service.

    Goodbye packets (a node that closes its Advertiser) remove a service at once. A node whose
    link dies sends none, and python-zeroconf keeps a PTR record at least 1125 s whatever TTL was
    advertised, so the browser alone would show the ghost for 19 minutes. A checker thread
    therefore re-resolves every known service whose SRV/TXT/A records have expired (they honour
    the advertised TTL): no answer means gone; an answer for a dropped name brings it back.

    ``on_change`` receives a snapshot after every change; it runs on a zeroconf thread, so it must
    be quick (post to a queue, set a field).
    """

    def __init__(self, kind: str, on_change: Callable[[dict[str, Found]], None] | None = None,
                 interfaces: Iterable[str] | None = None, check_s: float = 2.0) -> None:
        self.type_ = SERVICE_TYPES[kind]
        self._on_change = on_change
        self._lock = threading.Lock()
        self._found: dict[str, Found] = {}
        self._known: set[str] = set()  # names the browser has seen and not seen leave (PTR alive)
        self._stop = threading.Event()
        self._zc = Zeroconf(interfaces=host_addresses(interfaces), ip_version=IPVersion.V4Only)
        self._browser = ServiceBrowser(self._zc, self.type_, handlers=[self._handle])
        self._checker = threading.Thread(target=self._check, args=(check_s,), daemon=True,
                                         name=f"labq-{kind}-liveness")
        self._checker.start()

    def _handle(self, zeroconf: Zeroconf, service_type: str, name: str,
                state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Removed:
            with self._lock:
                self._known.discard(name)
            self._update(name, None)
            return
        with self._lock:
            self._known.add(name)
        info = zeroconf.get_service_info(service_type, name, timeout=2000)
        self._update(name, _found(info, service_type) if info else None)

    def _update(self, name: str, found: Found | None) -> None:
        with self._lock:
            if self._found.get(name) == found:
                return
            if found is None:
                del self._found[name]
            else:
                self._found[name] = found
            snapshot = dict(self._found)
        if self._on_change:
            self._on_change(snapshot)

    def _check(self, check_s: float) -> None:
        while not self._stop.wait(check_s):
            with self._lock:
                names = sorted(self._known)
            for name in names:
                info = ServiceInfo(self.type_, name)
                if info.load_from_cache(self._zc) or (not self._stop.is_set()
                                                      and info.request(self._zc, 1000)):
                    self._update(name, _found(info, self.type_))
                else:
                    self._update(name, None)

    def services(self) -> dict[str, Found]:
        with self._lock:
            return dict(self._found)

    def close(self) -> None:
        self._stop.set()
        self._browser.cancel()
        self._checker.join()
        self._zc.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find(kind: str, timeout_s: float, match: Callable[[Found], bool]) -> list[Found]:
    """Browse until something matches and SETTLE_S has passed, or timeout_s is over."""
    seen = threading.Event()
    with Browser(kind, lambda found: any(map(match, found.values())) and seen.set()) as browser:
        deadline = time.monotonic() + timeout_s
        if seen.wait(timeout_s):
            time.sleep(max(0.0, min(SETTLE_S, deadline - time.monotonic())))
        return sorted((f for f in browser.services().values() if match(f)), key=lambda f: f.name)


def find_leaders(timeout_s: float = 3.0, cluster: str | None = None) -> list[Found]:
    """Leaders on the LAN (of one cluster when given); returns early once one is seen."""
    return _find("leader", timeout_s, lambda f: cluster is None or f.cluster == cluster)


def find_agents(timeout_s: float = 3.0, cluster: str | None = None) -> list[Found]:
    """Agents advertising on the LAN (of one cluster when given)."""
    return _find("agent", timeout_s, lambda f: cluster is None or f.cluster == cluster)


def pick_leader(found: list[Found], cluster: str | None = None, waited_s: float = 3.0) -> Found:
    """The one leader to talk to, or a DiscoveryError that tells the user what to pass instead."""
    leaders = [f for f in found if cluster is None or f.cluster == cluster]
    if not leaders:
        of = f" of cluster {cluster}" if cluster else ""
        raise DiscoveryError(
            f"no labq leader{of} found over mDNS in {waited_s:g} s; the network may drop "
            "multicast: pass --leader http://HOST:7733")
    by_cluster: dict[str, list[Found]] = {}
    for f in leaders:
        by_cluster.setdefault(f.cluster, []).append(f)
    for cid, same in sorted(by_cluster.items()):
        if len(same) > 1:
            names = " and ".join(f"{f.name} ({f.url})" for f in same)
            raise DiscoveryError(f"two leaders advertise cluster {cid}: {names}; pass --leader")
    if len(leaders) > 1:
        names = ", ".join(f"{f.name} (cluster {f.cluster}, {f.url})" for f in leaders)
        raise DiscoveryError(f"leaders of {len(leaders)} clusters found: {names}; pass --leader")
    return leaders[0]
