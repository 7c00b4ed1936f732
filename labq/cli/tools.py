"""``labq topo``, ``labq place`` and ``labq checkpoint``: tools that need no leader."""

from __future__ import annotations

import argparse
import json

from labq.cli.common import command, parse_signal
from labq.cli.errors import CliError


def add_commands(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser(
        "topo",
        help="show a GPU inventory and its interconnect",
        description="Show the GPUs of an inventory and the link between every pair, "
        "as `nvidia-smi topo -m` does: NV<n> for n NVLink links, else the PCIe level "
        "(PIX one switch, PXB several switches, PHB host bridge, NODE same NUMA node, SYS across sockets).",
    )
    topo.add_argument("inventory", nargs="?", help="a simulated inventory: sim:dgx1, sim:flat:4, ...")
    topo.add_argument("--list", action="store_true", help="list the simulated inventories")
    topo.add_argument("--json", action="store_true", help="print JSON")
    topo.set_defaults(run=_topo)

    place = sub.add_parser(
        "place",
        help="show which GPU set labq would give a job",
        description="Run labq's placement on one node: the best-connected GPU set for a job of "
        "--gpus GPUs among the free ones, what it costs the GPUs left free, and the CPUs (near those GPUs) and "
        "memory it gets.",
    )
    place.add_argument("inventory", help="a simulated inventory: sim:dgx1, sim:flat:4, ...")
    place.add_argument("--gpus", type=int, required=True, metavar="N", help="GPUs the job needs")
    place.add_argument("--busy", default="", metavar="LIST", help="GPU indices already in use, e.g. 0,3")
    place.add_argument("--cpus", type=float, metavar="N", help="CPU cores it needs (default: the node's share per GPU)")
    place.add_argument("--mem", metavar="SIZE", help="memory it needs: 32G, 500M (default: the node's share per GPU)")
    place.add_argument("--busy-cpus", default="", metavar="LIST", help="CPUs already in use, e.g. 0-19,40-59")
    place.add_argument("--json", action="store_true", help="print JSON")
    place.set_defaults(run=_place)

    ckpt = command(
        sub, "checkpoint", "(inside a job) report that a checkpoint was saved, or which signal asks for one",
        "Run by a job after it finished saving a checkpoint: labq records the time and uses it to preempt the "
        "job that loses least and to account work lost. With --signal the job also says which signal it "
        "handles by saving and exiting 0; a job that declared none (at submit, here, or by its image's label "
        "labq.checkpoint-signal) is stopped with TERM and its grace, never with a signal it would die of. Say "
        "it once, early: it holds for later attempts, and a report at the start loses nothing. labq checkpoint "
        "touches $LABQ_CHECKPOINT_DIR/.labq-checkpoint (--signal writes the signal's name in it), which a job "
        "without labq installed (a container) can do itself.",
        "  labq checkpoint --signal USR1     at the start: preempt me with SIGUSR1, I save and exit 0\n"
        "  labq checkpoint                   after each finished save\n"
        "  echo SIGUSR1 > \"$LABQ_CHECKPOINT_DIR/.labq-checkpoint\"    the same, without labq in the image\n"
        "  LABEL labq.checkpoint-signal=SIGUSR1                     in a Dockerfile: every job of the image",
        _checkpoint, [])
    ckpt.add_argument("--signal", metavar="SIGNAL",
                      help="the signal the job checkpoints on (USR1, SIGUSR2, TERM, ...)")


def _checkpoint(args: argparse.Namespace) -> int:
    import os

    from labq.protocol.agents import CHECKPOINT_MARKER

    folder = os.environ.get("LABQ_CHECKPOINT_DIR")
    if not folder:
        raise CliError("LABQ_CHECKPOINT_DIR is not set: `labq checkpoint` is for jobs that labq runs")
    marker = os.path.join(folder, CHECKPOINT_MARKER)
    named = parse_signal(args.signal, "--signal") if args.signal is not None else None
    try:
        if named is None:
            with open(marker, "a"):
                os.utime(marker)
        else:
            partial = f"{marker}.{os.getpid()}"
            with open(partial, "w") as f:
                f.write(named + "\n")
            os.replace(partial, marker)  # the agent reads a whole name or the old one, never half
    except OSError as err:
        raise CliError(f"cannot write {marker}: {err.strerror}") from None
    return 0


def _inventory(spec: str | None):
    from labq.topologies import parse_sim_spec

    if not spec:
        raise CliError("name an inventory, e.g. sim:dgx1 (labq topo --list shows them)")
    try:
        return parse_sim_spec(spec)
    except ValueError as err:
        raise CliError(str(err)) from None


def _topo(args: argparse.Namespace) -> int:
    from labq.topologies import NAMED

    if args.list:
        rows = [{"name": f"sim:{inv.name}", "gpus": inv.gpu_count, "description": inv.description}
                for inv in NAMED.values()]
        rows.append({"name": "sim:flat:N", "gpus": None, "description": "N GPUs on one host bridge, no NVLink"})
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(f"{row['name']:<18} {row['description']}")
        return 0
    inv = _inventory(args.inventory)
    topo = inv.topology
    n = inv.gpu_count
    if args.json:
        print(json.dumps({
            "name": f"sim:{inv.name}",
            "description": inv.description,
            "gpus": [{"index": i, "model": inv.model, "memory_mib": inv.memory_mib,
                      "numa": topo.numa[i] if topo.numa else None} for i in range(n)],
            "nvswitch": topo.has_nvswitch,
            "links": [[topo.link_label(i, j) for j in range(n)] for i in range(n)],
        }, indent=2))
        return 0
    print(f"sim:{inv.name}: {inv.description}")
    print(f"{n}x {inv.model}, {inv.memory_mib // 1024} GiB each" + (", NVSwitch" if topo.has_nvswitch else ""))
    print()
    width = max(5, len(f"GPU{n - 1}") + 1)
    print(" " * width + "".join(f"{f'GPU{j}':>{width}}" for j in range(n)) + f"{'NUMA':>{width}}")
    for i in range(n):
        cells = "".join(f"{topo.link_label(i, j):>{width}}" for j in range(n))
        numa = topo.numa[i] if topo.numa and topo.numa[i] is not None else "-"
        print(f"{f'GPU{i}':<{width}}{cells}{numa!s:>{width}}")
    return 0


def _place(args: argparse.Namespace) -> int:
    from labq.models.job import JobSpec
    from labq.models.node import cpu_list_text, cpu_mask, parse_cpu_list
    from labq.models.sharing import mib_text
    from labq.models.topology import NVLINK_WEIGHT
    from labq.scheduler import Policy
    from labq.scheduler.host import best_near_set, choose_cpus, need_on, short_text
    from labq.scheduler.placement import indices_to_mask, mask_to_indices
    from labq.units import parse_size_mib

    inv = _inventory(args.inventory)
    n = inv.gpu_count
    try:
        busy = sorted({int(x) for x in args.busy.replace(" ", "").split(",") if x})
    except ValueError:
        raise CliError(f"--busy takes GPU indices separated by commas, e.g. 0,3 (got {args.busy!r})") from None
    wrong = [i for i in busy if not 0 <= i < n]
    if wrong:
        raise CliError(f"--busy: {inv.name} has GPUs 0-{n - 1}; no GPU {', '.join(map(str, wrong))}")
    if args.gpus < 1:
        raise CliError("--gpus must be 1 or more")
    if args.cpus is not None and not 0 < args.cpus <= 4096:
        raise CliError("--cpus must be more than 0 (1.5 allowed)")
    try:
        memory = parse_size_mib(args.mem) if args.mem is not None else None
        busy_cpus = cpu_mask(parse_cpu_list(args.busy_cpus))
    except ValueError as err:
        raise CliError(f"--mem or --busy-cpus: {err}") from None
    node = inv.node(f"sim-{inv.name}")
    need = need_on(JobSpec(user="you", command=("job",), gpus=args.gpus, cpus=args.cpus, memory_mib=memory), node,
                   Policy())
    free_cpus = node.cpu_mask & ~busy_cpus
    free = ((1 << n) - 1) & ~indices_to_mask(busy)
    if free.bit_count() < args.gpus:
        raise CliError(f"{args.gpus} GPUs asked, {free.bit_count()} free on sim:{inv.name}")
    short = short_text(need, free_cpus, node.memory_mib, f"sim:{inv.name}")
    if short is not None:
        raise CliError(f"{short} (it has {len(node.cpus)} CPUs and {mib_text(node.memory_mib or 0)})")
    choice, _ = best_near_set(node, free, args.gpus, need, free_cpus)
    cpus, far = choose_cpus(node, choice.mask, need.count, free_cpus)
    cpu_set = cpu_list_text(mask_to_indices(cpus))
    links = sum(inv.topology.links(i, j) for k, i in enumerate(choice.gpus) for j in choice.gpus[k + 1:])
    if args.json:
        print(json.dumps({"inventory": f"sim:{inv.name}", "gpus": list(choice.gpus), "score": choice.score,
                          "nvlink_links": links, "free_connectivity_lost": choice.loss, "cpu_set": cpu_set,
                          "cpus": need.cores, "memory_mib": need.memory_mib, "far_cpus": far}, indent=2))
        return 0
    print(f"GPUs {','.join(map(str, choice.gpus))} on sim:{inv.name}")
    print(f"  score {choice.score} ({links} NVLink links within the set, PCIe points {choice.score % NVLINK_WEIGHT})")
    print(f"  connectivity the free GPUs lose: {choice.loss}")
    near = f", {far} of them away from its GPUs' NUMA node (none free there)" if far else ", near its GPUs"
    print(f"  CPUs {cpu_set} ({need.cores:g} cores{near}); memory {mib_text(need.memory_mib or 0)}")
    return 0
