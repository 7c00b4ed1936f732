"""``labq sim``: replay a trace or a generated lab workload through labq's scheduler, or a reference policy."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple

from labq.cli.common import command, leader_option
from labq.cli.errors import CliError

EXAMPLES = """\
  labq sim --generate --cluster 4xsim:dgx1                       a typical lab, two weeks
  labq sim --generate --cluster 4xsim:dgx1 --policy labq,fifo,sjf side by side
  labq sim --trace philly.csv --vc 11cb48 --cluster 16xsim:dgx1 --from 2017-10-01 --to 2017-12-01
  labq sim --trace jobs.csv --cluster 2xsim:ws-4x3090,1xsim:dgx-a100 --json > report.json
  labq sim --generate --cluster 4xsim:dgx1 --png queue.png        also draw the queue and utilization
  labq sim --trace philly.csv --per-vc --cluster 4xsim:dgx1       each virtual cluster on a cluster of its own
  labq sim --generate --cluster 4xsim:dgx1 --class ana=low --class ben=low   what if ana and ben were low?
  labq sim --from-history --since 30d                             the lab's last 30 days again, beside what happened
  labq sim --from-history --since 30d --policy new-leader.toml    ... under other scheduling settings
  labq sim --from-history --since 30d --quota ana=4 --class ben=high
  labq sim --from-history --since 2026-10-01 --until 2026-11-01 --cluster 6xsim:dgx1   with other machines

trace formats (--format, else guessed):
  philly  the Microsoft Philly trace: timestamp,duration,num_gpus,gpu_time,cluster
  csv     submit,duration,gpus[,user,class,preemptible,time_limit,vc,reservation]; times in seconds or ISO 8601
  jsonl   one job per line with the csv's keys; {"reservation": {...}} lines book reservations
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "sim", "replay a workload through the scheduler on a virtual clock",
                "Answer 'what if' questions before changing the lab: replay a real cluster trace, or a "
                "generated lab workload, through the same scheduling code the leader runs (policy labq), or "
                "through plain FIFO or shortest-job-first for comparison, on simulated nodes and a virtual "
                "clock that jumps from event to event. Reports queueing delay, job completion time (JCT), "
                "makespan, GPU utilization and preemptions, overall, per class and per user. With "
                "--from-history (admins), the workload is the lab's own finished jobs (their submit times, sizes, "
                "classes and the work they measured) on the lab's own nodes, and what really happened to them "
                "is reported beside the replay, as policy 'real'.",
                EXAMPLES, _sim, [leader_option()])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="a trace to replay")
    source.add_argument("--generate", action="store_true", help="generate a typical lab's workload (see --seed)")
    source.add_argument("--from-history", action="store_true",
                        help="the lab's own finished jobs, from the leader (admins; see --since/--until)")
    p.add_argument("--since", metavar="WHEN", default="30d",
                   help="with --from-history: jobs submitted from then (30d, 2026-10-01, yesterday; default 30d)")
    p.add_argument("--until", metavar="WHEN", help="with --from-history: jobs submitted before then (default now)")
    p.add_argument("--quota", dest="quotas", action="append", default=[], metavar="USER=N",
                   help="what if USER could hold at most N GPUs at once (repeat it; '*=N' for everyone)")
    p.add_argument("--format", choices=("philly", "csv", "jsonl"), help="the trace's format (default: guessed)")
    p.add_argument("--cluster", metavar="SPEC",
                   help="the simulated nodes: COUNTxsim:INVENTORY[,...], e.g. 16xsim:dgx1 (see `labq topo --list`)")
    p.add_argument("--policy", default="labq", metavar="NAMES|FILE",
                   help="labq, fifo or sjf; several with commas to compare them (default: labq); or a leader.toml, "
                        "whose scheduling settings ([scheduling], [quotas], [queues]) labq's policy then runs with, "
                        "instead of --min-runtime and --aging")
    p.add_argument("--from", dest="start", metavar="DATE", help="only jobs submitted from then (UTC), e.g. 2017-10-01")
    p.add_argument("--to", dest="end", metavar="DATE", help="only jobs submitted before then (UTC)")
    p.add_argument("--vc", metavar="NAME", help="only this virtual cluster's jobs (Philly)")
    p.add_argument("--per-vc", action="store_true",
                   help="one simulation per virtual cluster of the trace, each on its own --cluster")
    p.add_argument("--seed", type=int, default=0, help="the generated workload's seed (default 0)")
    p.add_argument("--days", type=int, default=14, help="days of generated workload (default 14)")
    p.add_argument("--users", type=int, default=6, help="users in the generated workload (default 6)")
    p.add_argument("--load", type=float, default=0.8,
                   help="offered load of the generated workload, as a share of the GPUs (default 0.8)")
    p.add_argument("--class", dest="classes", action="append", default=[], metavar="USER=CLASS",
                   help="run USER's jobs in CLASS (low, normal, high, urgent or 0-1000); USER * means everyone; "
                        "repeat it for several users, e.g. --class '*=normal' --class ana=low")
    p.add_argument("--save-workload", metavar="FILE", help="also write the workload as JSON lines (replay it later)")
    p.add_argument("--checkpoint-every", default="30m", metavar="DURATION",
                   help="how often jobs save; a preempted job redoes the work since (0: it saves on the signal)")
    p.add_argument("--grace", default="60s", metavar="DURATION", help="the checkpoint grace (default 60s)")
    p.add_argument("--min-runtime", default="5m", metavar="DURATION",
                   help="the admin's minimum runtime before a preemption (default 5m)")
    p.add_argument("--aging", default="0", metavar="DURATION",
                   help="serve jobs that waited longer than this before every low and normal job that waited less (oldest "
                   "first), as the leader's [scheduling] aging "
                   "does (its default is 24h; default here 0: no aging, to compare against)")
    p.add_argument("--queues", metavar="FILE", help="the lab's queues: a leader settings file whose [queues] (and "
                   "[groups]) to try; users go to their queues as at submit")
    p.add_argument("--queue", dest="queue_rules", action="append", default=[], metavar="USER=NAME",
                   help="serve USER's jobs in queue NAME (* means everyone else; vc:NAME=QUEUE maps a Philly virtual "
                   "cluster); queues not in --queues get equal shares of the lab, lend and borrow")
    p.add_argument("--reclaim-grace", metavar="DURATION",
                   help="with queues: only jobs whose grace is at most this borrow (default: any)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-plot", action="store_true", help="leave out the terminal plot")
    p.add_argument("--png", metavar="FILE", help="also draw the queue length and utilization into a PNG")


