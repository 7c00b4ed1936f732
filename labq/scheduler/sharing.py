"""Where a job that shares a GPU by memory goes (``labq submit --share --gpu-mem 10G``).

Fill before open: a sharing job joins the GPU already shared (or used by processes outside labq) where it
leaves the least memory over, and only when none has room opens a free GPU, the one whose departure costs the
node's free GPUs the least connectivity (``placement.best_set``), so NVLink pairs stay whole for the jobs that
need them. A GPU that a job has to itself is never joined, and a shared GPU is never free for such a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from labq.models.node import Node
from labq.models.sharing import margin_mib, mib_text, room_mib
from labq.scheduler.placement import best_set, mask_to_indices


@dataclass(frozen=True)
class ShareChoice:
    """A GPU for a sharing job."""

    opens: bool  #: the GPU had no job: sharing starts there
    left_mib: int  #: what the GPU has left for more sharing jobs once this one is on it
    loss: int  #: for a GPU opened, the connectivity the node's free GPUs lose (``SetChoice.loss``)
    node: str
    gpu: int
    score: int = 0

    @property
    def rank(self) -> tuple:
        """Best first: joining before opening; a join leaving the least over, an opening costing the least."""
        return (self.opens, self.loss, self.left_mib, self.node, self.gpu)


def join(node: Node, joinable: int, declared: Mapping[int, int], need: int) -> ShareChoice | None:
    """The GPU among ``joinable`` (shared already, or used outside labq) with room for ``need`` MiB that is left
    fullest; None when none has room."""
    best = None
    for gpu in mask_to_indices(joinable):
        left = room_mib(node.gpus[gpu].memory_mib, declared.get(gpu, 0), node.unmanaged_on(gpu)) - need
        if left >= 0:
            choice = ShareChoice(False, left, 0, node.name, gpu)
            if best is None or choice.rank < best.rank:
                best = choice
    return best


def open_one(node: Node, free: int, need: int) -> ShareChoice | None:
    """A free GPU of ``free`` where ``need`` MiB fits, chosen to keep the rest of the node's free GPUs best
    connected; None when none fits."""
    fits = 0
    for gpu in mask_to_indices(free):
        if room_mib(node.gpus[gpu].memory_mib, 0, node.unmanaged_on(gpu)) >= need:
            fits |= 1 << gpu
    choice = best_set(node.topology, fits, 1)
    if choice is None:
        return None
    gpu = choice.gpus[0]
    left = room_mib(node.gpus[gpu].memory_mib, 0, node.unmanaged_on(gpu)) - need
    return ShareChoice(True, left, choice.loss, node.name, gpu, choice.score)


def no_room(need: int, biggest_gpu_mib: int) -> str:
    """Why a sharing job waits: no GPU has room for it now."""
    return (f"no GPU it may use has {mib_text(need)} left to share now (each shared GPU keeps a "
            f"{mib_text(margin_mib(biggest_gpu_mib))} margin); it starts when sharing jobs end or a GPU frees")
