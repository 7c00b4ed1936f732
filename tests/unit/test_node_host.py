"""A node's CPUs, NUMA nodes and memory: as the simulated machines model them, and on the wire."""

from __future__ import annotations

import pytest

from labq.models.node import Node, cpu_list_text, parse_cpu_list
from labq.models.placement import NodeAllocation, Placement
from labq.protocol.agents import parse_node
from labq.protocol.codec import decode_node, decode_placement, encode_node, encode_placement
from labq.protocol.errors import ApiError
from labq.topologies import NAMED, flat, parse_sim_spec

GIB = 1024


@pytest.mark.parametrize(("text", "ids"), [
    ("", ()), ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0-1,8,10-11", (0, 1, 8, 10, 11)), (" 4,2-3 ", (2, 3, 4)),
])
def test_cpu_lists_read_as_linux_writes_them(text, ids):
    assert parse_cpu_list(text) == ids
    assert parse_cpu_list(cpu_list_text(ids)) == ids


def test_cpu_lists_are_written_in_ranges():
    assert cpu_list_text((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert cpu_list_text((3, 1, 2)) == "1-3"
    assert cpu_list_text(()) == ""


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "0-9999", "1,,2", "0x1"])
def test_a_cpu_list_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError):
        parse_cpu_list(text)


# name, CPUs, NUMA nodes' first CPUs of GPU 0 and of the last GPU, memory (GiB): the machines as sold
MACHINES = [
    ("dgx1", 80, "0-19,40-59", "20-39,60-79", 512),
    ("dgx-a100", 256, "0-63,128-191", "64-127,192-255", 1024),
    ("dgx2", 96, "0-23,48-71", "24-47,72-95", 1536),
    ("pcie-2socket", 96, "0-23,48-71", "24-47,72-95", 512),
    ("ws-4x3090", 48, "0-47", "0-47", 256),
]


@pytest.mark.parametrize(("name", "cpus", "first", "last", "gib"), MACHINES)
def test_the_simulated_machines_carry_their_cpus_numa_nodes_and_memory(name, cpus, first, last, gib):
    node = NAMED[name].node("n1")
    assert len(node.cpus) == cpus and node.memory_mib == gib * GIB
    assert cpu_list_text(node.gpus[0].local_cpus) == first
    assert cpu_list_text(node.gpus[-1].local_cpus) == last
    # each GPU's CPUs are those of its NUMA node, as the topology numbers them
    numa = node.topology.numa
    for gpu in node.gpus:
        assert gpu.local_cpus == NAMED[name].numa_cpus[numa[gpu.index]]


def test_a_flat_machine_has_cpus_and_memory_by_its_gpus():
    node = flat(3).node("f")
    assert len(node.cpus) == 24 and node.memory_mib == 192 * GIB
    assert all(g.local_cpus == node.cpus for g in node.gpus)


def test_a_node_knows_the_cpus_near_each_gpu_as_masks():
    node = parse_sim_spec("sim:pcie-2socket").node("p")
    socket0 = sum(1 << c for c in parse_cpu_list("0-23,48-71"))
    assert node.local_cpu_masks[0] == socket0 and node.local_cpu_masks[7] == node.cpu_mask & ~socket0


def test_a_node_of_an_older_agent_reports_no_cpus_or_memory():
    node = Node("old", parse_sim_spec("sim:flat:2").gpus("old"), parse_sim_spec("sim:flat:2").topology)
    assert node.cpus == () and node.memory_mib is None and node.cpu_mask == 0


def test_a_node_travels_with_its_cpus_and_memory():
    node = NAMED["dgx1"].node("dgx")
    doc = encode_node(node)
    assert doc["cpus"] == "0-79" and doc["memory_mib"] == 512 * GIB
    assert doc["gpus"][0]["local_cpus"] == "0-19,40-59"
    assert decode_node(doc) == node
    assert parse_node(doc) == node


def test_a_node_document_of_an_older_labq_reads_with_nothing_known():
    old = Node("old", parse_sim_spec("sim:flat:2").gpus("old"), parse_sim_spec("sim:flat:2").topology,
               simulated=True)
    doc = encode_node(old)
    for gpu in doc["gpus"]:
        gpu.pop("local_cpus", None)
    assert "cpus" not in doc and "memory_mib" not in doc
    for read in (decode_node, parse_node):
        node = read(doc)
        assert node.cpus == () and node.memory_mib is None and all(g.local_cpus == () for g in node.gpus)


@pytest.mark.parametrize(("field", "value"), [("cpus", "0-x"), ("cpus", 7), ("memory_mib", -1),
                                              ("memory_mib", "lots")])
def test_an_agent_that_says_its_cpus_or_memory_wrongly_is_refused(field, value):
    doc = encode_node(NAMED["ws-4x3090"].node("ws"))
    doc[field] = value
    with pytest.raises(ApiError) as err:
        parse_node(doc)
    assert err.value.field.startswith(f"node.{field}")


def test_a_gpus_cpu_list_is_checked_too():
    doc = encode_node(NAMED["ws-4x3090"].node("ws"))
    doc["gpus"][1]["local_cpus"] = "7-3"
    with pytest.raises(ApiError) as err:
        parse_node(doc)
    assert err.value.field == "node.gpus.local_cpus"


def test_a_placement_keeps_its_cpu_set_and_memory():
    placement = Placement((NodeAllocation("ws", (0, 1), ("a", "b"), 5, (0, 1, 2, 3, 8), 4.5, 32 * GIB, 1),
                           NodeAllocation("old", (2,), ("c",), 0)))
    doc = encode_placement(placement)
    assert doc["allocations"][0]["cpu_set"] == "0-3,8" and doc["allocations"][0]["cpus"] == 4.5
    assert set(doc["allocations"][1]) == {"node", "gpu_indices", "gpu_uuids", "score"}  # as an older labq wrote it
    assert decode_placement(doc) == placement
    assert placement.allocations[0].cpu_mask == 0b1_0000_1111
