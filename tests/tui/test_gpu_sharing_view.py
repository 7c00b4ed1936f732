"""A shared GPU as people see it: ``labq gpus``, the nodes screen's grid and the queue's GPU strip, from the
leader's ``GET /v1/nodes`` document (pure rendering; ``tests/e2e/test_shared_gpu.py`` gets it from a real lab)."""

from __future__ import annotations

from labq.render import gpu_rows, gpus_table, nodes_table
from labq.tui.nodes import gpu_grid, gpu_strip

GiB = 1024
NODE = {
    "name": "ws1", "health": "up", "last_seen": 0.0,
    "gpus": [{"index": i, "uuid": f"SIM-{i}", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 80 * GiB}
             for i in range(3)],
    "gpus_in_use": {"2": 7},
    "gpus_shared": {"0": [
        {"job_id": 12, "user": "alice", "declared_mib": 10 * GiB, "need_mib": 10 * GiB, "used_mib": 8294,
         "peak_mib": 8294},
        {"job_id": 13, "user": "bob\x1b[31m", "declared_mib": 6 * GiB, "need_mib": 14 * GiB, "used_mib": None,
         "peak_mib": None}]},
    "unmanaged_busy": [0], "unmanaged_mib": {"0": 3 * GiB},
}


def test_labq_gpus_shows_each_sharing_job_declared_and_measured_and_what_is_left():
    rows = gpu_rows([NODE], {7: "carol"})
    shared, free, whole = rows
    assert [s["job_id"] for s in shared["sharing"]] == [12, 13] and shared["job"] is None
    assert shared["share_free_mib"] == 80 * GiB - 4096 - 24 * GiB - 3 * GiB  # less the margin, needs, outside use
    assert free["sharing"] == [] and "share_free_mib" not in free
    assert whole["job"] == 7
    text = gpus_table(rows)
    line = next(t for t in text.splitlines() if t.startswith("ws1   0"))
    assert "shared: job 12 (alice) 10 GiB/8.1 GiB, job 13 (bob" in line
    assert "14 GiB/-" in line and "not labq 3 GiB" in line and "; 49 GiB left" in line
    assert "\x1b" not in text  # a user name never reaches the terminal unescaped
    assert "job 7 (carol)" in text


def test_a_shared_gpu_is_not_counted_free():
    assert "1/3" in nodes_table([NODE], now=0.0)


def test_the_nodes_screen_and_the_gpu_strip_say_shared():
    grid = gpu_grid(NODE, {7: {"spec": {"user": "carol", "name": "train"}}}, [], now=0.0).plain
    assert "shared: job 12 (alice)" in grid and "\x1b" not in grid
    strip = gpu_strip([NODE], {}, width=120, max_lines=4).plain
    assert "shared 2 +49G" in strip
    assert "free" in strip  # GPU 1
