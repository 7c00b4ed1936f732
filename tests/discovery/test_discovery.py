"""labq.discovery against real zeroconf: on the host, and across a namespace LAN (see netns.py)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from labq.discovery import DiscoveryError, Found, pick_leader
from netns import NetLab

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[2]

ADVERTISE = """
import json, sys
from labq.discovery import Advertiser
kind, name, port, props, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), int(sys.argv[5])
with Advertiser(kind, name, port, props, ttl_s=ttl):
    print("ready", flush=True)
    sys.stdin.read()  # the test closes stdin to make us withdraw (goodbye packets)
"""

FIND = """
import dataclasses, json, sys, time
from labq.discovery import DiscoveryError, find_agents, find_leaders, pick_leader
kind, timeout, cluster = sys.argv[1], float(sys.argv[2]), sys.argv[3] or None
t0 = time.monotonic()
found = (find_leaders if kind == "leader" else find_agents)(timeout, cluster)
out = {"found": [dataclasses.asdict(f) for f in found], "elapsed": time.monotonic() - t0}
if kind == "leader":
    try:
        out["pick"] = pick_leader(found, cluster, waited_s=timeout).url
    except DiscoveryError as e:
        out["error"] = str(e)
print(json.dumps(out))
"""

WATCH = """
import json, sys
from labq.discovery import Browser
with Browser(sys.argv[1], lambda found: print(json.dumps(sorted(found)), flush=True)):
    print("[]", flush=True)
    sys.stdin.read()
"""


def advertise(lab: NetLab, host: int, kind: str, name: str, props: dict[str, Any],
              port: int = 7733, ttl_s: int = 120) -> subprocess.Popen[str]:
    """Start an advertiser process on lab host `host` and wait until it has announced."""
    proc = lab.run_in(lab.hosts[host], [sys.executable, "-c", ADVERTISE, kind, name, str(port),
                                        json.dumps(props), str(ttl_s)],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def find(lab: NetLab, host: int, kind: str, timeout_s: float, cluster: str = "") -> dict[str, Any]:
    """Run find_leaders/find_agents (and pick_leader) on lab host `host`; its JSON result."""
    proc = lab.run_in(lab.hosts[host], [sys.executable, "-c", FIND, kind, str(timeout_s), cluster],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    out, err = proc.communicate(timeout=timeout_s + 20)
    assert proc.returncode == 0, err
    return json.loads(out)


def test_finds_a_leader_advertised_on_the_same_host(lan) -> None:
    # in a namespace of its own: the test never sends multicast on this machine's real interfaces
    lab = lan(1)
    advertise(lab, 0, "leader", "lab-solo", {"cluster": "c0", "name": "lab"})
    leaders = find(lab, 0, "leader", 5, cluster="c0")
    assert leaders["pick"] == f"http://{lab.addr(0)}:7733"
    (leader,) = leaders["found"]
    assert leader["name"] == "lab-solo" and leader["properties"]["name"] == "lab"


def test_leader_and_agent_found_across_namespaces(lan) -> None:
    lab = lan(3)
    advertise(lab, 0, "leader", "lab-a", {"cluster": "c1", "name": "lab-a"})
    advertise(lab, 1, "agent", "gpu-box-1", {"cluster": "c1", "node": "gpu-box-1", "gpus": 4}, port=7734)
    leaders = find(lab, 2, "leader", 5, cluster="c1")
    assert leaders["pick"] == f"http://{lab.addr(0)}:7733"
    (leader,) = leaders["found"]
    assert (leader["cluster"], leader["addresses"]) == ("c1", [lab.addr(0)])
    agents = find(lab, 2, "agent", 5)
    (agent,) = agents["found"]
    assert agent["url"] == f"http://{lab.addr(1)}:7734"
    assert (agent["name"], agent["properties"]["gpus"], agent["cluster"]) == ("gpu-box-1", "4", "c1")


def test_two_leaders_of_one_cluster_is_an_error_naming_both(lan) -> None:
    lab = lan(3)
    advertise(lab, 0, "leader", "alpha", {"cluster": "c1"})
    advertise(lab, 1, "leader", "beta", {"cluster": "c1"})
    result = find(lab, 2, "leader", 5, cluster="c1")
    assert "pick" not in result
    assert result["error"] == (f"two leaders advertise cluster c1: alpha (http://{lab.addr(0)}:7733) and "
                               f"beta (http://{lab.addr(1)}:7733); pass --leader")


def watch(lab: NetLab, host: int, kind: str) -> subprocess.Popen[str]:
    proc = lab.run_in(lab.hosts[host], [sys.executable, "-c", WATCH, kind],
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "[]"
    return proc


def next_names(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    return json.loads(proc.stdout.readline())


def test_a_leader_that_closes_leaves_the_live_browser(lan) -> None:
    lab = lan(2)
    browser = watch(lab, 1, "leader")
    leader = advertise(lab, 0, "leader", "lab-a", {"cluster": "c1"})
    assert next_names(browser) == ["lab-a._labq-leader._tcp.local."]
    assert leader.stdin is not None
    leader.stdin.close()
    t0 = time.monotonic()
    assert next_names(browser) == []
    assert time.monotonic() - t0 < 5


def test_a_leader_whose_link_dies_expires_after_its_ttl_and_returns_with_it(lan) -> None:
    """No goodbye packet when the cable is pulled: the advertised TTL bounds the ghost."""
    lab = lan(2)
    browser = watch(lab, 1, "leader")
    advertise(lab, 0, "leader", "lab-a", {"cluster": "c1"}, ttl_s=5)
    assert next_names(browser) == ["lab-a._labq-leader._tcp.local."]
    lab.set_link(lab.hosts[0], up=False)
    t0 = time.monotonic()
    assert next_names(browser) == []
    assert time.monotonic() - t0 < 5 + 2 + 1 + 2  # TTL, check interval, query, slack
    lab.set_link(lab.hosts[0], up=True)
    t0 = time.monotonic()
    assert next_names(browser) == ["lab-a._labq-leader._tcp.local."]
    assert time.monotonic() - t0 < 2 + 1 + 2


def test_no_leader_is_a_clear_error_within_the_timeout(lan) -> None:
    lab = lan(1)  # looked for inside a namespace: no query leaves for this machine's real network
    cluster = secrets.token_hex(6)
    result = find(lab, 0, "leader", 1.5, cluster=cluster)
    assert result["found"] == [] and result["elapsed"] < 2.5
    assert result["error"] == (f"no labq leader of cluster {cluster} found over mDNS in 1.5 s; "
                               "the network may drop multicast: pass --leader http://HOST:7733")
    with pytest.raises(DiscoveryError, match=r"^no labq leader found over mDNS in 3 s;"):
        pick_leader([])


def _found(name: str, cluster: str) -> Found:
    return Found(name, f"http://{name}:7733", cluster, "0.1.0", ("10.0.0.1",), {})


def test_pick_leader_filters_by_cluster_and_refuses_ambiguity() -> None:
    a, b = _found("a", "c1"), _found("b", "c2")
    assert pick_leader([a, b], cluster="c2") is b
    with pytest.raises(DiscoveryError, match="leaders of 2 clusters found: a .*; pass --leader"):
        pick_leader([a, b])
