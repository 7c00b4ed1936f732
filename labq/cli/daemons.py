"""``labq leader``, ``labq agent`` and ``labq up``: the long-running parts of labq."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from labq.cli.common import path_arg
from labq.cli.errors import CliError
from labq.terminal_text import escape_controls

if TYPE_CHECKING:
    from pathlib import Path

LEADER_EPILOG = """\
examples:
  labq leader                              serve on 127.0.0.1:7733, data in ~/.local/share/labq
  labq leader --listen 0.0.0.0:7733        serve the other workstations too
  labq leader --print-config > leader.toml the settings and their defaults
  labq leader --recover                    after a damaged database: back to the last sound state
"""

AGENT_EPILOG = """\
examples:
  labq agent --gpus sim:ws-4x3090          a simulated workstation on this machine's leader
  labq agent --leader http://gpu1:7733 --join-token-file join-token
"""

UP_EPILOG = """\
examples:
  labq up                                  this workstation's GPUs, one-machine lab
  labq up --gpus sim:dgx1                  simulated GPUs: try labq anywhere
"""


def add_commands(sub) -> None:
    leader = sub.add_parser("leader", help="run the leader: the lab's queue and API", epilog=LEADER_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Run the leader: it keeps the queue, schedules jobs onto the agents' GPUs "
                            "and serves the API. On a new lab it makes you the first admin and saves your token.")
    _leader_options(leader)
    leader.add_argument("--recover", action="store_true",
                        help="the database is damaged: go back to the last sound state (says what is lost first)")
    leader.add_argument("--yes", action="store_true", help="with --recover: do not ask")
    leader.add_argument("--print-config", action="store_true", help="print the settings file with its defaults")
    leader.add_argument("--no-mdns", action="store_true", help="do not announce the leader over mDNS")
    leader.set_defaults(run=_leader)

    agent = sub.add_parser("agent", help="run an agent: offer this machine's GPUs to the leader",
                           epilog=AGENT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Run an agent: it offers this machine's GPUs to the leader and runs the "
                           "jobs placed here. Jobs survive an agent restart.")
    _agent_options(agent)
    agent.add_argument("--leader", default=os.environ.get("LABQ_LEADER"),
                       help="the leader's URL (default: $LABQ_LEADER, else found over mDNS)")
    agent.add_argument("--no-mdns", action="store_true", help="do not announce this agent over mDNS")
    agent.add_argument("--join-token-file", type=path_arg, default=None,
                       help="file with the cluster's join token (default: $LABQ_JOIN_TOKEN, else the "
                       "leader's data folder on this machine)")
    agent.add_argument("--data-dir", type=path_arg, default=None, help=argparse.SUPPRESS)
    agent.set_defaults(run=_agent)

    up = sub.add_parser("up", help="leader and agent in one process: a one-workstation lab", epilog=UP_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Run the leader and an agent for this machine in one process: the simplest "
                        "lab. Submit from another shell with labq submit.")
    _leader_options(up)
    _agent_options(up)
    up.set_defaults(run=_up)

    demo = sub.add_parser("demo", help="a short tour of labq on simulated GPUs (about 20 seconds)",
                          description="Start a throwaway leader and a simulated 4-GPU workstation, add two lab users, "
                          "submit a few jobs as each and narrate what the queue does. Takes about 20 seconds and "
                          "says how long it took. Runs anywhere; leaves nothing behind.")
    demo.add_argument("--keep", action="store_true", help="keep the temporary folder for a look afterwards")
    demo.set_defaults(run=_demo)


def _leader_options(parser) -> None:
    parser.add_argument("--config", type=path_arg, default=None, help="settings file (TOML); see --print-config")
    parser.add_argument("--listen", default=None, metavar="HOST:PORT", help="address to serve the API on")
    parser.add_argument("--data-dir", type=path_arg, default=None, help="where the database lives")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--admin", default=None, metavar="NAME",
                        help="a new lab's first admin (default: you; under sudo, $SUDO_USER; root only with "
                        "allow_root = true in [jobs])")


def _agent_options(parser) -> None:
    parser.add_argument("--gpus", default=None, metavar="SPEC",
                        help="the GPUs to offer: NVML when omitted, or sim:NAME (see labq topo --list)")
    parser.add_argument("--name", default=None, help="this node's name (default: the host name)")
    parser.add_argument("--runtime", choices=("local", "slurm"), default="local",
                        help="where jobs run: on this machine (default), or as batch jobs of a Slurm partition "
                        "(--partition), this agent on a Slurm submit host")
    parser.add_argument("--partition", metavar="NAME", help="with --runtime slurm: the partition whose GPUs this agent "
                        "offers: each of its nodes is a labq node of its Slurm name")
    parser.add_argument("--slurm-node", metavar="NAME", help="with --runtime slurm: offer this node of the partition "
                        "alone, named --name")
    parser.add_argument("--slurm-gpu-memory", metavar="SIZE", default=None,
                        help="with --runtime slurm: the memory of each of the nodes' GPUs (80G), which Slurm does not "
                        "say; without it, jobs that ask for GPU memory (--gpu-mem) do not go there")
    parser.add_argument("--slurm-submit", choices=("uid", "sudo", "agent"), default=None,
                        help="with --runtime slurm: how a job goes to Slurm as its user: uid (sbatch --uid, the "
                        "default for an agent run as root), sudo (sudo -n -u USER sbatch, for a service account "
                        "the site's sudoers lets run sbatch and scancel as the lab's users) or agent (every job as "
                        "this agent's account, the default otherwise)")
    parser.add_argument("--state-dir", type=path_arg, default=None,
                        help="where the agent keeps logs and job state (default: in the data folder)")
    parser.add_argument("--local-socket", default=None, metavar="PATH",
                        help="where people on this machine reach the queue without a token: the agent vouches "
                        "for their Unix account (default: $LABQ_SOCKET, else /run/labq/agent.sock for an agent "
                        "run as root where /run/labq exists; off: none)")
    if not any(a.dest == "log_level" for a in parser._actions):
        parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _config(args):
    from labq.leader.config import ConfigError
    from labq.leader.config_file import load_config

    overrides = {}
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        if not port.isdigit():
            raise CliError(f"--listen {args.listen!r}: use HOST:PORT, e.g. 127.0.0.1:7733")
        if int(port) > 65535:
            raise CliError(f"--listen {args.listen!r}: a port is 0 to 65535 (0: any free port); nothing was created")
        overrides.update(host=host or "127.0.0.1", port=int(port))
    if args.data_dir:
        overrides["data_dir"] = args.data_dir.expanduser()
    try:
        return load_config(args.config, **overrides)
    except ConfigError as err:
        raise CliError(str(err)) from None


def _check_listen(host: str, port: int) -> None:
    """Bind the leader's address once and let it go, as the leader's server will (IPv4, SO_REUSEADDR): a port in
    use or an address not of this machine is refused before the lab's files and the first admin's token exist."""
    import errno
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            why = {errno.EADDRINUSE: f"port {port} is in use (another labq leader?)",
                   errno.EADDRNOTAVAIL: f"{host} is not an address of this machine",
                   errno.EACCES: f"port {port} needs root (ports below 1024)"}.get(err.errno)
            raise CliError(f"cannot listen on {host}:{port}: {why or err.strerror or err}; choose another address "
                           "with --listen HOST:PORT (or listen in the settings); nothing was created") from None


def _check_folder(path: Path, what: str) -> None:
    """A folder labq will make or write in: its nearest existing part must be a folder it may write in. Checked
    before anything is made, so that a bad one leaves nothing behind."""
    probe = path.absolute()
    while not (probe.exists() or probe.is_symlink()) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "it" if probe == path.absolute() else str(probe)
        raise CliError(f"{what} {path}: {where} is not a folder; choose another; nothing was created")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(f"{what} {path}: cannot write in {probe}; choose another; nothing was created")


def _start(args):
    """Start the leader for ``leader`` and ``up``; save the first admin's credentials."""
    from labq.credentials import save_credentials
    from labq.leader.main import StartError, configure_logging, recover_first, start_leader

    configure_logging(args.log_level)
    config = _config(args)
    _check_folder(config.data_dir, "the data folder")
    _check_listen(config.host, config.port)
    admin = _first_admin(args, config)
    try:
        if getattr(args, "recover", False):
            recover_first(config.data_dir, lambda text: _confirm(text, args.yes))
        running, token = start_leader(config, first_admin=admin.name if admin else None)
    except StartError as err:
        raise CliError(str(err)) from None
    if token is not None:  # saved before the line that says it serves, which people and scripts wait for
        if admin is not None and admin.uid is not None:  # root started it for someone: the token is theirs
            from labq.credentials import credentials_path

            path = save_credentials(running.url, token, credentials_path(admin.home), admin.uid, admin.gid,
                                    pin=running.pin)
            print(f"a new lab: {admin.name} is its first admin; their token is saved in {path}", file=sys.stderr)
        else:
            path = save_credentials(running.url, token, pin=running.pin)
            who = "you are its first admin; your token" if admin is None else f"{admin.name} is its first admin; the token"
            print(f"a new lab: {who} is saved in {path}", file=sys.stderr)
    pinned = f"; TLS, CA {running.pin}" if running.pin else ""
    print(f"labq leader serving {running.url} (data in {config.data_dir}{pinned})", file=sys.stderr)
    if not running.pin and not config.loopback_only:
        print(f"labq leader: warning: plain HTTP on {config.host}:{config.port} (insecure = true): tokens and jobs "
              "cross the network in clear", file=sys.stderr)
    return config, running


