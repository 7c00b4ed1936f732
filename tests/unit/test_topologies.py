"""The named simulated inventories describe their machines pair by pair."""

from __future__ import annotations

from itertools import combinations

import pytest

from labq.topologies import NAMED, flat, parse_sim_spec

# nvidia-smi topo -m on a DGX-1 with V100s
DGX1 = """
X   NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X   NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X   NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X   SYS SYS SYS NV1
NV2 SYS SYS SYS X   NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X   NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X   NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X
"""

WS_4X3090 = """
X   NV4 PHB PHB
NV4 X   PHB PHB
PHB PHB X   NV4
PHB PHB NV4 X
"""

PCIE_2SOCKET = """
X   PIX PHB PHB SYS SYS SYS SYS
PIX X   PHB PHB SYS SYS SYS SYS
PHB PHB X   PIX SYS SYS SYS SYS
PHB PHB PIX X   SYS SYS SYS SYS
SYS SYS SYS SYS X   PIX PHB PHB
SYS SYS SYS SYS PIX X   PHB PHB
SYS SYS SYS SYS PHB PHB X   PIX
SYS SYS SYS SYS PHB PHB PIX X
"""


def matrix(inventory):
    topo = inventory.topology
    return [[topo.link_label(i, j) for j in range(topo.size)] for i in range(topo.size)]


@pytest.mark.parametrize(("name", "table"), [("dgx1", DGX1), ("ws-4x3090", WS_4X3090),
                                             ("pcie-2socket", PCIE_2SOCKET)])
def test_link_tables_match_the_machines(name, table):
    assert matrix(NAMED[name]) == [row.split() for row in table.strip().splitlines()]


def test_nvswitch_boxes_are_uniform():
    for name, links in [("dgx-a100", 12), ("dgx2", 6)]:
        topo = NAMED[name].topology
        assert topo.has_nvswitch
        assert {topo.links(i, j) for i, j in combinations(range(topo.size), 2)} == {links}


@pytest.mark.parametrize(
    ("spec", "gpus", "model", "gib"),
    [("sim:dgx1", 8, "V100", 32), ("sim:dgx-a100", 8, "A100", 80), ("dgx2", 16, "V100", 32),
     ("sim:pcie-2socket", 8, "A6000", 48), ("SIM:WS-4X3090", 4, "3090", 24), ("sim:flat:3", 3, "A5000", 24)],
)
def test_specs_select_inventories(spec, gpus, model, gib):
    inv = parse_sim_spec(spec)
    assert inv.gpu_count == gpus and model in inv.model and inv.memory_mib == gib * 1024
    node_gpus = inv.gpus("ws1")
    assert [g.index for g in node_gpus] == list(range(gpus))
    assert len({g.uuid for g in node_gpus}) == gpus
    assert {g.uuid for g in node_gpus}.isdisjoint(g.uuid for g in inv.gpus("ws2"))


@pytest.mark.parametrize(("spec", "words"), [("sim:dgx3", "choose one of sim:dgx1"), ("sim:flat:x", "GPU count"),
                                             ("sim:flat:0", "between 1 and 64")])
def test_unknown_specs_list_the_choices(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_sim_spec(spec)


def test_flat_is_one_host_bridge_without_nvlink():
    topo = flat(5).topology
    assert {topo.link_label(i, j) for i, j in combinations(range(5), 2)} == {"PHB"}
