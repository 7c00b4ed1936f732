"""What a node says it has besides GPUs: its CPUs, the CPUs near each GPU and its memory, read from NVML (a stand-in
pynvml), from this machine's own /sys and /proc, and from a simulated machine."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from labq.agent.inventory import NvmlInventory, SimulatedInventory, host_cpus, host_memory_mib, pci_local_cpus
from labq.models.node import cpu_list_text
from labq.protocol.agents import Registration, encode_registration, parse_registration
from labq.topologies import parse_sim_spec

SYS_PCI = Path("/sys/bus/pci/devices")


@cache
def _load_fake() -> ModuleType:
    path = Path(__file__).with_name("fake_pynvml.py")
    spec = importlib.util.spec_from_file_location("labq_tests_fake_pynvml", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake() -> ModuleType:
    return _load_fake()


@pytest.fixture
def machine(fake, monkeypatch):
    def install(base, **changes):
        mod, nvml = fake.module(dataclasses.replace(base, **changes) if changes else base)
        monkeypatch.setitem(sys.modules, "pynvml", mod)
        return nvml
    return install


def read(**where):
    inv = NvmlInventory(**where)
    try:
        return inv.read()
    finally:
        inv.close()


def _expand(text: str) -> set[int]:
    """A CPU list read without labq's reader, to check it against."""
    ids: set[int] = set()
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        ids.update(range(int(low), int(high or low) + 1))
    return ids


# -- this machine, as the agent reads it ------------------------------------------------------------------------

def test_the_cpus_a_node_gives_are_the_agents_own_affinity():
    assert host_cpus() == tuple(sorted(os.sched_getaffinity(0)))
    assert host_cpus() and all(0 <= cpu < 8192 for cpu in host_cpus())


def test_the_memory_a_node_gives_is_memtotal():
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    assert host_memory_mib() == total_kib // 1024 > 0


def test_a_pci_devices_local_cpus_are_the_kernels_list():
    devices = sorted(d for d in SYS_PCI.iterdir() if (d / "local_cpulist").exists()) if SYS_PCI.exists() else []
    if not devices:
        pytest.skip("this machine shows no PCI device's local_cpulist")
    for device in devices[:8]:
        local = pci_local_cpus(device.name)
        assert set(local) == _expand((device / "local_cpulist").read_text())
        assert local == tuple(sorted(local)) and max(local) < 8192


def test_an_unknown_pci_device_has_no_local_cpus(tmp_path):
    assert pci_local_cpus("0000:ff:1f.7", str(tmp_path)) == ()
    assert pci_local_cpus(None) == ()


def test_unreadable_memory_is_unknown(tmp_path):
    assert host_memory_mib(str(tmp_path)) is None
    (tmp_path / "meminfo").write_text("MemFree:  100 kB\n")
    assert host_memory_mib(str(tmp_path)) is None
    (tmp_path / "meminfo").write_text("MemTotal:       24683772 kB\nMemFree:  100 kB\n")
    assert host_memory_mib(str(tmp_path)) == 24683772 // 1024


# -- NVML, then /sys --------------------------------------------------------------------------------------------

def test_nvml_says_the_cpus_near_each_gpu(machine, fake):
    machine(fake.DGX1)
    got = read()
    assert cpu_list_text(got.gpus[0].local_cpus) == "0-19,40-59"
    assert cpu_list_text(got.gpus[7].local_cpus) == "20-39,60-79"  # past CPU 63: a second word of the mask
    assert got.cpus == host_cpus() and got.memory_mib == host_memory_mib()
    assert got.notes == ()
    node = got.as_node("dgx")
    assert node.cpus == host_cpus() and node.gpus[3].local_cpus == got.gpus[3].local_cpus


def test_without_nvmls_affinity_the_kernels_list_is_read(machine, fake, tmp_path):
    machine(fake.DGX1, not_supported=frozenset({"nvmlDeviceGetCpuAffinity"}))
    for i, bus in enumerate(("0000:06:00.0", "0000:07:00.0")):
        (tmp_path / "bus/pci/devices" / bus).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / bus / "local_cpulist").write_text("0-19,40-59\n")
    got = read(sysfs=str(tmp_path))
    assert [cpu_list_text(g.local_cpus) for g in got.gpus[:3]] == ["0-19,40-59", "0-19,40-59", ""]
    assert got.notes == ("CPUs near GPU 2, 3, 4, 5, 6, 7 unknown: their jobs get any free CPUs",)


def test_a_node_whose_memory_cannot_be_read_says_so(machine, fake, tmp_path):
    machine(fake.WS_4X3090)
    got = read(proc=str(tmp_path))
    assert got.memory_mib is None and got.as_node("ws").memory_mib is None
    assert any("memory unknown" in note for note in got.notes)


# -- a simulated machine ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["sim:dgx1", "sim:ws-4x3090", "sim:flat:2"])
def test_a_simulated_node_has_the_cpus_and_memory_of_its_machine(spec):
    sim = parse_sim_spec(spec)
    node = SimulatedInventory(spec, "s1").read().as_node("s1")
    assert node.cpus == sim.cpus and node.memory_mib == sim.host_memory_mib
    assert [g.local_cpus for g in node.gpus] == [sim.local_cpus(i) for i in range(sim.gpu_count)]


def test_the_leader_reads_what_the_agent_registers(machine, fake):
    machine(fake.PCIE_2SOCKET)
    node = read().as_node("pcie")
    again = parse_registration(encode_registration(Registration(node, None, "1"))).node
    assert again == node and again.cpus == host_cpus() and again.gpus[4].local_cpus == node.gpus[4].local_cpus