@dataclass(frozen=True)
class FirstAdmin:
    name: str
    uid: int | None = None  #: set when root names another account: the credentials go to its home
    gid: int | None = None
    home: str | None = None


def _first_admin(args, config) -> FirstAdmin | None:
    """Who becomes the first admin of a new lab: ``--admin``, else the person who ran it (``$SUDO_USER`` under
    sudo). root itself only with ``jobs.allow_root``: a lab user root would run its jobs as uid 0. Checked
    before anything is created; None keeps the account that runs the leader."""
    import pwd

    from labq.store.tinydb_store import DB_NAME

    name = getattr(args, "admin", None)
    if name is None and os.geteuid() != 0:
        return None
    if name is None:
        sudo_user = os.environ.get("SUDO_USER")
        if sudo_user and sudo_user != "root":
            name = sudo_user
    if name is None:
        if config.allow_root or (config.data_dir / DB_NAME).exists():  # an existing lab has its admins
            return None
        raise CliError("labq runs as root here and would make root the lab's first admin, whose jobs would run "
                       "as uid 0; nothing was created. Name the admin: --admin NAME (an account on this machine; "
                       "run it with sudo to name yourself), or allow jobs as root with allow_root = true in "
                       "the [jobs] section of the settings file (--config)")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return FirstAdmin(name)  # a lab user need not have an account on the leader's machine
    if entry.pw_uid == 0 and not config.allow_root:
        raise CliError(f"{name} is uid 0 here and jobs never run as root unless the settings say "
                       "allow_root = true in [jobs]; name another admin with --admin NAME; nothing was created")
    return FirstAdmin(name, entry.pw_uid, entry.pw_gid, entry.pw_dir) if os.geteuid() == 0 else FirstAdmin(name)


