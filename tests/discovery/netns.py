"""Test hosts in Linux network namespaces, joined by one bridge: a tiny LAN with real multicast.

Layout for a lab of N hosts (all names carry a random tag so parallel workers never collide):

    lqt-TAG-br   holds bridge br0 (multicast snooping off) and the bridge ends v0..vN-1
    lqt-TAG-0..  each holds lo and eth0 = 10.231.S.(10+i)/24, with 224.0.0.0/4 routed to eth0

Nothing is created in the root namespace, so the host's own network is never touched. Needs root
and iproute2; otherwise the tests that use it skip with the reason (and fail under CI, ``CI=true``).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import unavailable

PREFIX = "lqt-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def _namespaces() -> set[str]:
    out = _ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _free_subnet() -> int:
    """A third octet S such that 10.231.S.0/24 is not on any of the host's interfaces."""
    used = _ip("-4", "-o", "addr", check=False).stdout
    nets = [ipaddress.ip_interface(w).network for line in used.splitlines()
            for i, w in enumerate(line.split()) if i > 0 and line.split()[i - 1] == "inet"]
    for _ in range(64):
        s = secrets.randbelow(254) + 1
        net = ipaddress.ip_network(f"10.231.{s}.0/24")
        if not any(net.overlaps(n) for n in nets):
            return s
    raise RuntimeError("no free /24 in 10.231.0.0/16")


@dataclass
class NetLab:
    """N hosts on one bridged LAN; processes started with run_in are ended on close."""

    tag: str
    subnet: int
    hosts: list[str]
    bridge_ns: str
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def addr(self, i: int) -> str:
        """eth0's IPv4 address of host i."""
        return f"10.231.{self.subnet}.{10 + i}"

    def run_in(self, ns: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start argv inside namespace ns (``ip netns exec`` execs it, so the pid is argv's)."""
        popen_kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **popen_kwargs)
        self.procs.append(proc)
        return proc

    def exec(self, ns: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run argv in ns to completion (for ip/sysctl checks)."""
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                              timeout=30)

    def set_link(self, ns: str, up: bool) -> None:
        """Take host ns's eth0 down (as if its cable were pulled) or back up."""
        _ip("-n", ns, "link", "set", "eth0", "up" if up else "down")
        if up:  # the multicast route goes with the link; restore it
            _ip("-n", ns, "route", "replace", "224.0.0.0/4", "dev", "eth0")

    def _end_processes(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _build(lab: NetLab) -> None:
    br = lab.bridge_ns
    _ip("netns", "add", br)
    _ip("-n", br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
    _ip("-n", br, "link", "set", "br0", "up")
    for i, ns in enumerate(lab.hosts):
        _ip("netns", "add", ns)
        _ip("-n", br, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", br, "link", "set", f"v{i}", "master", "br0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{lab.addr(i)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")


@contextmanager
def netlab(n: int) -> Iterator[NetLab]:
    """Build an N-host lab, yield it, and tear everything down (checking nothing is left)."""
    if os.geteuid() != 0:
        unavailable("network namespaces", "network-namespace tests need root")
    if shutil.which("ip") is None:
        unavailable("network namespaces", "network-namespace tests need iproute2's `ip`")
    tag = secrets.token_hex(3)
    lab = NetLab(tag, _free_subnet(), [f"{PREFIX}{tag}-{i}" for i in range(n)], f"{PREFIX}{tag}-br")
    try:
        try:
            _build(lab)
        except (subprocess.CalledProcessError, OSError) as e:
            detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
            unavailable("network namespaces", f"cannot build network namespaces here: {detail}")
        yield lab
    finally:
        lab._end_processes()
        for ns in [*lab.hosts, lab.bridge_ns]:
            if ns in _namespaces():
                _ip("netns", "del", ns, check=False)
        left = {ns for ns in _namespaces() if ns.startswith(f"{PREFIX}{tag}-")}
        assert not left, f"network namespaces left behind: {sorted(left)}"
