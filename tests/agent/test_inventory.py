"""The agent's GPU inventory: simulated machines, and NVML driven through a stand-in pynvml.

``fake_pynvml.py`` (next to this file) answers like NVML for a described
machine, with the real binding's names, structs and error classes, so these
tests run the same code path a real DGX-1 would.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from labq.agent.inventory import (
    NVLINK_UNSUPPORTED,
    Inventory,
    NoGpuFound,
    NvmlInventory,
    SimulatedInventory,
    build_topology,
    open_inventory,
)
from labq.agent.nvml import (
    NVLINK_GPU,
    NVLINK_IBMNPU,
    DeviceFacts,
    NvLinkRemote,
    NvmlError,
    normalize_bus_id,
)
from labq.models.topology import PcieLevel
from labq.topologies import parse_sim_spec


@cache
def _load_fake() -> ModuleType:
    """fake_pynvml.py by path: tests/agent is not a package, and must not need to be."""
    path = Path(__file__).with_name("fake_pynvml.py")
    spec = importlib.util.spec_from_file_location("labq_tests_fake_pynvml", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake() -> ModuleType:
    return _load_fake()


@pytest.fixture
def machine(fake: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Callable[..., object]:
    """Factory: ``machine(fake.DGX1, not_supported=...)`` installs that NVML and returns the fake behind it."""

    def install(base: object, **changes: object) -> object:
        described = dataclasses.replace(base, **changes) if changes else base
        mod, nvml = fake.module(described)
        monkeypatch.setitem(sys.modules, "pynvml", mod)
        return nvml

    return install


def read(managed_pids: frozenset[int] = frozenset()) -> Inventory:
    inv = NvmlInventory()
    try:
        return inv.read(managed_pids)
    finally:
        inv.close()


# -- simulated GPUs -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["sim:dgx1", "sim:dgx-a100", "sim:dgx2", "sim:ws-4x3090", "sim:pcie-2socket",
                                  "sim:flat:4", "SIM:DGX1"])
def test_simulated_inventory_is_the_named_machine(spec):
    sim = parse_sim_spec(spec)
    inv = open_inventory(spec, "ws1")
    assert isinstance(inv, SimulatedInventory)
    got = inv.read(frozenset({1, 2, 3}))
    assert got.gpus == sim.gpus("ws1")
    assert got.topology == sim.topology
    assert got.simulated and got.unmanaged_busy == frozenset() and got.notes == ()
    assert got.source == f"sim:{sim.name}"
    node = got.as_node("ws1")
    assert node.simulated and node.gpu_count == sim.gpu_count


def test_simulated_gpus_are_unique_per_node_and_stable():
    a = SimulatedInventory("sim:ws-4x3090", "a").read()
    assert a == SimulatedInventory("sim:ws-4x3090", "a").read()
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in SimulatedInventory("sim:ws-4x3090", "b").read().gpus)


def test_unknown_simulated_inventory_lists_the_choices():
    with pytest.raises(ValueError, match="sim:dgx1.*sim:ws-4x3090.*sim:flat:N"):
        open_inventory("sim:dgx9", "ws1")


def test_unknown_gpus_value_lists_the_choices():
    with pytest.raises(ValueError, match="auto, nvml.*sim:dgx1"):
        open_inventory("cuda", "ws1")


# -- no GPU here ----------------------------------------------------------------------------------

def _has_nvml() -> bool:
    try:
        NvmlInventory().close()
    except NoGpuFound:
        return False
    return True


@pytest.mark.parametrize("gpus", [None, "auto", "nvml"])
def test_no_gpu_on_this_machine_offers_simulated_gpus(gpus):
    if _has_nvml():
        pytest.skip("this machine has NVIDIA GPUs")
    with pytest.raises(NoGpuFound) as caught:
        open_inventory(gpus, "ws1")
    assert "--gpus sim:" in str(caught.value) and "labq topo --list" in str(caught.value)


def test_missing_library_message(machine, fake):
    import pynvml as real

    machine(fake.DGX1, init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NoGpuFound) as caught:
        open_inventory(None, "ws1")
    assert str(caught.value) == (
        "no NVIDIA GPU found (NVML library not found: is the NVIDIA driver installed?). "
        "To run on simulated GPUs: labq agent --gpus sim:ws-4x3090 (see labq topo --list)")


@pytest.mark.parametrize("code, reason", [
    ("NVML_ERROR_DRIVER_NOT_LOADED", "driver is not loaded"),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "differ in version"),
    ("NVML_ERROR_UNKNOWN", "NVML would not start: Unknown Error"),
])
def test_init_failure_is_no_gpu_found(machine, fake, code, reason):
    import pynvml as real

    machine(fake.DGX1, init_error=getattr(real, code))
    with pytest.raises(NoGpuFound, match=reason):
        open_inventory("nvml", "ws1")


def test_no_gpus_listed_is_no_gpu_found(machine, fake):
    nvml = machine(fake.DGX1, gpus=())
    with pytest.raises(NoGpuFound, match="lists no GPUs"):
        NvmlInventory()
    assert nvml.refcount == 0


def test_without_the_binding_is_no_gpu_found(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(NoGpuFound, match="nvidia-ml-py"):
        open_inventory(None, "ws1")


def test_importing_the_inventory_does_not_load_pynvml():
    code = "import sys, labq.agent.inventory; print(__import__('json').dumps('pynvml' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) is False


# -- NVML: machines as the sim describes them -----------------------------------------------------

@pytest.mark.parametrize("name", ["dgx1", "ws-4x3090", "dgx-a100"])
def test_nvml_topology_matches_the_simulated_machine(machine, fake, name):
    machine(fake.MACHINES[name])
    got = read()
    sim = parse_sim_spec(f"sim:{name}")
    assert got.topology == sim.topology
    assert [(g.model, g.memory_mib) for g in got.gpus] == [(g.model, g.memory_mib) for g in sim.gpus("x")]
    assert got.notes == ()
    assert not got.simulated and got.as_node("ws1").gpu_count == sim.gpu_count


def test_dgx1_pairs_as_nvidia_smi_shows_them(machine, fake):
    machine(fake.DGX1)
    topo = read().topology
    assert [topo.link_label(0, j) for j in range(8)] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert topo.pcie[0][1] is PcieLevel.SWITCH and topo.pcie[0][2] is PcieLevel.HOST_BRIDGE
    assert topo.pcie[3][4] is PcieLevel.SYSTEM and topo.numa == (0, 0, 0, 0, 1, 1, 1, 1)


def test_nvml_gpus_carry_nvml_identity(machine, fake):
    nvml = machine(fake.DGX1)
    got = read()
    assert [g.index for g in got.gpus] == list(range(8))
    assert [g.uuid for g in got.gpus] == [fake.DGX1.uuid(i) for i in range(8)]
    assert got.source == "NVML 12.535.104, driver 535.104.05"
    assert nvml.refcount == 0  # closed


def test_pcie_only_machine(machine, fake):
    machine(fake.PCIE_2SOCKET)
    got = read()
    assert got.topology == parse_sim_spec("sim:pcie-2socket").topology
    assert got.notes == (NVLINK_UNSUPPORTED,)


# -- NVML: degradation ----------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo"])
def test_unsupported_nvlink_gives_a_pcie_only_topology(machine, fake, query):
    machine(fake.DGX1, not_supported=frozenset({query}))
    got = read()
    sim = parse_sim_spec("sim:dgx1").topology
    assert got.topology.pcie == sim.pcie
    assert all(n == 0 for row in got.topology.nvlinks for n in row)
    assert got.notes == {
        "nvmlDeviceGetNvLinkState": (NVLINK_UNSUPPORTED,),
        "nvmlDeviceGetNvLinkRemotePciInfo": (
            "NVLink remote ends unknown on GPU 0, 1, 2, 3, 4, 5, 6, 7: those links not counted",),
    }[query]


def test_one_gpu_without_nvlink_answers_is_counted_from_its_peers(machine, fake):
    gpus = list(fake.DGX1.gpus)
    gpus[5] = dataclasses.replace(gpus[5], nvlinks=(), link_slots=0)
    machine(fake.DGX1, gpus=tuple(gpus))
    got = read()
    assert got.topology == parse_sim_spec("sim:dgx1").topology
    assert got.notes == ("NVLink query unsupported on GPU 5: their links counted from their peers only",)


@pytest.mark.parametrize("changes", [
    {"not_supported": frozenset({"nvmlDeviceGetNvLinkRemotePciInfo"})},  # the device type alone says so
    {"binding_lacks": frozenset({"nvmlDeviceGetNvLinkRemoteDeviceType"})},  # ... or the bus id is no GPU's
    {"not_supported": frozenset({"nvmlDeviceGetNvLinkRemoteDeviceType"})},
    {"switches": frozenset()},  # the switch reports an unknown device type
])
def test_nvswitch_links_are_recognised(machine, fake, changes):
    machine(fake.DGX_A100, **changes)
    got = read()
    assert got.topology == parse_sim_spec("sim:dgx-a100").topology
    assert got.topology.nvswitch_links == (12,) * 8


def test_unsupported_common_ancestor_counts_as_sys(machine, fake):
    machine(fake.WS_4X3090, not_supported=frozenset({"nvmlDeviceGetTopologyCommonAncestor"}))
    got = read()
    assert all(got.topology.pcie[i][j] is PcieLevel.SYSTEM for i in range(4) for j in range(4) if i != j)
    assert got.topology.links(0, 1) == 4
    assert got.notes == ("PCIe common ancestor unknown for GPU pairs 0-1, 0-2, 0-3, 1-2, 1-3, 2-3: counted as SYS",)


def test_numa_unknown_is_left_out(machine, fake):
    machine(fake.WS_4X3090, gpus=tuple(dataclasses.replace(g, numa=None) for g in fake.WS_4X3090.gpus))
    assert read().topology.numa == ()
    machine(fake.WS_4X3090, not_supported=frozenset({"nvmlDeviceGetNumaNodeId"}))
    assert read().topology.numa == ()


def test_a_lost_gpu_is_an_error_not_a_smaller_node(machine, fake):
    machine(fake.WS_4X3090, lost=frozenset({2}))
    inv = NvmlInventory()
    with pytest.raises(NvmlError, match="GPU is lost"):
        inv.read()
    inv.close()


def _facts(index: int, bus: str, *remotes: NvLinkRemote) -> DeviceFacts:
    return DeviceFacts(index=index, handle=None, uuid=f"GPU-{index}", model="GPU", memory_mib=1024,
                       bus_id=bus, numa=None, pids=frozenset(), nvlinks=remotes)


def test_links_to_a_cpu_or_an_unlisted_gpu_are_not_counted():
    npu = NvLinkRemote("0000:f0:00.0", NVLINK_IBMNPU)
    unlisted_gpu = NvLinkRemote("0000:f1:00.0", NVLINK_GPU)
    topo, notes = build_topology(
        [_facts(0, "0000:01:00.0", NvLinkRemote("0000:02:00.0", NVLINK_GPU), npu, npu),
         _facts(1, "0000:02:00.0", NvLinkRemote("0000:01:00.0", None), unlisted_gpu)],
        {(0, 1): 30},
    )
    assert topo.nvlinks == ((0, 1), (1, 0)) and topo.nvswitch_links == ()
    assert notes == ("NVLink links to devices other than this node's GPUs ignored on GPU 0, 1",)


# -- NVML: processes labq did not start -----------------------------------------------------------

def _with_pids(base, pids: dict[int, tuple[int, ...]]):
    return tuple(dataclasses.replace(g, pids=pids.get(i, ())) for i, g in enumerate(base.gpus))


def test_a_process_labq_did_not_start_makes_its_gpu_busy(machine, fake):
    machine(fake.WS_4X3090, gpus=_with_pids(fake.WS_4X3090, {1: (4242,), 3: (77, 78)}))
    assert read().unmanaged_busy == frozenset({1, 3})
    assert read(frozenset({4242, 77})).unmanaged_busy == frozenset({3})
    assert read(frozenset({4242, 77, 78})).unmanaged_busy == frozenset()


def test_process_listing_falls_back_to_v2_on_an_older_driver(machine, fake):
    nvml = machine(fake.WS_4X3090, gpus=_with_pids(fake.WS_4X3090, {2: (4242,)}),
                   driver_lacks=frozenset({"nvmlDeviceGetComputeRunningProcesses"}))
    got = read()
    assert got.unmanaged_busy == frozenset({2}) and got.notes == ()
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in nvml.calls


def test_process_listing_refused_leaves_gpus_free_with_a_note(machine, fake):
    machine(fake.WS_4X3090, gpus=_with_pids(fake.WS_4X3090, {2: (4242,)}),
            no_permission=frozenset({"nvmlDeviceGetComputeRunningProcesses",
                                     "nvmlDeviceGetComputeRunningProcesses_v2"}))
    got = read()
    assert got.unmanaged_busy == frozenset()
    assert got.notes[0].startswith("compute processes unavailable on GPU 0")
    assert len(got.notes) == 4


def test_notes_do_not_pile_up_across_reads(machine, fake):
    machine(fake.PCIE_2SOCKET)
    inv = NvmlInventory()
    try:
        assert inv.read().notes == inv.read().notes == (NVLINK_UNSUPPORTED,)
    finally:
        inv.close()


# -- bus ids --------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("00000000:0A:00.0", "0000:0a:00.0"),
    (b"00000000:0A:00.0", "0000:0a:00.0"),
    ("0000:0a:00.0", "0000:0a:00.0"),
    ("0a:00.0", "0000:0a:00.0"),
    ("00010000:C4:00.1", "10000:c4:00.1"),
    ("garbage", "garbage"),
])
def test_bus_ids_are_spelt_one_way(raw, expected):
    assert normalize_bus_id(raw) == expected



def test_free_memory_and_utilization_are_read_per_gpu(fake, machine):
    busy = dataclasses.replace(fake.DGX1.gpus[2], used_mib=10 * 1024, utilization_pct=87)
    machine(fake.DGX1, gpus=(*fake.DGX1.gpus[:2], busy, *fake.DGX1.gpus[3:]))
    usage = {u.index: u for u in read().usage}
    total = fake.DGX1.gpus[2].memory_mib
    assert (usage[2].utilization_pct, usage[2].memory_free_mib) == (87, total - 10 * 1024)
    assert (usage[0].utilization_pct, usage[0].memory_free_mib) == (0, fake.DGX1.gpus[0].memory_mib)


def test_utilization_unsupported_degrades_to_unknown(fake, machine):
    machine(fake.DGX1, not_supported=frozenset({"nvmlDeviceGetUtilizationRates"}))
    reading = read()
    assert all(u.utilization_pct is None for u in reading.usage)
    assert any("utilization" in note for note in reading.notes)


# -- GPU memory per process (sharing GPUs by memory) -----------------------------------------------

def _with_memory(base, procs: dict[int, tuple[tuple[int, int | None], ...]], used: dict[int, int] | None = None):
    """Each GPU's processes as (pid, MiB or None), and its memory in use."""
    return tuple(dataclasses.replace(g, pids=tuple(p for p, _ in procs.get(i, ())),
                                     pid_mib=tuple(m for _, m in procs.get(i, ())),
                                     used_mib=(used or {}).get(i, 0)) for i, g in enumerate(base.gpus))