def _confirm(text: str, yes: bool) -> bool:
    print(text, file=sys.stderr)
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CliError("not recovering without a yes: run it in a terminal, or add --yes")
    return input("Recover? [y/N] ").strip().lower() in ("y", "yes")


def _leader(args) -> int:
    import socket

    if args.print_config:
        from labq.leader.default_config import DEFAULT_TOML

        print(DEFAULT_TOML, end="")
        return 0
    config, running = _start(args)
    print(f"agents join with the token in {config.data_dir / 'join-token'}", file=sys.stderr)
    if not args.no_mdns:
        from labq.leader.main import advertise

        advertise(running, socket.gethostname().split(".")[0])
    return _serve(running.stop, [running.leader.check, _serving(running)])


def _open_inventory(args):
    """The GPUs this agent offers (``--gpus``), read once: a bad spec or no GPU is refused before anything starts."""
    from labq.agent.inventory import NoGpuFound, open_inventory

    _node_name(args)
    if getattr(args, "runtime", "local") == "slurm":
        return _slurm_inventory(args)
    if any(getattr(args, name, None) for name in ("partition", "slurm_node", "slurm_submit", "slurm_gpu_memory")):
        raise CliError("--partition, --slurm-node, --slurm-submit and --slurm-gpu-memory are for --runtime slurm")
    try:
        inventory = open_inventory(args.gpus, args.name)
        inventory.read()
    except NoGpuFound as err:
        raise CliError(str(err)) from None
    except ValueError as err:
        raise CliError(str(err) if str(err).startswith("--gpus") else f"--gpus: {err}") from None
    if args.state_dir:
        _check_folder(args.state_dir.expanduser(), "--state-dir")
    return inventory


