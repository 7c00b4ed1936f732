"""The leader's settings (``LeaderConfig``; ``[notify]``'s in ``NotifyConfig``): each one and its default, the
rules they must keep together, and what they answer (a user's highest class, a job's queue, the leader's URL).

Every setting is optional in the one TOML file ``labq.leader.config_file`` reads; ``labq.leader.default_config``
is that file with every default, as ``labq leader --print-config`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labq.models.priority import PriorityClass
from labq.models.queues import QueueSpec, queues_of
from labq.paths import default_data_dir
from labq.protocol.agents import FENCE_LOOK_EVERY_S, KILL_AFTER_TERM_S
from labq.scheduler.policy import Policy


class ConfigError(ValueError):
    """Settings the leader will not run with, or a settings file it cannot read: the message says which and why."""


@dataclass(frozen=True)
class NotifyConfig:
    """``[notify]``: the lab's channels and how failed deliveries are retried (``labq.leader.notify``). The
    webhook's URL (a Slack webhook's is its secret) and the SMTP password stay out of reprs and logs."""

    webhook_url: str | None = field(default=None, repr=False)
    webhook_timeout_s: float = 10.0
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_starttls: bool = True
    smtp_user: str | None = None
    smtp_password: str | None = field(default=None, repr=False)
    #: the CA that signs the SMTP server's certificate, for a lab's own mail server (default: the system's CAs)
    smtp_ca_file: str | None = None
    email_from: str | None = None
    smtp_timeout_s: float = 10.0
    retry_first_s: float = 5.0
    retry_max_s: float = 600.0
    give_up_after_s: float = 86400.0

    @property
    def channels(self) -> tuple[str, ...]:
        """The channels configured: ``webhook``, ``email``."""
        return (("webhook",) if self.webhook_url else ()) + (("email",) if self.smtp_host else ())


@dataclass(frozen=True)
class LeaderConfig:
    host: str = "127.0.0.1"
    port: int = 7733
    data_dir: Path = field(default_factory=default_data_dir)
    request_timeout_s: float = 10.0
    max_connections_per_address: int = 128
    auth_failures_per_minute: int = 30
    tls: str = "auto"  #: "auto", "on" or "off"
    insecure: bool = False  #: plain HTTP allowed off loopback
    preemption: bool = True
    min_runtime_s: float = 300.0
    fair_share_half_life_s: float = 7 * 86400.0
    hold_depth: int = 16
    user_max_priority: int = int(PriorityClass.NORMAL)
    #: a class above user_max_priority, and who may use it besides admins (user names, ``@group``, ``*``)
    class_grants: dict[int, tuple[str, ...]] = field(default_factory=dict)
    max_preemptions_per_day: int | None = None
    aging_s: float | None = 86400.0  #: None: no aging (``labq.scheduler.policy.served_priority``)
    non_preemptible_users: tuple[str, ...] = ()
    may_preempt: dict[int, frozenset[int]] | None = None
    max_gpus_per_user: int | None = None
    user_gpu_quota: dict[str, int] = field(default_factory=dict)
    default_grace_s: float = 60.0
    max_grace_s: float = 240.0
    max_time_limit_s: float | None = None
    allowed_mount_roots: tuple[str, ...] = ()
    allowed_images: tuple[str, ...] = ()
    checkpoint_root: str | None = None
    allow_root: bool = False
    #: what of the submitting shell's environment a job gets when it does not say (``--export``): ALL or NONE
    export: str = "ALL"
    #: a job's CPUs and memory per GPU when it does not say (``--cpus``, ``--mem``); None: its node's share per GPU
    cpus_per_gpu: float | None = None
    mem_per_gpu_mib: int | None = None
    max_reserved_gpu_hours_per_week: float | None = None
    max_reservation_lead_s: float | None = 30 * 86400.0
    max_reservation_s: float | None = 7 * 86400.0
    reservation_at_end: str = "stop"
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    queues: tuple[QueueSpec, ...] = ()
    default_queue: str | None = None
    reclaim_grace_s: float | None = None  #: None: jobs.max_grace
    lease_s: float = 30.0
    fence_after_s: float = 600.0
    requeue_after_s: float = 900.0
    auto_requeue: bool = True
    #: ``labq usage`` shows the whole lab (everyone's use) to every user, not only to admins (``[usage] everyone``)
    usage_for_everyone: bool = False
    #: a read-only token that may scrape ``/metrics`` and nothing else (``[metrics] scrape_token``); kept out of reprs
    metrics_scrape_token: str | None = field(default=None, repr=False)
    #: ``[notify]``: webhook and e-mail channels, retries
    notify: NotifyConfig = field(default_factory=NotifyConfig)

    def policy(self) -> Policy:
        """The scheduler's knobs these settings give (the leader's, and ``labq sim --policy FILE``'s)."""
        return Policy(max_gpus_per_user=self.max_gpus_per_user, user_gpu_quota=self.user_gpu_quota,
                      preemption=self.preemption, min_runtime_s=self.min_runtime_s, hold_depth=self.hold_depth,
                      may_preempt=self.may_preempt, max_preemptions_per_day=self.max_preemptions_per_day,
                      aging_s=self.aging_s, queues=self.queues, cpus_per_gpu=self.cpus_per_gpu,
                      mem_per_gpu_mib=self.mem_per_gpu_mib,
                      reclaim_grace_s=self.reclaim_grace_s if self.reclaim_grace_s is not None else self.max_grace_s)

    def __post_init__(self) -> None:
        if self.lease_s <= 0 or self.fence_after_s <= self.lease_s:
            raise ConfigError("agents.fence_after must be longer than agents.lease, and the lease positive")
        if self.requeue_after_s <= self.last_stop_after_s:
            raise ConfigError(
                f"agents.requeue_after must be longer than {self.last_stop_after_s:g} s, so that a job is never "
                "requeued while its lost agent may still be running it: a lost node's job is stopped at the latest "
                "half a lease (its last long poll), fence_after, jobs.max_grace, the TERM-to-KILL "
                f"{KILL_AFTER_TERM_S:g} s and {2 * FENCE_LOOK_EVERY_S:g} s of looks after the node's last sync")
        if self.request_timeout_s <= 0 or self.max_connections_per_address < 1:
            raise ConfigError("leader.request_timeout and leader.max_connections_per_address must be positive")
        names = [q.name for q in self.queues]
        if self.default_queue is not None and self.default_queue not in names:
            raise ConfigError(f"queues.default = {self.default_queue!r} names no queue; queues: "
                              f"{', '.join(names) or 'none'}")
        percent = sum(q.guarantee_percent or 0 for q in self.queues)
        if percent > 100:
            raise ConfigError(f"the queues' guarantees add up to {percent:g}% of the lab, more than all of it")
        for q in self.queues:
            for m in q.members:
                if m.startswith("@") and m[1:] not in self.groups:
                    raise ConfigError(f"queues.{q.name}.members names @{m[1:]}, which is not in [groups]")
        if not self.uses_tls and not self.loopback_only and not self.insecure:
            raise ConfigError(f"leader.tls = \"off\" on {self.host}:{self.port} would send every token and job "
                              "in clear over the network: keep tls = \"auto\", listen on 127.0.0.1, or, on a "
                              "network you trust, set insecure = true in [leader]")

    def max_priority_for(self, user: str) -> int:
        """The highest priority ``user`` may ask for (admins may ask for any): the lab's ceiling for users,
        raised by the classes granted to them by name, by one of their groups, or to everyone."""
        best = self.user_max_priority
        for klass, names in self.class_grants.items():
            if klass > best and any(n in ("*", user) or (n.startswith("@") and user in self.groups.get(n[1:], ()))
                                    for n in names):
                best = klass
        return best

    def queue_for(self, user: str, asked: str | None, admin: bool = False) -> str | None:
        """The queue a job of ``user`` is served in: the one asked for (a member's, or any for an admin), else the
        user's only queue, else the default. ValueError says why not; None: the lab has no queues, or the user is
        in none and there is no default (the job uses what queues leave idle)."""
        if not self.queues:
            if asked is not None:
                raise ValueError("this lab has no queues ([queues] in the leader's settings); leave out --queue")
            return None
        names = [q.name for q in self.queues]
        mine = queues_of(user, self.queues, self.groups)
        if asked is not None:
            if asked not in names:
                raise LookupError(f"there is no queue {asked!r}; queues: {', '.join(names)}")
            if asked not in mine and asked != self.default_queue and not admin:
                also = f" (and the default, {self.default_queue})" if self.default_queue else ""
                raise PermissionError(f"{user} is not a member of queue {asked}; {user}'s queues: "
                                      f"{', '.join(mine) or 'none'}{also}")
            return asked
        if len(mine) == 1:
            return mine[0]
        if len(mine) > 1:
            if self.default_queue in mine:
                return self.default_queue
            raise ValueError(f"{user} is in queues {', '.join(mine)}: say which with --queue")
        return self.default_queue

    @property
    def last_stop_after_s(self) -> float:
        """How long after a lost node's last sync its jobs may still run there, at the most."""
        return (self.lease_s / 2 + self.fence_after_s + self.max_grace_s + KILL_AFTER_TERM_S
                + 2 * FENCE_LOOK_EVERY_S)

    @property
    def loopback_only(self) -> bool:
        """Whether the API listens on this machine's loopback alone: nothing it says leaves the machine."""
        import ipaddress

        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything

    @property
    def uses_tls(self) -> bool:
        return self.tls == "on" or (self.tls == "auto" and not self.loopback_only)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{'https' if self.uses_tls else 'http'}://{host}:{self.port}"
