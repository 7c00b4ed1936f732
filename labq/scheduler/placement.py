"""Choosing the GPU set: exact search over a node's GPUs by interconnect score.

A GPU set is a bitmask of node-local GPU indices. For a node of up to 16 GPUs
the score of every subset is computed once per topology (65,536 sums at most,
kept for the life of the process), and the subsets of each size are kept sorted
best first. A placement is then a scan for the best subsets that lie inside the
free GPUs, ties broken by what the placement costs the GPUs that stay free:

    loss = score(free) - score(free without the chosen set)

the connectivity the node's free GPUs lose. Comparing loss across nodes is the
anti-fragmentation rule: a 2-GPU job goes to the node where it breaks the least,
and a 1-GPU job takes the GPU whose departure hurts the remaining pairs least,
so NVLink pairs stay whole. Larger nodes fall back to a greedy search.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from math import comb

from labq.models.topology import Topology

EXACT_LIMIT = 16  #: nodes with more GPUs than this use the greedy search
#: answers remembered per topology (of up to 2**16 * 16 questions a 16-GPU topology can be asked)
CHOICES_KEPT = 100_000
_UNASKED = object()


@dataclass(frozen=True)
class SetChoice:
    mask: int
    score: int
    loss: int

    @property
    def gpus(self) -> tuple[int, ...]:
        return mask_to_indices(self.mask)


def mask_to_indices(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def indices_to_mask(indices) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


class _SetTable:
    """Scores of every subset of one topology's GPUs, and the subsets by size, best first."""

    def __init__(self, topology: Topology) -> None:
        n = topology.size
        pair = [[topology.pair_score(i, j) if i != j else 0 for j in range(n)] for i in range(n)]
        # cross[i][half][byte]: sum of pair scores from GPU i to the GPUs in one byte of a mask
        cross = [
            [[sum(pair[i][b + 8 * h] for b in range(8) if byte >> b & 1 and b + 8 * h < n) for byte in range(256)]
             for h in range(2)]
            for i in range(n)
        ]
        scores = [0] * (1 << n)
        for m in range(1, 1 << n):
            low = m & -m
            i = low.bit_length() - 1
            rest = m ^ low
            lo, hi = cross[i]
            scores[m] = scores[rest] + lo[rest & 0xFF] + hi[rest >> 8]
        by_size: list[list[int]] = [[] for _ in range(n + 1)]
        for m in range(1 << n):
            by_size[m.bit_count()].append(m)
        for masks in by_size:
            masks.sort(key=lambda m: -scores[m])  # stable: equal scores stay in mask order
        self.size = n
        self.full = (1 << n) - 1
        self.scores = scores
        self.by_size = by_size
        #: best_set's answers by (free, k): a scheduling pass asks the same few questions of many nodes
        self.choices: dict[tuple[int, int], SetChoice | None] = {}


@lru_cache(maxsize=128)
def _table_for(topology: Topology) -> _SetTable:
    return _SetTable(topology)


_by_identity: dict[int, tuple[Topology, _SetTable]] = {}


def _table(topology: Topology) -> _SetTable:
    """The topology's table, found by identity first: hashing a 16x16 topology costs more than a placement."""
    hit = _by_identity.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    if len(_by_identity) > 1024:
        _by_identity.clear()
    table = _table_for(topology)
    _by_identity[id(topology)] = (topology, table)
    return table


def forget_tables() -> None:
    """Drop the cached subset tables (for cold-start measurements)."""
    _table_for.cache_clear()
    _by_identity.clear()


def best_set(topology: Topology, free: int, k: int) -> SetChoice | None:
    """The best ``k``-GPU set inside ``free``, or None if fewer than ``k`` are free.

    Best means the highest set score; among equal scores, the lowest loss to
    the GPUs left free; then the lowest GPU indices.
    """
    if k <= 0:
        return SetChoice(0, 0, 0)
    if free.bit_count() < k:
        return None
    if topology.size > EXACT_LIMIT:
        return _greedy(topology, free, k)
    table = _table(topology)
    choice = table.choices.get((free, k), _UNASKED)
    if choice is _UNASKED:
        if len(table.choices) >= CHOICES_KEPT:
            table.choices.clear()
        choice = table.choices[free, k] = _search(table, free, k)
    return choice


def _search(table: _SetTable, free: int, k: int) -> SetChoice | None:
    """best_set's exact search, over the subsets of the free GPUs or over the best k-subsets."""
    scores = table.scores
    free_score = scores[free]
    best: SetChoice | None = None
    free_count = free.bit_count()
    if comb(free_count, k) * 16 < len(table.by_size[k]):
        # Few free GPUs: enumerating their k-subsets beats scanning all k-subsets.
        bits = [1 << i for i in range(table.size) if free >> i & 1]
        for combo in combinations(bits, k):
            m = sum(combo)
            s = scores[m]
            loss = free_score - scores[free ^ m]
            if best is None or s > best.score or (s == best.score and (loss, m) < (best.loss, best.mask)):
                best = SetChoice(m, s, loss)
        return best
    outside = table.full & ~free
    for m in table.by_size[k]:
        if m & outside:
            continue
        s = scores[m]
        if best is not None and s < best.score:
            break
        loss = free_score - scores[free ^ m]
        if best is None or loss < best.loss:
            best = SetChoice(m, s, loss)
    return best


def _greedy(topology: Topology, free: int, k: int) -> SetChoice:
    """For nodes past EXACT_LIMIT: seed with the best pair, then add the GPU that adds most."""
    candidates = mask_to_indices(free)
    pair = topology.pair_score
    if k == 1:
        chosen = [min(candidates, key=lambda g: (sum(pair(g, o) for o in candidates if o != g), g))]
    else:
        a, b = max(combinations(candidates, 2), key=lambda p: (pair(*p), -p[0], -p[1]))
        chosen = [a, b]
        while len(chosen) < k:
            rest = [g for g in candidates if g not in chosen]
            chosen.append(max(rest, key=lambda g: (sum(pair(g, c) for c in chosen), -g)))
    mask = indices_to_mask(chosen)
    left = [g for g in candidates if g not in chosen]
    score = topology.set_score(sorted(chosen))
    loss = topology.set_score(candidates) - topology.set_score(left)
    return SetChoice(mask, score, loss)