def _slurm_site(args, node: str | None = None):
    """``--runtime slurm``'s options, checked: the site (``node``: that Slurm node, else ``--slurm-node``)."""
    import shutil

    from labq.agent.slurm import SlurmSite

    if not args.partition:
        raise CliError("--runtime slurm needs --partition NAME: the Slurm partition whose GPUs this node offers")
    if args.gpus:
        raise CliError("--gpus and --runtime slurm: a Slurm node's GPUs are its GRES, not this machine's")
    submit = args.slurm_submit or ("uid" if os.geteuid() == 0 else "agent")
    if submit == "uid" and os.geteuid() != 0:
        raise CliError("--slurm-submit uid: sbatch takes --uid from root alone (\"--uid only permitted by root "
                       "user\"); an agent run as a service account can use --slurm-submit sudo")
    if submit == "sudo" and shutil.which("sudo") is None:
        raise CliError("--slurm-submit sudo: sudo is not installed on this machine")
    return SlurmSite(args.partition, node or args.slurm_node, submit)


def _slurm_inventory(args, node: str | None = None):
    """``--runtime slurm --partition P``: the GPUs of the partition's node (``node``, else its only one), by GRES."""
    from labq.agent.slurm import SlurmError, SlurmInventory
    from labq.units import parse_size_mib

    memory = 0
    if args.slurm_gpu_memory:
        try:
            memory = parse_size_mib(args.slurm_gpu_memory)
        except ValueError as err:
            raise CliError(f"--slurm-gpu-memory {args.slurm_gpu_memory!r}: {err}") from None
    try:
        inventory = SlurmInventory(_slurm_site(args, node), memory)
        inventory.read()
    except SlurmError as err:
        raise CliError(f"--runtime slurm: {err}") from None
    return inventory


def _open_inventories(args) -> list:
    """``_open_inventory``; for a Slurm partition of several nodes without ``--slurm-node``, one for each: the
    agent serves each as a labq node of the Slurm node's name."""
    if getattr(args, "runtime", "local") != "slurm" or args.slurm_node:
        return [_open_inventory(args)]
    from labq.agent.slurm import SlurmError
    from labq.protocol.names import name_problem

    try:
        nodes = _slurm_site(args).slurm_nodes()
    except SlurmError as err:
        raise CliError(f"--runtime slurm: {err}") from None
    if len(nodes) == 1:  # the inventory's site names it: nobody asks sinfo for it again
        _node_name(args)
        return [_slurm_inventory(args, nodes[0])]
    if not nodes:
        return [_open_inventory(args)]  # which says the partition has no nodes
    if args.name:
        raise CliError(f"--name names one node, and partition {args.partition!r} has nodes {', '.join(nodes)}: the "
                       "agent serves each as a labq node of its Slurm name (or choose one with --slurm-node)")
    for node in nodes:
        problem = name_problem(node, f"Slurm node {node!r} as a labq node name")
        if problem is not None:
            raise CliError(f"{problem}: run one agent for it with --slurm-node {node} --name NAME")
    if args.state_dir:
        raise CliError(f"--state-dir is one node's, and partition {args.partition!r} has nodes {', '.join(nodes)}: "
                       "each keeps its state in the data folder (or run one agent per node with --slurm-node)")
    return [_slurm_inventory(args, node) for node in nodes]


