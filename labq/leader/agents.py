"""The agents: joining, the level-triggered sync (a long poll), and the orders each node gets.

An agent reports every attempt its runtime knows; the leader learns from the
report (starts, exits, checkpoints, the GPUs busy outside labq), and answers
with what should run there and what must stop. A quiet sync waits until that
answer changes, for at most half the lease, and only the agent's reports renew
its lease.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from dataclasses import replace
from operator import attrgetter

from labq.leader.auth import Principal, new_token
from labq.leader.state import AgentSession, LabState
from labq.leader.joins import Joins
from labq.leader.users import admin_only, user_only
from labq.models import sharing
from labq.models import transitions as t
from labq.models.actions import timeout_grace
from labq.models.job import Job, JobState, StopReason
from labq.models.node import NodeHealth
from labq.protocol import errors
from labq.protocol.agents import (
    AttemptReport, Registration, RunOrder, StopOrder, SyncReply, SyncReport, encode_account, encode_problem,
)
from labq.protocol.codec import encode_node
from labq.protocol.identity import token_hash
from labq.store import DeleteRecord, PutRecord

log = logging.getLogger("labq.leader")
_BY_ID = attrgetter("id")

class Agents:
    def __init__(self, state: LabState, joins: Joins) -> None:
        self.state = state
        self.joins = joins  #: the one-time join tokens (``labq.leader.joins``), shared with ``Users``
        self.ca = None  #: the lab's CA (``labq.leader.certs.LabCA``) in a TLS lab: it signs the agents' certificates
        self._logs_tls: dict = {}  #: node -> the client context its log server is checked by
        self._replies = 0
        self.epoch = ""  #: this leader process: agents order its sync replies by (epoch, seq)

    def register(self, who: Principal, registration: Registration,
                 address: str | None = None) -> tuple[str, str | None]:
        """A node joins (a join token) or joins again (its agent's certificate): (its agent token, the
        certificate the lab's CA signed for its signing request, when it sent one)."""
        node, state = registration.node, self.state
        if who.kind == "agent" and who.name != node.name:
            raise errors.forbidden(f"agent {who.name} may join again as {who.name} only, not as {node.name}")
        if who.kind not in ("join", "agent"):
            raise errors.forbidden("agents register with the cluster's join token")
        token = new_token("agent")
        with state.lock:
            old = state.agents.get(node.name)
            spent = self._admit(who, node.name, old)
            cert_pem, cert_sha256 = self._certificate(registration, old)
            logs_url = registration.logs_url
            if logs_url and address and "//0.0.0.0:" in logs_url:  # listening everywhere: use where it came from
                logs_url = logs_url.replace("//0.0.0.0:", f"//{address}:")
            session = AgentSession(node.name, node, token_hash(token), logs_url, new_token("logs"),
                                   last_seen=state.clock(), address=address, cert_sha256=cert_sha256)
            if old is not None:
                session.version = old.version + 1
            state.commit([PutRecord("agents", node.name, session.record()), *(spent[1] if spent else [])])
            state.agents[node.name] = session
            if spent is not None:
                self.joins.take(spent[0])
            state.changed.notify_all()
        state.events.publish("node", {"node": node.name, "health": "up"})
        log.debug("node %s %s (%s)", node.name,  # the audit trail keeps it (``labq events``) "joined again by its certificate" if who.kind == "agent" else
                 "joined with " + ("the lab's join token" if who.name == "lab" else f"one-time join token {who.name}"),
                 address or "?")
        state.wake()
        return token, cert_pem

    def _admit(self, who: Principal, name: str, old: AgentSession | None):
        """May ``who`` register node ``name``? For a one-time join token: (it spent, the changes that say so);
        None otherwise (the lock is held)."""
        if who.kind == "agent":
            return None
        if old is not None and old.cert_sha256 is not None:
            raise errors.forbidden(f"node {name} has joined already and holds its own certificate: no join token can "
                                   f"take its name (if that machine was reinstalled, an admin runs `labq admin node "
                                   f"forget {name}`)")
        if who.name == "lab":
            return None
        return self.joins.spend(self.joins.find_id(who.name), name, self.state.clock())

    def _certificate(self, registration: Registration, old: AgentSession | None) -> tuple[str | None, str | None]:
        """(a new certificate for the agent's signing request, the SHA-256 of the one it holds now)."""
        if registration.csr is None or self.ca is None:
            return None, old.cert_sha256 if old is not None and self.ca is not None else None
        try:
            pem = self.ca.sign_agent(registration.csr, registration.node.name)
        except ValueError as err:
            raise errors.bad_request(f"csr: {err}", "csr") from None
        return pem, hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()

    def logs_tls(self, node: str, url: str):
        """The context to fetch logs from node ``node`` at ``url``: the lab's CA, and the certificate it signed
        for that node's agent (``NODE.agent.labq``), none other; None for a plain ``http://`` log server."""
        if not url.startswith("https://"):
            return None
        if self.ca is None:
            raise errors.unavailable(f"node {node} serves logs over TLS, and this leader has no CA to check it by")
        from labq.tls import agent_name, client_context

        context = self._logs_tls.get(node)
        if context is None:
            context = self._logs_tls[node] = client_context(self.ca.cert_pem, expect=agent_name(node))
        return context

    def forget(self, who: Principal, name: str) -> dict:
        """An admin forgets node ``name`` (a machine reinstalled or retired): its certificate and token stop
        working, and a join token may take its name again. Refused while jobs hold its GPUs."""
        admin_only(who, "forget nodes")
        state = self.state
        with state.lock:
            session = state.agents.get(name)
            if session is None:
                raise errors.not_found(f"there is no node {name!r}")
            busy = sorted(j.id for j in state.on_gpus.values() if j.placement is not None and name in j.placement.nodes)
            if busy:
                raise errors.conflict(f"job{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} "
                                      f"{'hold' if len(busy) > 1 else 'holds'} GPUs on {name}: cancel them, or stop "
                                      "its agent and let the lease requeue them, then forget it")
            state.commit([DeleteRecord("agents", name)])
            del state.agents[name]
            state.changed.notify_all()
        state.events.publish("node", {"node": name, "health": "forgotten"})
        state.wake()
        return {"node": name}

    def logs_of(self, node: str) -> tuple[str | None, str | None] | None:
        """Where node ``node`` serves job logs, and the token it wants: None for a node the lab does not know."""
        with self.state.view:
            session = self.state.agents.get(node)
            return (session.logs_url, session.logs_token) if session else None

    def view(self, who: Principal) -> list[dict]:
        user_only(who)
        state = self.state
        with state.view:
            in_use: dict[str, dict[int, int]] = {}
            shared: dict[str, dict[str, list[dict]]] = {}
            for job in state.on_gpus.values():
                if job.placement is None:
                    continue
                for a in job.placement.allocations:
                    for g in a.gpu_indices:
                        if job.spec.share_mib is None:
                            on_node = in_use.setdefault(a.node, {})
                            # a job handed over to wait there (Slurm) shows once the one it waits for has gone
                            if job.state is not JobState.STARTING or g not in on_node:
                                on_node[g] = job.id
                        else:
                            used, peak = state.gpu_mem.get(job.id, (None, None))
                            shared.setdefault(a.node, {}).setdefault(str(g), []).append(
                                {"job_id": job.id, "user": job.user, "declared_mib": job.spec.share_mib,
                                 "need_mib": sharing.need_mib(job), "used_mib": used, "peak_mib": peak})
            return [{**encode_node(s.node), "gpus_in_use": in_use.get(name, {}),
                     "gpus_shared": shared.get(name, {}), "last_seen": s.last_seen,
                     "gpu_usage": {str(i): u for i, u in (s.gpu_usage or {}).items()},
                     "found": "mDNS" if name in state.seen_over_mdns else "join token",
                     "address": s.address, "accounts": [encode_account(a) for a in s.node.accounts],
                     "problems": [encode_problem(p) for p in s.node.problems]}
                    for name, s in sorted(state.agents.items())]

    def seen_over_mdns(self, advertised: dict[str, dict]) -> None:
        """The agents of this lab now advertising over mDNS, by node name (a hint; admission is by join token)."""
        with self.state.view:
            self.state.seen_over_mdns = advertised

    def unadmitted(self) -> list[dict]:
        """Agents advertising this lab over mDNS that have not joined (no or a wrong join token)."""
        with self.state.view:
            return [dict(seen, node=name) for name, seen in sorted(self.state.seen_over_mdns.items())
                    if name not in self.state.agents]

    def sync(self, who: Principal, agent: str, report: SyncReport) -> SyncReply:
        if who.kind != "agent" or who.name != agent:
            raise errors.forbidden(f"only agent {agent} may sync as {agent}")
        state = self.state
        # an agent is heard only when it reports, so a poll never outlasts half its lease
        deadline = state.monotonic() + min(report.wait_s, state.config.lease_s / 2)
        with state.lock:  # the report is a change
            session = state.agents[agent]
            changed = self._take_report(session, report)
            seen = session.version
            news = changed or self._news_for(session, report)
        with state.view:  # the wait is a look: changes go on meanwhile, and end it
            if not news:
                while session.version == seen and not state.stopping.is_set():
                    left = deadline - state.monotonic()
                    if left <= 0:
                        break
                    state.lock.wait(left)  # waiting is not hearing: last_seen stays at the report
            session.delivered = self._orders_for(session)
            self._replies += 1
            reply = replace(session.delivered, seq=self._replies, epoch=self.epoch)
        state.on_disk()  # orders go out once the changes they come of are on disk
        return reply

    def _take_report(self, session: AgentSession, report: SyncReport) -> bool:
        """Learn from an agent's report; True if anything changed."""
        state = self.state
        now = state.clock()
        session.last_seen = now
        changed = False
        if session.node.health is not NodeHealth.UP:
            session.node = replace(session.node, health=NodeHealth.UP)
            state.events.publish("node", {"node": session.name, "health": "up"})
            changed = True
        if report.gpu_usage is not None:
            session.gpu_usage = report.gpu_usage
            state.measure(session.name, report.gpu_usage, now)  # before the attempts it reports ended
        if report.unmanaged_busy is not None and report.unmanaged_busy != session.node.unmanaged_busy:
            session.node = replace(session.node, unmanaged_busy=report.unmanaged_busy)
            changed = True
        if report.unmanaged_mib is not None:
            unmanaged_mib = tuple(sorted(report.unmanaged_mib.items()))
            if unmanaged_mib != session.node.unmanaged_mib:
                session.node = replace(session.node, unmanaged_mib=unmanaged_mib)
                changed = True
        changed = self._take_accounts(session, report) or changed  # before the attempts: a requeued job
        # must not go back to a node that has just said it cannot start it
        updates = [new for a in report.attempts if (new := self._learned(session.name, a, now)) is not None]
        if updates:
            state.apply(updates)
            changed = True
        if changed:
            state.wake()
        return changed

    def _take_accounts(self, session: AgentSession, report: SyncReport) -> bool:
        """Take in the accounts and problems an agent reports (each report is the whole truth); True if they
        changed. Whoever waits for an agent's word on a user (``Users.add``) is woken."""
        node = session.node
        if report.accounts is not None:
            session.reports_accounts = True
        accounts = node.accounts if report.accounts is None else tuple(sorted(report.accounts, key=lambda a: a.user))
        problems = node.problems if report.problems is None else report.problems
        if (accounts, problems) == (node.accounts, node.problems):
            return False
        for problem in set(problems) - set(node.problems):
            log.warning("node %s cannot start %s now: %s", session.name, _concerned(problem), problem.detail)
        for problem in set(node.problems) - set(problems):
            log.info("node %s can start %s again", session.name, _concerned(problem))
        session.node = replace(node, accounts=accounts, problems=problems)
        self.state.changed.notify_all()
        return True

    def _learned(self, agent: str, a: AttemptReport, now: float) -> Job | None:
        """The job after what an agent reported of one of its attempts; None if nothing changed."""
        expected = self._expected(agent, a)
        if expected is None:
            return None
        job = t.declared(expected, a.checkpoint_signal, a.signal_from)
        if job is not expected:
            log.info("job %d checkpoints on %s, as %s", job.id, job.learned_signal, job.learned_from.words)
        if a.running:
            starting = job.state is JobState.STARTING
            if starting and a.waiting is not None:  # handed to Slurm, which has not started it yet
                self.state.waiting_there[job.id] = f"{agent}: {a.waiting}"
                return None if job is expected else job
            new = t.running(job, a.started_at or now) if starting else job
            new = t.checkpointed(new, a.checkpoint_at)
            if a.gpu_mem_mib is not None and job.spec.share_mib is not None:
                new = self._watched(agent, new, a)
            return new if new is not expected else None
        if a.cannot_start is not None and t.stop_reason(job) is None:
            return self._not_started(agent, job, a.cannot_start, a.ended_at or now)
        # it may have ended before any report saw it running
        started = job if job.started_at is not None else t.running(job, a.started_at or now)
        if a.fenced:  # stopped on its node while the agent could not reach us
            return t.lost(started, a.ended_at or now, checkpoint_at=a.checkpoint_at)
        return t.exited(started, a.exit_code, a.ended_at or now, escalated=a.escalated, checkpoint_at=a.checkpoint_at,
                        why=a.refused or (t.out_of_memory(job, a.memory_peak_mib) if a.oom else None))

    def _watched(self, agent: str, job: Job, a: AttemptReport) -> Job:
        """A sharing job's GPU memory as its agent measured it: kept for ``labq gpus``, and past its declaration
        and the margin, the job is asked to stop through its checkpoint contract (``labq.models.sharing``)."""
        peak = max(a.gpu_mem_peak_mib or 0, a.gpu_mem_mib or 0)
        self.state.gpu_mem[job.id] = (a.gpu_mem_mib, peak)
        gpus = job.placement.gpus_on(agent)
        gpu = gpus[0] if gpus else None
        session = self.state.agents.get(agent)
        if gpu is None or session is None or gpu >= len(session.node.gpus):
            return job
        memory = session.node.gpus[gpu].memory_mib
        need = sharing.need_mib(job)
        if peak <= sharing.limit_mib(need, memory) or job.stop_requested is not None:
            return job
        log.info("job %d uses %d MiB of GPU memory on %s GPU %d, over the %d MiB it declared and the margin: "
                 "stopping it", job.id, peak, agent, gpu, need)
        return t.over_memory(job, peak, sharing.over_memory_note(peak, need, memory, f"{agent} GPU {gpu}"))

    @staticmethod
    def _not_started(agent: str, job: Job, why: str, now: float) -> Job:
        """The node could not start the attempt for a reason of its own: the job goes back to the queue (its
        attempt ends ``lost``), not to failed, and its note says why. The node's report of the same sync
        keeps it, and jobs like it, off that node."""
        log.warning("job %d attempt %d could not start on %s: %s; requeued", job.id, job.attempt, agent, why)
        line = f"could not start on {agent}: {why}; requeued"
        requeued = t.lost(job, now)
        if line in requeued.note:
            return requeued
        return requeued.evolve(note=f"{requeued.note}; {line}" if requeued.note else line)

    def _expected(self, agent: str, a: AttemptReport) -> Job | None:
        job = self.state.jobs.get(a.job_id)
        if job is None or job.attempt != a.attempt or not job.state.holds_gpus or job.placement is None:
            return None
        return job if agent in job.placement.nodes else None

    def _news_for(self, session: AgentSession, report: SyncReport) -> bool:
        """Whether the agent should hear at once: it runs other than it should, or its orders changed."""
        orders = self._orders_for(session)
        reported = {(a.job_id, a.attempt) for a in report.attempts if a.running}
        wanted = {(r.job_id, r.attempt) for r in orders.run}
        return reported != wanted or orders != session.delivered

    def _orders_for(self, session: AgentSession) -> SyncReply:
        run, stop = [], []
        # the jobs on GPUs, by id as the lab holds its jobs: a sync reads them, not a long queue
        for job in sorted(self.state.on_gpus.values(), key=_BY_ID):
            if job.placement is None or session.name not in job.placement.nodes:
                continue
            run.append(self._run_order(job, session))
            if job.stop_requested == "timeout":
                stop.append(StopOrder(job.id, job.attempt, job.stop_signal, timeout_grace(job), "timeout"))
            elif job.state is JobState.PREEMPTING:
                stop.append(StopOrder(job.id, job.attempt, job.stop_signal, job.spec.grace_s, "preempted"))
            elif job.stop_requested == StopReason.OVER_MEMORY.value:  # its checkpoint contract, as a preemption
                stop.append(StopOrder(job.id, job.attempt, job.stop_signal, job.spec.grace_s, "over its GPU memory"))
            elif job.stop_requested:
                stop.append(StopOrder(job.id, job.attempt, "SIGTERM", min(job.spec.grace_s, 30.0), job.stop_requested))
        config = self.state.config
        return SyncReply(tuple(run), tuple(stop), config.lease_s, config.fence_after_s,
                         users=tuple(sorted(self.state.users)))

    def _run_order(self, job: Job, session: AgentSession) -> RunOrder:
        indices = job.placement.gpus_on(session.name)
        node = session.node
        uuids = tuple(node.gpus[i].uuid for i in indices)
        visible = ",".join(map(str, indices)) if node.simulated else ",".join(uuids)
        # what it took from its submitter's shell (a process job's), then its own --env, then labq's contract
        env = {**dict(job.spec.environment), **dict(job.spec.env)}
        env.update({"LABQ_JOB_ID": str(job.id), "LABQ_ATTEMPT": str(job.attempt),
                    "LABQ_RESUMED": "1" if job.attempt > 1 else "0", "LABQ_PREEMPT_SIGNAL": job.stop_signal,
                    "CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible})
        spec = job.spec
        limit = None
        if spec.share_mib is not None and indices:
            need = sharing.need_mib(job)
            limit = sharing.limit_mib(need, node.gpus[indices[0]].memory_mib)
            # what it may use, for the job to size its batches by; under MPS (when the node runs its control
            # daemon) also a hard limit on the one device it sees
            env.update({"LABQ_GPU_MEM_MIB": str(need), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit}M"})
        root = self.state.config.checkpoint_root
        # its CPUs and memory here, as the scheduler placed them (else as its spec asks, on a node that did not say
        # what it has). A simulated node's CPUs and memory are its model's, not the machine's it runs on: there the
        # job is held only to what its spec asked (the agent caps that at the machine's CPUs), and no CPU set
        alloc = None if node.simulated else job.placement.on(session.name)
        cpus = alloc.cpus if alloc is not None and alloc.cpus is not None else spec.cpus
        memory = alloc.memory_mib if alloc is not None and alloc.memory_mib is not None else spec.memory_mib
        return RunOrder(job.id, job.attempt, spec, env, indices, uuids, job.checkpoint_signal, node.simulated,
                        f"{root.rstrip('/')}/{job.id}" if root else None, limit,
                        cpu_set=alloc.cpu_set if alloc is not None else (), cpu_limit=cpus,
                        memory_limit_mib=memory)


def _concerned(problem) -> str:
    """Which jobs a node problem keeps off its node, in words."""
    parts = [f"{problem.user}'s" if problem.user else "", problem.runtime or "", "jobs",
             f"of image {problem.image}" if problem.image else ""]
    return " ".join(p for p in parts if p)
