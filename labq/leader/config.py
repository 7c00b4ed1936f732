"""The leader's settings: one TOML file, every key optional, defaults documented below."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from labq.models.priority import PriorityClass, parse_priority
from labq.models.queues import QueueSpec, queues_of
from labq.paths import default_data_dir
from labq.protocol.agents import FENCE_LOOK_EVERY_S, KILL_AFTER_TERM_S
from labq.protocol.names import name_problem
from labq.scheduler.policy import Policy
from labq.units import parse_duration

DEFAULT_TOML = """\
# labq leader settings. Every key is optional; these are the defaults.

[leader]
listen = "127.0.0.1:7733"        # address:port of the API; "0.0.0.0:7733" to serve other machines
# data_dir = "~/.local/share/labq" # the database, its previous copy, the archive, the join token
request_timeout = "10s"          # a client silent this long while sending a request is disconnected
max_connections_per_address = 128 # open connections from one address; more are answered 503 and closed
tls = "auto"                     # "auto": TLS unless listening on loopback only; "on": always; "off": never
insecure = false                 # allow plain HTTP on an address other machines reach (tokens in clear!)
auth_failures_per_minute = 30    # failed authentications one address may make a minute, then 429; 0: no limit

[scheduling]
preemption = true                # higher-priority jobs may preempt lower, preemptible ones
min_runtime = "5m"               # a job runs at least this long before it can be preempted
max_preemptions_per_day = 0      # a job preempted this often in 24 h is left alone; 0: no cap
non_preemptible_users = []       # who besides admins may submit --no-preempt jobs; ["*"]: everyone
fair_share_half_life = "7d"      # how fast past GPU-hours stop counting against a user
hold_depth = 16                  # blocked jobs that hold GPUs for themselves (backfill respects them)
aging = "24h"                    # a job waiting longer goes before every low and normal job that has waited
                                 # less (the aged oldest first), never before high or urgent; "0": no aging
user_max_priority = "normal"     # the highest class users may use, unless granted more below
# [scheduling.class_grants]      # who besides admins may use a class above user_max_priority
# high = ["alice", "@nlp"]       # users, @groups from [groups], or ["*"] for everyone
# [scheduling.may_preempt]       # which classes may preempt which; default: every class all lower ones
# urgent = ["low", "normal", "high"]
# high = ["low"]                 # a class left out preempts nothing

[quotas]
max_gpus_per_user = 0            # GPUs one user may hold at once; 0: no limit
# [quotas.users]                 # per-user overrides
# alice = 8

[jobs]
default_grace = "60s"            # time a job gets to checkpoint after its signal
max_grace = "4m"                 # lease/2 + fence_after + max_grace + 12s must stay below requeue_after
max_time_limit = "0"             # the longest --time accepted; "0": no limit
# checkpoint_root = "/shared/labq/checkpoints" # LABQ_CHECKPOINT_DIR is ROOT/JOB_ID; put it on storage every
#                                # node mounts so a job resumes on any node. Default: each agent's own folder
allowed_mount_roots = []         # host folders containers may mount (docker runtime)
allowed_images = []              # images the docker runtime may run; empty: any
allow_root = false               # true: jobs may run as uid 0 (root); false: a job of root is refused

[reservations]
max_gpu_hours_per_week = 0       # GPU-hours one user may book a week (from Monday 00:00 UTC); 0: no limit
max_lead_time = "30d"            # how far ahead a booking may start
max_duration = "7d"              # how long one booking may last
at_end = "stop"                  # jobs still running in it at its end: "stop" (like a time limit) or "keep"

# [groups]                       # for labq reserve --group NAME, queue members and class grants
# nlp = ["alice", "bob"]