def _open_agent(args, inventory, leader_url: str, join_token: str, data_dir: Path, name: str | None = None,
                local_socket: bool = True):
    """The agent of one node (``name``, by default ``--name``); ``local_socket``: it serves this machine's people
    (one agent of a process may)."""
    from labq.agent.daemon import Agent, AgentConfig

    name = name or args.name
    state_dir = args.state_dir or data_dir / "agents" / name
    import urllib.parse

    local = urllib.parse.urlsplit(leader_url).hostname in ("127.0.0.1", "localhost", "::1")
    # the log server is token-protected; a leader on another machine must be able to reach it
    site = getattr(inventory, "site", None)
    as_users = {"run_as_job_user": True} if site is not None and site.submit == "sudo" else {}
    return Agent(AgentConfig(leader_url, join_token, name, state_dir.expanduser(),
                             logs_host="127.0.0.1" if local else "0.0.0.0",
                             local_socket=_local_socket(args) if local_socket else None, slurm=site, **as_users),
                 inventory)


def _local_socket(args) -> Path | None:
    """``--local-socket``: a path, ``off``, or by default ``$LABQ_SOCKET``, else ``/run/labq/agent.sock`` for an
    agent run as root where ``/run/labq`` exists (the service's runtime folder: examples/systemd); an agent run as
    anyone else runs every job as itself and serves no one else here."""
    from pathlib import Path

    from labq.agent.local_socket import DEFAULT_PATH

    chosen = args.local_socket or os.environ.get("LABQ_SOCKET")
    if chosen:
        return None if chosen == "off" else Path(chosen).expanduser()
    return DEFAULT_PATH if os.geteuid() == 0 and DEFAULT_PATH.parent.is_dir() else None


def _node_name(args) -> str:
    """``--name``, by default the host name; checked by the lab's one rule for names before anything starts."""
    import socket

    from labq.protocol.names import name_problem

    args.name = args.name or socket.gethostname().split(".")[0]
    problem = name_problem(args.name, "the node name")
    if problem is not None:
        raise CliError(f"{problem}; choose one with --name")
    return args.name


def _agent(args) -> int:
    from labq.leader.main import configure_logging
    from labq.paths import default_data_dir

    if args.name is not None:
        _node_name(args)  # a bad name is refused before anything else is looked at
    configure_logging(args.log_level)
    data_dir = args.data_dir or default_data_dir()
    token = os.environ.get("LABQ_JOIN_TOKEN")
    token_file = args.join_token_file or data_dir / "join-token"
    if not token:
        try:
            token = token_file.read_text().strip()
        except OSError as err:
            raise CliError(f"no join token: cannot read {token_file} ({err.strerror}); copy the file "
                           "from the leader's data folder and pass --join-token-file, or set $LABQ_JOIN_TOKEN"
                           ) from None
    from labq.protocol.identity import parse_join_token

    try:
        parse_join_token(token)
    except ValueError as err:
        raise CliError(f"the join token from {token_file if not os.environ.get('LABQ_JOIN_TOKEN') else '$LABQ_JOIN_TOKEN'}"
                       f" cannot be read: {err}") from None
    inventories = _open_inventories(args)
    leader_url = args.leader or _find_leader(token)
    several = len(inventories) > 1
    agents = [_open_agent(args, inventory, leader_url, token, data_dir, name=inventory.node if several else None,
                          local_socket=i == 0) for i, inventory in enumerate(inventories)]
    advertisers = []
    for agent in agents:
        _first_registration(agent, agent.leader_url)
        agent.start()
        advertisers.append(None if args.no_mdns else _advertise_agent(agent, token))
        print(f"labq agent {agent.config.name} serving the leader at {agent.leader_url}; {agent.runs_jobs_as()}",
              file=sys.stderr)
    note = agents[0].runtime.slurm.site.start_note() if agents[0].runtime.slurm is not None else None
    if note:
        print(f"labq agent: {note}", file=sys.stderr)

    def stop() -> None:
        for advertiser, agent in zip(advertisers, agents):
            if advertiser is not None:
                advertiser.close()
            agent.stop()

    return _serve(stop, [agent.check for agent in agents])


