"""Placement on every named topology, with the optimal set and its score written out.

Scores are ``NVLink links * 1000 + PCIe points`` summed over the set's pairs, where a
pair's PCIe points are 4 (one switch), 3 (several switches), 2 (host bridge),
1 (same NUMA node) or 0 (across sockets).
"""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labq.models import PcieLevel, Topology
from labq.scheduler.placement import EXACT_LIMIT, best_set, indices_to_mask, mask_to_indices
from labq.topologies import NAMED, flat, parse_sim_spec

ALL = 0xFFFF


@pytest.mark.parametrize(
    ("inventory", "busy", "k", "gpus", "score"),
    [
        # DGX-1: the NV2 pairs under one PCIe switch are best; a quad has 9 links
        ("dgx1", (), 1, (0,), 0),
        ("dgx1", (), 2, (2, 3), 2 * 1000 + 4),
        ("dgx1", (), 3, (0, 2, 3), 5 * 1000 + 2 + 2 + 4),
        ("dgx1", (), 4, (0, 1, 2, 3), 9 * 1000 + 4 + 4 + 4 * 2),
        ("dgx1", (), 8, tuple(range(8)), 24 * 1000 + 4 * 4 + 8 * 2),
        ("dgx1", (2, 3), 2, (6, 7), 2004),  # the other NV2 switch pair
        ("dgx1", (0, 1, 2, 3), 4, (4, 5, 6, 7), 9016),
        ("dgx1", (1, 2, 5, 6), 2, (0, 3), 2002),  # NV2 pairs (0,3) and (4,7) tie: lowest indices
        ("dgx1", (0, 2, 3, 5, 7), 2, (4, 6), 1002),  # NV1 pair beats any PCIe-only pair
        ("dgx1", (0,), 1, (3,), 0),  # leaves the most connected GPUs free
        # DGX A100: NVSwitch makes every pair NV12; PCIe breaks ties
        ("dgx-a100", (), 2, (0, 1), 12 * 1000 + 3),
        ("dgx-a100", (), 4, (0, 1, 2, 3), 6 * 12000 + 2 * 3 + 4 * 1),
        ("dgx-a100", (), 8, tuple(range(8)), 28 * 12000 + 4 * 3 + 8 * 1),
        ("dgx-a100", (0, 2, 4, 6), 2, (1, 3), 12001),
        # DGX-2: 16 GPUs on NVSwitch (six links each)
        ("dgx2", (), 2, (0, 1), 6003),
        ("dgx2", (), 8, tuple(range(8)), 28 * 6000 + 4 * 3 + 24 * 1),
        ("dgx2", (), 16, tuple(range(16)), 120 * 6000 + 8 * 3 + 48 * 1),
        # PCIe only, two sockets
        ("pcie-2socket", (), 2, (0, 1), 4),
        ("pcie-2socket", (), 4, (0, 1, 2, 3), 4 + 4 + 4 * 2),
        ("pcie-2socket", (0, 2), 2, (4, 5), 4),  # a whole switch pair beats two halves
        ("pcie-2socket", (0, 2, 4, 6), 2, (1, 3), 2),  # same socket beats across sockets
        ("pcie-2socket", (), 8, tuple(range(8)), 32),
        # workstation: two NVLink bridges
        ("ws-4x3090", (), 2, (0, 1), 4002),
        ("ws-4x3090", (0,), 2, (2, 3), 4002),
        ("ws-4x3090", (0,), 1, (1,), 0),  # keeps the 2-3 bridge whole
        ("ws-4x3090", (1, 3), 2, (0, 2), 2),
        ("ws-4x3090", (), 3, (0, 1, 2), 4006),
        ("ws-4x3090", (), 4, (0, 1, 2, 3), 8012),
        # flat
        ("flat:4", (), 2, (0, 1), 2),
        ("flat:4", (), 4, (0, 1, 2, 3), 12),
    ],
)
def test_optimal_set_on_named_topologies(inventory, busy, k, gpus, score):
    topo = parse_sim_spec(inventory).topology
    free = ((1 << topo.size) - 1) & ~indices_to_mask(busy)
    choice = best_set(topo, free, k)
    assert choice is not None
    assert choice.gpus == gpus
    assert choice.score == score == topo.set_score(gpus)


def test_not_enough_free_gpus_gives_none():
    topo = NAMED["dgx1"].topology
    assert best_set(topo, indices_to_mask((0, 1, 2)), 4) is None


def test_one_gpu_jobs_keep_nvlink_pairs_whole():
    topo = NAMED["ws-4x3090"].topology
    free = 0b1111
    taken = []
    for _ in range(2):
        choice = best_set(topo, free, 1)
        taken += choice.gpus
        free &= ~choice.mask
    assert sorted(taken) == [0, 1]  # one bridge used up, the other still whole
    assert best_set(topo, free, 2).gpus == (2, 3)


def test_one_gpu_jobs_on_dgx1_take_gpus_whose_loss_hurts_least():
    topo = NAMED["dgx1"].topology
    free = 0xFF
    order = []
    for _ in range(8):
        choice = best_set(topo, free, 1)
        # no other free GPU would have cost the remaining free pairs less
        losses = {g: sum(topo.pair_score(g, o) for o in mask_to_indices(free) if o != g) for g in mask_to_indices(free)}
        assert losses[choice.gpus[0]] == min(losses.values())
        order += choice.gpus
        free &= ~choice.mask
    assert sorted(order) == list(range(8))


def _brute_force(topo: Topology, free: int, k: int):
    """Independent oracle: every k-subset, best score, then least loss, then lowest indices."""
    gpus = mask_to_indices(free)
    if len(gpus) < k:
        return None
    total = topo.set_score(gpus)

    def key(combo):
        rest = [g for g in gpus if g not in combo]
        return (-topo.set_score(combo), total - topo.set_score(rest), indices_to_mask(combo))

    return min(combinations(gpus, k), key=key)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(NAMED)), free=st.integers(0, ALL), k=st.integers(1, 8))
def test_exact_search_matches_brute_force(name, free, k):
    topo = NAMED[name].topology
    free &= (1 << topo.size) - 1
    expected = _brute_force(topo, free, k)
    choice = best_set(topo, free, k)
    if expected is None:
        assert choice is None
    else:
        assert choice.gpus == expected
        assert choice.score == topo.set_score(expected)


def test_nodes_past_the_exact_limit_use_greedy_and_still_respect_free():
    inv = flat(EXACT_LIMIT + 8)
    free = ((1 << inv.gpu_count) - 1) & ~indices_to_mask((0, 5, 7))
    choice = best_set(inv.topology, free, 6)
    assert len(choice.gpus) == 6 and not set(choice.gpus) & {0, 5, 7}
    assert choice.score == inv.topology.set_score(choice.gpus)


def test_nvlink_outweighs_any_pcie_difference_on_the_biggest_node():
    # one NVLink link between an across-socket pair beats 16 GPUs on one board
    n = EXACT_LIMIT
    board = Topology.from_pairs(n, PcieLevel.BOARD)
    best_pcie_only = board.set_score(range(n))
    linked = Topology.from_pairs(2, PcieLevel.SYSTEM, {(0, 1): 1})
    assert linked.set_score((0, 1)) > best_pcie_only