# [queues]                       # teams that share the lab, each with a guaranteed share; none: one lab
# default = "shared"             # the queue of users in no queue; unset: their jobs use what queues leave idle
# reclaim_grace = "2m"           # only jobs with at most this grace borrow (default: jobs.max_grace), so a
#                                # queue gets borrowed GPUs back within it
# [queues.nlp]
# members = ["alice", "@nlp"]    # users and @groups; a user in several queues picks one with --queue
# guarantee = 4                  # GPUs, or "50%" of the lab's GPUs up
# cap = 8                        # the most GPUs its jobs hold at once, borrowed included; omitted: no cap
# lend = true                    # other queues' preemptible jobs may use its idle guarantee until it needs it
# borrow = true                  # its preemptible jobs may use other queues' idle GPUs
# max_wait = "48h"               # a job waiting longer preempts what stands in its way; omitted: no bound

[agents]
lease = "30s"                    # an agent silent this long is marked lost
fence_after = "10m"              # an agent that cannot reach the leader this long stops its jobs
requeue_after = "15m"            # the jobs of a lost agent are requeued after this long
auto_requeue = true              # false: an admin requeues them by hand

[usage]
everyone = false                 # true: every user sees the whole lab's `labq usage`, not only admins

[metrics]
# GET /metrics (Prometheus text) answers any person's token; a scrape token reads it and nothing else.
# Keep this file readable by the leader's account only when it holds one.
# scrape_token = "..."           # at least 24 characters: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'