def _first_registration(agent, leader_url: str) -> None:
    """A refusal (a wrong join token, a bad name) stops the agent with why; a leader that cannot be reached
    yet does not: the agent starts and its sync loop registers as soon as the leader answers."""
    from labq.protocol.errors import ApiError

    try:
        agent.register()
    except ApiError as err:
        if err.code == "untrusted_leader":  # the join token's pin says it is not this lab's leader
            raise CliError(f"not joining: {escape_controls(err.message)}") from None
        if err.status < 500:
            raise CliError(f"the leader at {leader_url} refused this agent: {escape_controls(err.message)}") from None
        print(f"labq agent: the leader at {leader_url} cannot take the agent yet ({escape_controls(err.message)}); "
              "it keeps trying", file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - down, restarting, unreachable: the sync loop keeps trying
        print(f"labq agent: cannot reach the leader at {leader_url} yet ({type(err).__name__}: {escape_controls(err)}); "
              "it keeps trying", file=sys.stderr)


def _find_leader(join_token: str) -> str:
    """No --leader: the leader of this lab (the one whose cluster id the join token gives), over mDNS."""
    from labq.discovery import DiscoveryError, find_leaders, pick_leader
    from labq.protocol.identity import lab_of

    cluster = lab_of(join_token)
    try:
        found = pick_leader(find_leaders(3.0, cluster=cluster), cluster=cluster, waited_s=3.0)
    except DiscoveryError as err:
        raise CliError(str(err)) from None
    print(f"found the leader over mDNS: {found.url}", file=sys.stderr)
    return found.url


def _advertise_agent(agent, join_token: str):
    from labq.discovery import Advertiser
    from labq.protocol.identity import lab_of

    port = int(agent.logs_url.rsplit(":", 1)[1])
    props = {"node": agent.config.name, "gpus": len(agent.inventory.read().gpus),
             "cluster": lab_of(join_token)}
    try:
        return Advertiser("agent", agent.config.name, port, props).start()
    except Exception as err:  # discovery is a hint: an agent without multicast still works
        print(f"labq agent: cannot advertise over mDNS: {escape_controls(err)}", file=sys.stderr)
        return None


def _up(args) -> int:
    from labq.leader.main import join_token_path

    inventory = _open_inventory(args)  # all of up's input is checked before the leader makes the lab's files
    config, running = _start(args)
    try:
        agent = _open_agent(args, inventory, running.url, join_token_path(config).read_text().strip(),
                            config.data_dir)
        agent.register()
    except (CliError, Exception):
        running.stop()
        raise
    agent.start()
    print(f"labq up: node {args.name} is ready; {agent.runs_jobs_as()}", file=sys.stderr)
    print("labq up: submit with: labq submit -- COMMAND", file=sys.stderr)
    return _serve(lambda: (agent.stop(), running.stop()), [running.leader.check, _serving(running), agent.check])


def _demo(args) -> int:
    from labq.demo import run_demo

    return run_demo(keep=args.keep)


def _serving(running):
    """A check that the leader's HTTP thread still serves."""
    from labq.workers import WorkerFailed

    def check() -> list[str]:
        if not running.thread.is_alive():
            raise WorkerFailed("the leader's HTTP server thread stopped; see the errors above")
        return []
    return check


def _serve(stop, checks, every_s: float = 1.0) -> int:
    """Run until SIGINT or SIGTERM (exit 0), looking after the worker threads every second: a dead one is
    started again, and one that keeps dying stops the daemon with exit status 1, so that its service
    manager restarts it instead of it idling on without a part."""
    import logging
    import signal
    import threading

    from labq.workers import WorkerFailed

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    status = 0
    while not done.wait(every_s):
        try:
            for check in checks:
                check()
        except WorkerFailed as err:
            logging.getLogger("labq").error("stopping: %s", err)
            print(f"labq: stopping: {escape_controls(err)}", file=sys.stderr)
            status = 1
            break
    stop()
    return status