def _sim(args: argparse.Namespace) -> int:
    from labq.sim.cluster import parse_cluster
    from labq.sim.engine import SimOptions, simulate
    from labq.units import parse_duration

    try:
        options = SimOptions(checkpoint_every_s=parse_duration(args.checkpoint_every, bare_seconds=True),
                             grace_s=parse_duration(args.grace, bare_seconds=True),
                             min_runtime_s=parse_duration(args.min_runtime, bare_seconds=True),
                             aging_s=parse_duration(args.aging, bare_seconds=True) or None)
    except ValueError as err:
        raise CliError(str(err)) from None
    history = _history(args) if args.from_history else None
    policies, options = _policies(args.policy, options, args.quotas, history.settings if history else None)
    if history is None and args.cluster is None:
        raise CliError("--cluster is needed (e.g. --cluster 4xsim:dgx1), except with --from-history (the lab's nodes)")
    try:
        nodes = parse_cluster(args.cluster) if args.cluster else history.nodes
    except ValueError as err:
        raise CliError(str(err)) from None
    cluster = args.cluster or f"the lab's {len(nodes)} nodes"
    if history is not None:
        workload, notes = history.workload, list(history.notes)
        meta = {"workload": f"the lab's history, {_day(workload.epoch)} to {_day(history.until)}"}
    else:
        workload, notes, meta = _workload(args, sum(n.gpu_count for n in nodes))
    if args.classes:
        workload = _reclassed(workload, args.classes)
        meta["classes"] = ", ".join(args.classes)
    if args.quotas:
        meta["quotas"] = ", ".join(args.quotas)
    if args.queues or args.queue_rules:
        from dataclasses import replace

        workload, queues = _queued(workload, args.queues, args.queue_rules)
        grace = parse_duration(args.reclaim_grace, bare_seconds=True) if args.reclaim_grace else None
        options = replace(options, queues=queues, reclaim_grace_s=grace)
        meta["queues"] = ", ".join(f"{q.name} {q.guarantee_text}" for q in queues)
    if args.save_workload:
        from labq.sim.workload import write_jsonl

        write_jsonl(workload, Path(args.save_workload))
        notes.append(f"workload written to {args.save_workload}")
    for note in notes:
        print(f"labq sim: {note}", file=sys.stderr)
    if not workload.jobs:
        raise CliError("no jobs to simulate: check --since/--until against the lab's history" if history else
                       "no jobs to simulate: check --from/--to/--vc against the trace")
    if args.per_vc:
        return _print(args, _per_vc(args, workload, nodes, cluster, policies, options, meta))
    results = []
    if history is not None:
        from dataclasses import replace

        results.append(replace(history.real, cluster=cluster, gpus=sum(n.gpu_count for n in nodes), meta=dict(meta)))
    for policy in policies:
        result = simulate(workload, nodes, policy, cluster=cluster, options=options,
                          progress=_progress(policy, workload.epoch, len(workload.jobs)), meta=meta)
        _clear_progress()
        for reason, count in result.meta.get("never_started", {}).items():
            print(f"labq sim: {policy}: {count} jobs never started ({reason})", file=sys.stderr)
        for refused in result.meta.get("refused_reservations", []):
            print(f"labq sim: {policy}: reservation refused: {refused}", file=sys.stderr)
        results.append(result)
    return _print(args, results)


