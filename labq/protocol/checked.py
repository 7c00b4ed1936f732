"""The requests as the leader takes them, once ``labq.protocol.requests`` has checked them: typed, immutable values.

They live apart from the checks so that the CLI, which builds its requests there and never reads one back, need
not import ``dataclasses`` (about 10 ms, as long as the rest of ``labq submit``'s start).
``labq.protocol.requests`` still names them: ``from labq.protocol.requests import SubmitRequest`` loads this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from labq.protocol.errors import bad_request

if TYPE_CHECKING:
    from labq.models.arrays import Sweep
    from labq.models.job import JobSpec


@dataclass(frozen=True)
class SubmitRequest:
    """A submission before the leader adds who sent it."""

    fields: dict
    #: the tasks of ``--array``/``--grid`` (``labq.models.arrays.Sweep``); None: one job
    sweep: Sweep | None = None

    def spec_for(self, user: str, *, default_grace_s: float = 60.0, default_export: str = "ALL") -> JobSpec:
        """The spec of ``user``'s job: the lab's grace unless it says, and the environment its submitter's shell
        gave only if it says ``--export`` or the lab exports by default (``[jobs] export``)."""
        from labq.models.job import JobSpec

        fields = self.fields
        if fields.get("export") is None and default_export == "NONE":
            fields = {**fields, "environment": ()}
        try:
            return JobSpec(user=user, **{"grace_s": default_grace_s, **fields})
        except ValueError as err:
            raise bad_request(str(err)) from None


@dataclass(frozen=True)
class ActionRequest:
    action: str
    priority: int | None = None  #: prio, edit: the new priority
    gpus: int | None = None  #: edit: the new GPU count (queued jobs only)
    time_limit_s: float | None = None  #: edit: the new time limit; 0 removes it
    by: int | None = None  #: prio: change the priority by this much instead (``+10``, ``-50``)
    name: str | None = None  #: edit: the new name; "" removes it


@dataclass(frozen=True)
class UserRequest:
    name: str
    admin: bool


@dataclass(frozen=True)
class TokenRequest:
    user: str
    name: str
    expires_s: float | None  #: None: the token does not expire


@dataclass(frozen=True)
class JoinRequest:
    node: str | None  #: the only node name that may join with it
    expires_s: float
