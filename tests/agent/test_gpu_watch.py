"""The agent's watch over jobs that share a GPU: whose processes are whose, and who went over, with real processes."""

from __future__ import annotations

import os
import subprocess
import time

from labq.agent.gpu_watch import MemoryWatch, processes_of
from labq.agent.procfs import process_table
from labq.agent.inventory import GpuMemory


def test_an_attempts_processes_are_its_group_and_its_descendants():
    # a job's shell, a child in its group, and a grandchild that left the group (setsid), as a container's might
    job = subprocess.Popen(["sh", "-c", "sleep 30 & setsid sleep 31 & wait"], start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            found = processes_of({(1, 1): job.pid, (2, 1): other.pid}, process_table())
            if len(found[(1, 1)]) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        mine = found[(1, 1)]
        assert job.pid in mine and len(mine) == 3
        assert found[(2, 1)] == {other.pid}
        assert not mine & found[(2, 1)] and os.getpid() not in mine
    finally:
        for proc in (job, other):
            os.killpg(proc.pid, 9)
            proc.wait()


def test_only_the_attempt_over_its_limit_is_news_and_only_once():
    watch = MemoryWatch()
    watch.expect({(1, 1): 9000, (2, 1): 9000})
    processes = {(1, 1): {10, 11}, (2, 1): {20}}
    assert watch.look(GpuMemory({10: (0, 4000), 11: (0, 4000), 20: (0, 8000)}, {}), processes) == []
    assert watch.reading((1, 1)) == (8000, 8000)
    assert watch.look(GpuMemory({10: (0, 4000), 11: (0, 6000), 20: (0, 8000)}, {}), processes) == [(1, 1)]
    assert watch.look(GpuMemory({10: (0, 4000), 11: (0, 6000), 20: (0, 8000)}, {}), processes) == []  # told once
    # the peak stays when its use drops, and a process NVML cannot size counts nothing
    watch.look(GpuMemory({10: (0, 100), 11: (0, None), 20: (0, 8000)}, {}), processes)
    assert watch.reading((1, 1)) == (100, 10000)
    watch.expect({(2, 1): 9000})  # attempt 1 ended: forgotten
    assert watch.reading((1, 1)) == (None, None) and watch.reading((2, 1)) == (8000, 8000)
