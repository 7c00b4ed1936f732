"""Reading the leader's settings file (TOML) into a ``LeaderConfig``: every section's keys, each value checked.

An unknown section or key, or a value of the wrong shape, is a ``ConfigError`` that names the file, the key and
the value (but a secret's: a webhook URL, a password). The rules between settings are ``LeaderConfig``'s own.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from labq.leader.config import ConfigError, LeaderConfig, NotifyConfig
from labq.models.priority import PriorityClass, parse_priority
from labq.models.queues import QueueSpec
from labq.protocol.names import name_problem
from labq.units import parse_duration, parse_size_mib


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
        "allow_root": lambda v: values.update(allow_root=_bool(v)),
        "export": lambda v: values.update(export=_choice(str(v).upper(), ("ALL", "NONE"))),
        "cpus_per_gpu": lambda v: values.update(cpus_per_gpu=_positive(v) or None),
        "mem_per_gpu": lambda v: values.update(mem_per_gpu_mib=parse_size_mib(str(v)) or None)})
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


def _positive(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("must be a number, 0 or more")
    return float(value)


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
