"""Sharing a GPU by memory: what a job that shares (``labq submit --share --gpu-mem 10G``) may use.

A sharing job declares the GPU memory it uses. The scheduler puts it on a GPU where the declarations of the
sharing jobs there, the memory that processes outside labq use (NVML, as the node's agent reports it) and one
safety margin fit the GPU's memory (``labq.scheduler.sharing``); no job that has its GPUs to itself is ever
put on such a GPU. The agent watches what each sharing job really uses: one that goes past its declaration by
more than the margin is asked to stop through its checkpoint contract and requeued, so it is the one that stops
and never its neighbours; it runs with what it was seen using from then on (``need_mib``).
"""

from __future__ import annotations

from collections.abc import Mapping

from labq.models.job import Job

MARGIN_PCT = 5  #: the safety margin on a shared GPU: this share of its memory...
MARGIN_MIN_MIB = 512  #: ... and at least this much (a CUDA context alone takes 300-500 MiB)


def margin_mib(gpu_memory_mib: int) -> int:
    """The memory a shared GPU keeps free of declarations, and by how much a job may pass its own."""
    return max(MARGIN_MIN_MIB, gpu_memory_mib * MARGIN_PCT // 100)


def need_mib(job: Job) -> int:
    """The GPU memory a sharing job is placed by: its declaration, or more once an attempt was seen using more."""
    declared = job.spec.share_mib or 0
    return max(declared, job.gpu_mem_peak_mib or 0)


def limit_mib(need: int, gpu_memory_mib: int) -> int:
    """Past this much GPU memory a sharing job is stopped: what it is placed by, and the margin."""
    return need + margin_mib(gpu_memory_mib)


def room_mib(gpu_memory_mib: int, declared_mib: int, unmanaged_mib: int) -> int:
    """What a GPU has left for one more sharing job: its memory less the margin, the sharing jobs' declarations
    and what processes outside labq use."""
    return gpu_memory_mib - margin_mib(gpu_memory_mib) - declared_mib - unmanaged_mib


def over_limit(limits: Mapping[object, int], used: Mapping[object, int]) -> list[object]:
    """The sharing jobs (by whatever key: an attempt) that use more than their limit, in key order."""
    return sorted((key for key, limit in limits.items() if used.get(key, 0) > limit), key=repr)


def mib_text(mib: float) -> str:
    """``10 GiB``, ``14.2 GiB``, ``800 MiB``."""
    if mib >= 1024:
        return f"{mib / 1024:.1f}".removesuffix(".0") + " GiB"
    return f"{mib:.0f} MiB"


def over_memory_note(peak_mib: int, need: int, gpu_memory_mib: int, where: str) -> str:
    """The job's note when it is stopped for using more than it declared."""
    return (f"stopped on {where}: it used {mib_text(peak_mib)} of GPU memory, more than the {mib_text(need)} it "
            f"declared and the {mib_text(margin_mib(gpu_memory_mib))} margin; requeued to run with "
            f"{mib_text(peak_mib)} (its neighbours on that GPU kept running)")
