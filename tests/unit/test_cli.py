"""The labq command, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def labq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60)


def test_help_teaches_with_examples():
    out = labq("--help")
    assert out.returncode == 0
    assert "topo" in out.stdout and "place" in out.stdout and "examples:" in out.stdout


def test_topo_prints_the_link_matrix():
    out = labq("topo", "sim:ws-4x3090")
    assert out.returncode == 0
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("GPU") and "NV4" in line]
    assert rows[0] == ["GPU0", "X", "NV4", "PHB", "PHB", "0"]


def test_topo_json_and_list():
    data = json.loads(labq("topo", "sim:dgx1", "--json").stdout)
    assert data["links"][0][3] == "NV2" and len(data["gpus"]) == 8
    names = [row["name"] for row in json.loads(labq("topo", "--list", "--json").stdout)]
    assert "sim:dgx-a100" in names and "sim:flat:N" in names


def test_place_shows_the_chosen_set_and_score():
    data = json.loads(labq("place", "sim:dgx1", "--gpus", "4", "--json").stdout)
    assert data == {"inventory": "sim:dgx1", "gpus": [0, 1, 2, 3], "score": 9016, "nvlink_links": 9,
                    "free_connectivity_lost": 15016, "cpu_set": "0-19,40-59", "cpus": 40.0,
                    "memory_mib": 256 * 1024, "far_cpus": 0}
    out = labq("place", "sim:ws-4x3090", "--gpus", "1", "--busy", "0")
    assert out.returncode == 0 and out.stdout.startswith("GPUs 1 on sim:ws-4x3090")
    assert "  CPUs 0-11 (12 cores, near its GPUs); memory 64 GiB" in out.stdout


def test_place_shows_the_cpus_near_the_gpus_and_where_none_are_free():
    data = json.loads(labq("place", "sim:pcie-2socket", "--gpus", "1", "--busy", "0,1,2,3", "--cpus", "2.5",
                           "--mem", "20G", "--json").stdout)
    assert (data["gpus"], data["cpu_set"], data["cpus"], data["memory_mib"]) == ([4], "24-26", 2.5, 20 * 1024)
    data = json.loads(labq("place", "sim:pcie-2socket", "--gpus", "1", "--busy", "4,5,6,7", "--cpus", "4",
                           "--busy-cpus", "0-23,48-71", "--json").stdout)
    assert (data["cpu_set"], data["far_cpus"]) == ("24-27", 4)
    out = labq("place", "sim:ws-4x3090", "--gpus", "1", "--cpus", "8", "--busy-cpus", "0-43")
    assert out.returncode == 2 and "needs 8 CPUs; sim:ws-4x3090 has 4 free" in out.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("topo", "sim:nope"), "unknown simulated inventory 'sim:nope'"),
        (("topo",), "name an inventory"),
        (("place", "sim:dgx1", "--gpus", "9"), "9 GPUs asked, 8 free"),
        (("place", "sim:dgx1", "--gpus", "1", "--busy", "a,b"), "--busy takes GPU indices"),
        (("place", "sim:dgx1", "--gpus", "1", "--busy", "8"), "no GPU 8"),
        (("place", "sim:dgx1", "--gpus", "0"), "--gpus must be 1 or more"),
    ],
)
def test_bad_input_gets_one_clear_line_and_exit_2(args, words):
    out = labq(*args)
    assert out.returncode == 2
    assert words in out.stderr and "Traceback" not in out.stderr
