"""How the GPUs of one node are wired to each other, and how good a GPU set is.

The facts are the ones NVML reports: for every pair of GPUs the PCIe level of
their common ancestor, the number of NVLink links that join them directly, and
for each GPU the links that go to an NVSwitch. Everything here is plain data.

A pair's score puts NVLink first: every link is worth more than any PCIe
difference a whole set could add up, so a set with one more NVLink link always
beats a set with better PCIe. On an NVSwitch system every pair of switch-attached
GPUs counts as joined by the smaller of their switch link counts, which makes
those boxes uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from itertools import combinations


class PcieLevel(IntEnum):
    """Common-ancestor level of a GPU pair, in NVML's numbering (lower is closer)."""

    BOARD = 0  #: same board (NVML_TOPOLOGY_INTERNAL), e.g. a dual-GPU card
    SWITCH = 10  #: one PCIe switch between them (PIX)
    MULTI_SWITCH = 20  #: several PCIe switches, no host bridge (PXB)
    HOST_BRIDGE = 30  #: through one CPU host bridge (PHB)
    NUMA = 40  #: across host bridges within one NUMA node (NODE)
    SYSTEM = 50  #: across CPU sockets (SYS)

    @property
    def short(self) -> str:
        """The abbreviation ``nvidia-smi topo -m`` prints."""
        return _SHORT[self]

    @property
    def score(self) -> int:
        """5 for the same board down to 0 across sockets."""
        return (PcieLevel.SYSTEM - self) // 10


_SHORT = {
    PcieLevel.BOARD: "BRD",
    PcieLevel.SWITCH: "PIX",
    PcieLevel.MULTI_SWITCH: "PXB",
    PcieLevel.HOST_BRIDGE: "PHB",
    PcieLevel.NUMA: "NODE",
    PcieLevel.SYSTEM: "SYS",
}

#: One NVLink link outweighs the PCIe score of any set: at most 120 pairs of a
#: 16-GPU node times the best PCIe score of 5 is 600.
NVLINK_WEIGHT = 1000


@dataclass(frozen=True)
class Topology:
    """The interconnect of one node's GPUs, indexed by GPU index (0..n-1)."""

    pcie: tuple[tuple[PcieLevel, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]
    nvswitch_links: tuple[int, ...] = ()
    numa: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.pcie)
        if len(self.nvlinks) != n or any(len(r) != n for r in (*self.pcie, *self.nvlinks)):
            raise ValueError("topology tables must be square and of the same size")
        for i, j in combinations(range(n), 2):
            if self.pcie[i][j] != self.pcie[j][i] or self.nvlinks[i][j] != self.nvlinks[j][i]:
                raise ValueError(f"topology is not symmetric between GPU {i} and GPU {j}")
        if self.nvswitch_links and len(self.nvswitch_links) != n:
            raise ValueError("nvswitch_links needs one entry per GPU")
        if self.numa and len(self.numa) != n:
            raise ValueError("numa needs one entry per GPU")

    @property
    def size(self) -> int:
        return len(self.pcie)

    @property
    def has_nvswitch(self) -> bool:
        return any(self.nvswitch_links)

    def links(self, i: int, j: int) -> int:
        """NVLink links between two GPUs, direct or through NVSwitch."""
        direct = self.nvlinks[i][j]
        if self.nvswitch_links and self.nvswitch_links[i] and self.nvswitch_links[j]:
            return max(direct, min(self.nvswitch_links[i], self.nvswitch_links[j]))
        return direct

    def pair_score(self, i: int, j: int) -> int:
        return self.links(i, j) * NVLINK_WEIGHT + self.pcie[i][j].score

    def set_score(self, gpus: tuple[int, ...] | list[int]) -> int:
        """Sum of pair scores: ``links * 1000 + PCIe points`` over every pair."""
        return sum(self.pair_score(i, j) for i, j in combinations(gpus, 2))

    def link_label(self, i: int, j: int) -> str:
        """``NV4``, ``NV12`` or the PCIe level, as ``nvidia-smi topo -m`` shows a pair."""
        if i == j:
            return "X"
        n = self.links(i, j)
        return f"NV{n}" if n else self.pcie[i][j].short

    @classmethod
    def from_pairs(
        cls,
        size: int,
        pcie: dict[tuple[int, int], PcieLevel] | PcieLevel,
        nvlinks: dict[tuple[int, int], int] | None = None,
        nvswitch_links: tuple[int, ...] = (),
        numa: tuple[int | None, ...] = (),
        default_pcie: PcieLevel = PcieLevel.SYSTEM,
    ) -> Topology:
        """Build the symmetric tables from a list of pairs (unlisted pairs take defaults)."""
        pcie_rows = [[PcieLevel.BOARD] * size for _ in range(size)]
        link_rows = [[0] * size for _ in range(size)]
        for i, j in combinations(range(size), 2):
            level = pcie if isinstance(pcie, PcieLevel) else pcie.get((i, j), pcie.get((j, i), default_pcie))
            links = (nvlinks or {}).get((i, j), (nvlinks or {}).get((j, i), 0))
            pcie_rows[i][j] = pcie_rows[j][i] = level
            link_rows[i][j] = link_rows[j][i] = links
        return cls(
            pcie=tuple(tuple(r) for r in pcie_rows),
            nvlinks=tuple(tuple(r) for r in link_rows),
            nvswitch_links=nvswitch_links,
            numa=numa,
        )