[notify]
# Where the leader tells people of their jobs' moments (labq submit --notify end,fail; defaults: labq notify).
# A notice is kept in the database until it is delivered: retried, doubling, then given up (labq admin notify status).
retry_first = "5s"               # the first retry of a failed delivery comes this long after it
retry_max = "10m"                # the longest wait between retries
give_up_after = "1d"             # a notice this old is given up; its last error stays in the status
# [notify.webhook]               # an HTTP POST of JSON: {"text": ONE LINE, "labq": {...}}: Slack, Mattermost, ...
# url = "https://hooks.slack.com/services/..."   # a secret: never shown in full, never logged
# timeout = "10s"
# [notify.email]                 # e-mail over SMTP, to the address each person sets (labq notify --email)
# host = "smtp.lab.org"
# port = 587
# starttls = true                # false: plain SMTP (a relay on this machine or a trusted network only)
# ca_file = "/etc/labq/mail-ca.pem"   # the CA of a lab's own mail server (default: the system's CAs)
# user = "labq"                  # omit both for a relay that needs no login
# password = "..."               # keep this file readable by the leader's account only
# from = "labq@lab.org"
# timeout = "10s"
"""


class ConfigError(ValueError):
    pass


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
                      aging_s=self.aging_s, queues=self.queues,
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


def load_config(path: Path | None, **overrides) -> LeaderConfig:
    """Read ``path`` (if given) over the defaults; ``overrides`` (from the command line) win."""
    doc: dict = {}
    if path is not None:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"cannot read {path}: {err.strerror}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
    values: dict = {}
    where = str(path or "defaults")
    sections = {"leader", "scheduling", "quotas", "jobs", "reservations", "groups", "queues", "agents", "metrics",
                "usage", "notify"}
    for name in doc:
        if name not in sections:
            raise ConfigError(f"{where}: unknown section [{name}]; sections: {', '.join(sorted(sections))}")
    _take(doc.get("leader", {}), where, "leader", values, {
        "listen": lambda v: _listen(v, values), "data_dir": lambda v: values.update(data_dir=Path(v).expanduser()),
        "request_timeout": lambda v: values.update(request_timeout_s=parse_duration(v, bare_seconds=True)),
        "max_connections_per_address": lambda v: values.update(max_connections_per_address=_count(v)),
        "auth_failures_per_minute": lambda v: values.update(auth_failures_per_minute=_count(v)),
        "tls": lambda v: values.update(tls=_tls_mode(v)), "insecure": lambda v: values.update(insecure=_bool(v))})
    _take(doc.get("scheduling", {}), where, "scheduling", values, {
        "preemption": lambda v: values.update(preemption=_bool(v)),
        "min_runtime": lambda v: values.update(min_runtime_s=parse_duration(v, bare_seconds=True)),
        "fair_share_half_life": lambda v: values.update(fair_share_half_life_s=parse_duration(v, bare_seconds=True)),
        "hold_depth": lambda v: values.update(hold_depth=int(v)),
        "user_max_priority": lambda v: values.update(user_max_priority=parse_priority(v)),
        "max_preemptions_per_day": lambda v: values.update(max_preemptions_per_day=_count(v) or None),
        "aging": lambda v: values.update(aging_s=parse_duration(v, bare_seconds=True) or None),
        "non_preemptible_users": lambda v: values.update(non_preemptible_users=_names(v)),
        "may_preempt": lambda v: values.update(may_preempt=_class_rules(v)),
        "class_grants": lambda v: values.update(class_grants=_class_grants(v))})
    _take(doc.get("quotas", {}), where, "quotas", values, {
        "max_gpus_per_user": lambda v: values.update(max_gpus_per_user=int(v) or None),
        "users": lambda v: values.update(user_gpu_quota={_name(k, "user name"): int(n) for k, n in dict(v).items()})})
    _take(doc.get("jobs", {}), where, "jobs", values, {
        "default_grace": lambda v: values.update(default_grace_s=parse_duration(v, bare_seconds=True)),
        "max_grace": lambda v: values.update(max_grace_s=parse_duration(v, bare_seconds=True)),
        "max_time_limit": lambda v: values.update(max_time_limit_s=parse_duration(v, bare_seconds=True) or None),
        "allowed_mount_roots": lambda v: values.update(allowed_mount_roots=tuple(map(str, v))),
        "allowed_images": lambda v: values.update(allowed_images=tuple(map(str, v))),
        "checkpoint_root": lambda v: values.update(checkpoint_root=_absolute(v)),
        "allow_root": lambda v: values.update(allow_root=_bool(v))})
    _take(doc.get("reservations", {}), where, "reservations", values, {
        "max_gpu_hours_per_week": lambda v: values.update(max_reserved_gpu_hours_per_week=_hours(v) or None),
        "max_lead_time": lambda v: values.update(max_reservation_lead_s=parse_duration(v, bare_seconds=True) or None),
        "max_duration": lambda v: values.update(max_reservation_s=parse_duration(v, bare_seconds=True) or None),
        "at_end": lambda v: values.update(reservation_at_end=_choice(v, ("stop", "keep")))})
    groups = doc.get("groups", {})
    if not isinstance(groups, dict):
        raise ConfigError(f"{where}: [groups] must be a table of name = [users]")
    _take(groups, where, "groups", values, {
        name: (lambda v, name=name: values.setdefault("groups", {}).update({_name(name, "group name"): _names(v)}))
        for name in groups})
    _queues(doc.get("queues", {}), where, values)
    _take(doc.get("agents", {}), where, "agents", values, {
        "lease": lambda v: values.update(lease_s=parse_duration(v, bare_seconds=True)),
        "fence_after": lambda v: values.update(fence_after_s=parse_duration(v, bare_seconds=True)),
        "requeue_after": lambda v: values.update(requeue_after_s=parse_duration(v, bare_seconds=True)),
        "auto_requeue": lambda v: values.update(auto_requeue=_bool(v))})
    _take(doc.get("usage", {}), where, "usage", values, {
        "everyone": lambda v: values.update(usage_for_everyone=_bool(v))})
    _take(doc.get("metrics", {}), where, "metrics", values, {
        "scrape_token": lambda v: values.update(metrics_scrape_token=_scrape_token(v))})
    _notify(doc.get("notify", {}), where, values)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return LeaderConfig(**values)


def _notify(section, where: str, values: dict) -> None:
    """``[notify]``: retries, and the tables ``[notify.webhook]`` and ``[notify.email]``."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: [notify] must be a table")
    got: dict = {}

    def seconds(key: str):
        return lambda v: got.update({key: parse_duration(v, bare_seconds=True)})

    _take({k: v for k, v in section.items() if k not in ("webhook", "email")}, where, "notify", got, {
        "retry_first": seconds("retry_first_s"), "retry_max": seconds("retry_max_s"),
        "give_up_after": seconds("give_up_after_s")})
    for name in ("webhook", "email"):
        if name in section and not isinstance(section[name], dict):
            raise ConfigError(f"{where}: notify.{name} must be a table: [notify.{name}]")
    _take(section.get("webhook", {}), where, "notify.webhook", got, {
        "url": lambda v: got.update(webhook_url=_webhook_url(v)), "timeout": seconds("webhook_timeout_s")},
        secret=("url",))
    _take(section.get("email", {}), where, "notify.email", got, {
        "host": lambda v: got.update(smtp_host=_host(v)), "port": lambda v: got.update(smtp_port=_port(v)),
        "starttls": lambda v: got.update(smtp_starttls=_bool(v)), "user": lambda v: got.update(smtp_user=_text(v)),
        "password": lambda v: got.update(smtp_password=_text(v)), "from": lambda v: got.update(email_from=_address(v)),
        "ca_file": lambda v: got.update(smtp_ca_file=str(_absolute(v))),
        "timeout": seconds("smtp_timeout_s")}, secret=("password",))
    if "email" in section:
        if got.get("smtp_host") is None or got.get("email_from") is None:
            raise ConfigError(f"{where}: [notify.email] needs host and from")
        if (got.get("smtp_user") is None) != (got.get("smtp_password") is None):
            raise ConfigError(f"{where}: [notify.email] needs user and password together (or neither)")
    if "webhook" in section and got.get("webhook_url") is None:
        raise ConfigError(f"{where}: [notify.webhook] needs url")
    for key in ("retry_first_s", "retry_max_s", "give_up_after_s", "webhook_timeout_s", "smtp_timeout_s"):
        if key in got and got[key] <= 0:
            raise ConfigError(f"{where}: [notify] durations must be longer than 0")
    if got.get("retry_max_s", 600.0) < got.get("retry_first_s", 5.0):
        raise ConfigError(f"{where}: notify.retry_max must be at least notify.retry_first")
    if got:
        values["notify"] = NotifyConfig(**got)