def _per_vc(args: argparse.Namespace, workload, nodes, cluster: str, policies: list[str], options, meta: dict):
    """``--per-vc``: each virtual cluster's jobs on a cluster of their own, one run per policy; each result
    named by its policy and its virtual cluster."""
    from dataclasses import replace

    from labq.sim.engine import simulate

    if args.vc or not args.trace:
        raise CliError("--per-vc replays every virtual cluster of a --trace: leave out --vc")
    vcs = sorted({job.vc for job in workload.jobs if job.vc})
    if not vcs:
        raise CliError("--per-vc: the trace names no virtual clusters (Philly's have them; a csv's vc column)")
    results = []
    for number, vc in enumerate(vcs, 1):
        part = replace(workload, jobs=tuple(job for job in workload.jobs if job.vc == vc))
        for policy in policies:
            label = f"{policy} ({vc})"
            result = simulate(part, nodes, policy, cluster=cluster, options=options, meta={**meta, "vc": vc},
                              progress=_progress(f"{label}, {number} of {len(vcs)}", part.epoch, len(part.jobs)))
            _clear_progress()
            results.append(replace(result, policy=label))
    return results


def _day(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(when))


def _policies(text: str, options, quotas: list[str], lab=None):
    """``--policy``: policy names, or a leader.toml whose scheduling settings labq's policy runs with; else
    ``lab``'s (a replay of the lab's history runs with the lab's own settings); and ``--quota USER=N`` on top.
    Returns the names and the options."""
    from dataclasses import replace

    from labq.scheduler import Policy
    from labq.sim.engine import POLICIES

    if Path(text).suffix == ".toml" or Path(text).is_file():
        from labq.leader.config import ConfigError
        from labq.leader.config_file import load_config

        try:
            config = load_config(Path(text))
        except ConfigError as err:
            raise CliError(f"--policy {text}: {err}") from None
        options = _with_settings(options, config.policy())
        policies = ["labq"]
    else:
        policies = [p.strip().lower() for p in text.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise CliError(f"unknown policy {', '.join(unknown) or '(none)'}: choose from {', '.join(POLICIES)}, "
                           "or give a leader.toml")
        if lab is not None:
            options = _with_settings(options, lab)
    if quotas:
        settings = options.settings or Policy()
        limits = dict(settings.user_gpu_quota)
        everyone = settings.max_gpus_per_user
        for rule in quotas:
            user, sep, count = rule.partition("=")
            if not sep or not user.strip() or not count.strip().isdigit() or int(count) < 1:
                raise CliError(f"--quota {rule!r}: write USER=N with N a number of GPUs, e.g. ana=4 or '*=8'")
            if user.strip() == "*":
                everyone = int(count)
            else:
                limits[user.strip()] = int(count)
        options = replace(options, settings=replace(settings, user_gpu_quota=limits, max_gpus_per_user=everyone))
    return policies, options


def _with_settings(options, policy):
    """``options`` running labq's policy with a lab's scheduling settings (the checkpoint model stays)."""
    from dataclasses import replace

    return replace(options, settings=policy, min_runtime_s=policy.min_runtime_s, aging_s=policy.aging_s,
                   queues=policy.queues, reclaim_grace_s=policy.reclaim_grace_s)


class _History(NamedTuple):
    """``--from-history``'s workload, what really happened, the lab's nodes, notes, the window's end and the lab's
    scheduling settings, from the leader."""

    workload: object
    real: object
    nodes: list
    notes: list[str]
    until: float
    settings: object


def _history(args: argparse.Namespace) -> _History:
    """``--from-history``: what the leader has of the window (``GET /v1/history``) and of its nodes."""
    from dataclasses import replace

    from labq.cli.common import leader_client
    from labq.models.node import NodeHealth
    from labq.protocol.codec import decode_job, decode_node
    from labq.protocol.history import policy_fields
    from labq.scheduler import Policy
    from labq.sim.history import workload_from_history
    from labq.when import parse_past

    now = time.time()
    try:
        since = parse_past(args.since, now)
        until = parse_past(args.until, now) if args.until else now
    except ValueError as err:
        raise CliError(f"--since/--until: {err}") from None
    if not since < until:
        raise CliError("--since must come before --until (and before now)")
    client = leader_client(args)
    answer = client.history(since, until)
    jobs = [decode_job(doc) for doc in answer["jobs"]]
    nodes = [replace(decode_node(doc), health=NodeHealth.UP) for doc in client.nodes()]
    if not nodes and not args.cluster:
        raise CliError("the lab has no nodes to replay on: name some with --cluster (e.g. 2xsim:dgx1)")
    workload, real, notes = workload_from_history(jobs, since, until)
    if answer.get("queues") and not args.queues:
        notes.append("the lab has queues: this replay runs without them (--policy LEADER.TOML or --queues FILE "
                     "replays them)")
    return _History(workload, real, nodes, notes, until, Policy(**policy_fields(answer["policy"])))


def _workload(args: argparse.Namespace, gpus: int):
    """The workload (a generated one sized to the cluster's ``gpus``), notes about it for stderr, and
    what the report should say it was."""
    if args.generate:
        from labq.sim.workload import generate

        for name in ("days", "users"):
            if getattr(args, name) < 1:
                raise CliError(f"--{name} must be 1 or more")
        if not 0 < args.load <= 10:
            raise CliError("--load is a share of the GPUs: between 0 and 10, e.g. 0.8")
        workload = generate(seed=args.seed, days=args.days, users=args.users, gpus=gpus, load=args.load)
        return workload, [], {"workload": f"generated: seed {args.seed}, {args.days} days, {args.users} users, "
                                          f"load {args.load:g}"}
    from labq.sim.traces import TraceError, load_trace, parse_when

    try:
        start = parse_when(args.start) if args.start else None
        end = parse_when(args.end) if args.end else None
    except ValueError as err:
        raise CliError(str(err)) from None
    if start is not None and end is not None and end <= start:
        raise CliError("--to must come after --from")
    path = Path(args.trace)
    if not path.is_file():
        raise CliError(f"no trace file {path}")
    try:
        workload, notes = load_trace(path, args.format, start=start, end=end, vc=args.vc)
    except TraceError as err:
        raise CliError(str(err)) from None
    meta = {"workload": f"trace {path.name}", "from": args.start, "to": args.end, "vc": args.vc}
    return workload, list(notes), {k: v for k, v in meta.items() if v is not None}


def _reclassed(workload, rules: list[str]):
    """``--class USER=CLASS``: later rules win, so ``*=normal`` then ``ana=low`` gives ana low."""
    from dataclasses import replace

    from labq.models.priority import parse_priority

    classes: dict[str, int] = {}
    for rule in rules:
        user, sep, name = rule.partition("=")
        if not sep or not user.strip():
            raise CliError(f"--class {rule!r}: write USER=CLASS, e.g. ana=low or '*=normal'")
        try:
            classes[user.strip()] = parse_priority(name.strip())
        except ValueError as err:
            raise CliError(f"--class {rule!r}: {err}") from None

    def priority(job) -> int:
        return classes.get(job.user, classes.get("*", job.priority))

    return replace(workload, jobs=tuple(replace(j, priority=priority(j)) for j in workload.jobs))


def _queued(workload, settings: str | None, rules: list[str]):
    """Each job's queue: ``--queue USER=NAME`` (``vc:VC=NAME`` by virtual cluster, ``*=NAME`` for the rest), else
    the queue a submit of its user would get under ``--queues FILE``. Returns the workload and the queues."""
    from dataclasses import replace

    from labq.models.queues import QueueSpec

    config = None
    if settings:
        from labq.leader.config import ConfigError
        from labq.leader.config_file import load_config

        try:
            config = load_config(Path(settings))
        except ConfigError as err:
            raise CliError(str(err)) from None
        if not config.queues:
            raise CliError(f"{settings} defines no [queues.NAME]")
    by_user: dict[str, str] = {}
    by_vc: dict[str, str] = {}
    for rule in rules:
        who, sep, name = rule.partition("=")
        who, name = who.strip(), name.strip()
        if not sep or not who or not name:
            raise CliError(f"--queue {rule!r}: write USER=NAME, e.g. ana=nlp, '*=shared' or vc:6214e9=nlp")
        if who.startswith("vc:"):
            by_vc[who[3:]] = name
        else:
            by_user[who] = name
    queues = list(config.queues) if config else []
    named = {q.name for q in queues}
    extra = sorted({*by_user.values(), *by_vc.values()} - named)
    if extra and queues:
        raise CliError(f"--queue names {', '.join(extra)}, which {settings} does not define; its queues: "
                       f"{', '.join(sorted(named))}")
    queues += [QueueSpec(name, guarantee_percent=100.0 / len(extra)) for name in extra]

    def queue(job) -> str | None:
        if job.vc in by_vc:
            return by_vc[job.vc]
        if job.user in by_user or "*" in by_user:
            return by_user.get(job.user, by_user.get("*"))
        if config is not None:
            try:
                return config.queue_for(job.user, None)
            except ValueError:
                return None
        return None

    return replace(workload, jobs=tuple(replace(j, queue=queue(j)) for j in workload.jobs)), tuple(queues)


def _progress(policy: str, epoch: float, jobs: int):
    """A line on stderr every second or so while a long run goes (only on a terminal), with how far it got."""
    if not sys.stderr.isatty():
        return None
    last = [0.0]

    def show(now: float, done: int, total: int) -> None:
        if time.monotonic() - last[0] < 1.0:
            return
        last[0] = time.monotonic()
        day = time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch + now))
        sys.stderr.write(f"\r{policy}: virtual time {day} UTC, {done:,} of {total or jobs:,} jobs done "
                         f"({done / max(1, total or jobs):.0%}) ")
        sys.stderr.flush()

    return show


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()


def _print(args: argparse.Namespace, results: list) -> int:
    from labq.sim.report import compare_table, make_report, report_json, report_table

    reports = [make_report(r) for r in results]
    if args.png:
        from labq.sim.plot import png_plot

        for result in results:
            path = Path(args.png)
            if len(results) > 1:
                path = path.with_name(f"{path.stem}-{result.policy}{path.suffix or '.png'}")
            try:
                png_plot(result.samples, result.gpus, path, title=f"{result.policy} on {result.cluster}",
                         epoch=result.epoch)
            except RuntimeError as err:
                raise CliError(str(err)) from None
            print(f"labq sim: drew {path}", file=sys.stderr)
    if args.json:
        doc = report_json(reports[0]) if len(reports) == 1 else {"reports": [report_json(r) for r in reports]}
        print(json.dumps(doc, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    for report, result in zip(reports, results):
        console.print(report_table(report))
        if not args.no_plot and result.samples:  # what really happened has no samples of the queue
            from labq.sim.plot import terminal_plot

            console.print(terminal_plot(result.samples, result.gpus, width=min(console.width - 8, 100),
                                        epoch=result.epoch), markup=False, highlight=False)
    if len(reports) > 1:
        console.print(compare_table(reports))
    return 0
