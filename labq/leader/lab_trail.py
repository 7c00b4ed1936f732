"""The lab's own steps in the audit trail, beside the requests people made: a job placed, started, asked to
make room, requeued or ended (``labq.models.story``), and a reservation's start and end. So ``labq events
--job 12`` tells the job's whole story, and ``--kind lab`` what the lab did on its own. Entries have
``kind: "lab"``, the job's or booking's ``owner`` (who sees them besides the admins), and no user. A step is told
as the leader takes it in, written and not yet synced (``labq.leader.state``): if its sync is lost, which stops the
leader's changes until a restart, the trail tells a step the restarted leader does not have."""

from __future__ import annotations

from labq.leader.audit import AuditLog
from labq.models.job import Job
from labq.models.reservation import Reservation
from labq.models.story import step_of


class LabTrail:
    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    def watch(self, versions: list[tuple[Job | None, Job]]) -> None:
        """Jobs' new versions taken in (``LabState.watchers``; the lab's view is held): each one's step, if any."""
        for old, new in versions:
            step = step_of(old, new)
            if step is None:
                continue
            entry = {"kind": "lab", "action": step.action, "job": new.id, "owner": new.user}
            if step.detail:
                entry["detail"] = step.detail
            self.audit.record(entry)

    def booking(self, r: Reservation, moment: str) -> None:
        """A reservation's moment come (``Bookings.moment_heard``: "started", "ended"; told once, as the
        reservation keeps what was told: a leader that restarts does not tell it again)."""
        where = f"{r.node} GPUs {','.join(map(str, r.gpu_indices))}" if r.node else ""
        self.audit.record({"kind": "lab", "action": f"reservation {moment}", "target": r.name, "owner": r.owner,
                           **({"detail": where} if where else {})})