def memory(managed_pids: frozenset[int] = frozenset()):
    inv = NvmlInventory()
    try:
        return inv.memory(managed_pids)
    finally:
        inv.close()


def test_each_processs_gpu_memory_is_read_and_outside_use_summed_per_gpu(machine, fake):
    machine(fake.WS_4X3090, gpus=_with_memory(fake.WS_4X3090, {0: ((10, 6144), (11, 2048), (99, 3000)),
                                                               2: ((12, 1024),)}))
    got = memory(frozenset({10, 11, 12}))
    assert got.by_pid == {10: (0, 6144), 11: (0, 2048), 99: (0, 3000), 12: (2, 1024)}
    assert got.unmanaged_mib == {0: 3000}  # GPU 2 has only labq's
    inv = read(frozenset({10, 11, 12}))
    assert inv.unmanaged_mib == ((0, 3000),) and inv.unmanaged_busy == frozenset({0})


def test_outside_use_nvml_will_not_size_counts_all_the_gpu_uses_but_labqs(machine, fake):
    # NVML_VALUE_NOT_AVAILABLE for the stranger's process: what the GPU uses less labq's own, never less
    machine(fake.WS_4X3090, gpus=_with_memory(fake.WS_4X3090, {1: ((10, 4096), (99, None))}, used={1: 9000}))
    got = memory(frozenset({10}))
    assert got.by_pid[99] == (1, None)
    assert got.unmanaged_mib == {1: 9000 - 4096}