def _webhook_url(value) -> str:
    """An ``http://`` or ``https://`` URL with a host; it is never repeated in an error (it may be a secret)."""
    from labq.transport import split_url

    text = value if isinstance(value, str) else ""
    try:
        parts = split_url(text)
    except ValueError:
        parts = None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not text.isprintable()
            or " " in text):
        raise ValueError("must be an http:// or https:// URL")
    return text


def _host(value) -> str:
    if not isinstance(value, str) or not value or not value.isprintable() or " " in value or len(value) > 253:
        raise ValueError("must be a host name or address")
    return value


def _port(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError("must be a port, 1-65535")
    return value


def _text(value) -> str:
    if not isinstance(value, str) or not value or not value.isprintable():
        raise ValueError("must be a printable string")
    return value


def _address(value) -> str:
    from labq.protocol.notify import email_problem

    problem = email_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _scrape_token(value) -> str:
    """A read-only token for Prometheus's scrapes of ``/metrics``: long enough not to be guessed."""
    text = str(value)
    if len(text) < 24 or not text.isascii() or not text.isprintable() or " " in text:
        raise ValueError("must be at least 24 printable ASCII characters without spaces "
                         "(e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return text


def _queues(section, where: str, values: dict) -> None:
    """``[queues]``: its settings, and one table per queue."""
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: [queues] must be a table")
    settings = {k: v for k, v in section.items() if not isinstance(v, dict)}
    _take(settings, where, "queues", values, {
        "default": lambda v: values.update(default_queue=_name(v, "queue name")),
        "reclaim_grace": lambda v: values.update(reclaim_grace_s=parse_duration(v, bare_seconds=True))})
    queues = []
    for name, table in section.items():
        if not isinstance(table, dict):
            continue
        try:
            _name(name, "queue name")
        except ValueError as err:
            raise ConfigError(f"{where}: [queues.{name}]: {err}") from None
        spec: dict = {"name": name}
        _take(table, where, f"queues.{name}", spec, {
            "members": lambda v: spec.update(members=_members(v)),
            "guarantee": lambda v: spec.update(_guarantee(v)),
            "cap": lambda v: spec.update(cap=_count(v)),
            "lend": lambda v: spec.update(lends=_bool(v)),
            "borrow": lambda v: spec.update(borrows=_bool(v)),
            "max_wait": lambda v: spec.update(max_wait_s=parse_duration(v, bare_seconds=True) or None)})
        queues.append(QueueSpec(**spec))
    if queues:
        values["queues"] = tuple(queues)


def _members(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError('must list users and @groups, e.g. ["alice", "@nlp"], or ["*"] for everyone')
    return tuple(v if v == "*" else ("@" + _name(v[1:], "group name") if v.startswith("@") else _name(v, "user name"))
                 for v in value)


def _guarantee(value) -> dict:
    """``4`` (GPUs) or ``"50%"`` (of the lab's GPUs up)."""
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = -1.0
        if not 0 <= percent <= 100:
            raise ValueError('a percentage must be between "0%" and "100%"')
        return {"guarantee_percent": percent}
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError('must be a number of GPUs (4) or a share of the lab ("50%")')
    return {"guarantee_gpus": value}


def _take(section: dict, where: str, name: str, values: dict, setters: dict, secret: tuple[str, ...] = ()) -> None:
    """Each key's setter; an error names the key and its value, but for the ``secret`` keys (a password)."""
    for key, value in section.items():
        if key not in setters:
            raise ConfigError(f"{where}: unknown key {name}.{key}; keys: {', '.join(sorted(setters))}")
        try:
            setters[key](value)
        except (ValueError, TypeError) as err:
            shown = "(not shown: a secret)" if key in secret else repr(value)
            raise ConfigError(f"{where}: {name}.{key} = {shown}: {err}") from None


def _tls_mode(value) -> str:
    if value not in ("auto", "on", "off"):
        raise ValueError('must be "auto" (TLS unless on loopback only), "on" or "off"')
    return value


def _bool(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def _hours(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a number of GPU-hours, 0 or more")
    return float(value)


def _choice(value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return value


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number, 0 or more")
    return value


def _names(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError('must be a list of user names, e.g. ["alice", "bob"], or ["*"] for everyone')
    return tuple(v if v == "*" else _name(v, "user name") for v in value)


def _name(value, what: str) -> str:
    """The protocol's one rule for names (printable, no control characters, bounded)."""
    problem = name_problem(value, what)
    if problem is not None:
        raise ValueError(problem)
    return value


def _class_rules(value) -> dict[int, frozenset[int]]:
    """``{urgent = ["low", "normal"], high = ["low"]}`` -> {400: {100, 200}, 300: {100}}."""
    if not isinstance(value, dict):
        raise ValueError('must be a table of class = ["class", ...], e.g. high = ["low"]')
    rules = {}
    for name, victims in value.items():
        klass = _class(name)
        if not isinstance(victims, list):
            raise ValueError(f'{name} must list the classes it may preempt, e.g. {name} = ["low"]')
        lower = frozenset(_class(v) for v in victims)
        if any(v >= klass for v in lower):
            raise ValueError(f"{name} may preempt only lower classes")
        rules[klass] = lower
    return rules


def _class_grants(value) -> dict[int, tuple[str, ...]]:
    """``{high = ["alice", "@nlp"]}`` -> {300: ("alice", "@nlp")}."""
    if not isinstance(value, dict):
        raise ValueError('must be a table of class = ["user", "@group", ...], e.g. high = ["alice", "@nlp"]')
    grants = {}
    for name, names in value.items():
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f'{name} must list users or @groups, e.g. {name} = ["alice", "@nlp"]')
        grants[_class(name)] = tuple(n if n == "*" else ("@" + _name(n[1:], "group name") if n.startswith("@")
                                                          else _name(n, "user name")) for n in names)
    return grants


def _class(name) -> int:
    if not isinstance(name, str) or name.upper() not in PriorityClass.__members__:
        raise ValueError(f"{name!r} is not a class: low, normal, high or urgent")
    return int(PriorityClass[name.upper()])


def _absolute(value) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError("must be an absolute path")
    return value.rstrip("/") or "/"


def _listen(value: str, values: dict) -> None:
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError("must be ADDRESS:PORT, e.g. 127.0.0.1:7733 (port 0: any free port)")
    values.update(host=host or "127.0.0.1", port=int(port))