def test_gpu_memory_unreadable_is_no_reading_with_a_note(machine, fake):
    machine(fake.WS_4X3090, gpus=_with_memory(fake.WS_4X3090, {1: ((99, 500),)}),
            no_permission=frozenset({"nvmlDeviceGetComputeRunningProcesses",
                                     "nvmlDeviceGetComputeRunningProcesses_v2"}))
    inv = NvmlInventory()
    try:
        got = inv.memory()
        assert (got.by_pid, got.unmanaged_mib) == ({}, {})
        assert inv._nvml.take_notes()[0].startswith("compute processes unavailable on GPU 0")
    finally:
        inv.close()


def test_simulated_gpu_memory_is_what_the_processes_declare(tmp_path):
    """Real processes: the agent's own job (managed) and someone's notebook that names this simulated node."""
    env = {"PATH": "/usr/bin:/bin"}
    job = subprocess.Popen(["sleep", "30"], env={**env, "SIM_GPU_MEM": "10G", "CUDA_VISIBLE_DEVICES": "2"})
    notebook = subprocess.Popen(["sleep", "30"], env={**env, "SIM_GPU_MEM": "3000M", "CUDA_VISIBLE_DEVICES": "1",
                                                      "SIM_GPU_NODE": "simmem-node"})
    elsewhere = subprocess.Popen(["sleep", "30"], env={**env, "SIM_GPU_MEM": "5G", "CUDA_VISIBLE_DEVICES": "0",
                                                       "SIM_GPU_NODE": "another-node"})
    try:
        inv = SimulatedInventory("sim:ws-4x3090", "simmem-node")
        got = inv.memory(frozenset({job.pid}))
        assert got.by_pid == {job.pid: (2, 10240), notebook.pid: (1, 3000)}
        assert got.unmanaged_mib == {1: 3000}
        read_back = inv.read(frozenset({job.pid}))
        assert read_back.unmanaged_busy == frozenset({1}) and read_back.unmanaged_mib == ((1, 3000),)
    finally:
        for proc in (job, notebook, elsewhere):
            proc.kill()
            proc.wait()
