"""The lab's own steps in the audit trail, beside the requests people made: a job placed, started, asked to
make room, requeued or ended (``labq.models.story``), and a reservation's start and end. So ``labq events
--job 12`` tells the job's whole story, and ``--kind lab`` what the lab did on its own. Entries have
``kind: "lab"``, the job's or booking's ``owner`` (who sees them besides the admins), and no user."""

from __future__ import annotations

from labq.leader.audit import AuditLog
from labq.models.job import Job
from labq.models.reservation import Reservation
from labq.models.story import step_of


class LabTrail:
    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._told: dict[str, str] = {}  #: reservation name -> its last step told ("started", "ended")

    def watch(self, old: Job | None, new: Job) -> None:
        """A job's new version taken in (``LabState.watchers``; the lab's lock is held)."""
        step = step_of(old, new)
        if step is None:
            return
        entry = {"kind": "lab", "action": step.action, "job": new.id, "owner": new.user}
        if step.detail:
            entry["detail"] = step.detail
        self.audit.record(entry)

    def bookings(self, reservations: list[Reservation], now: float, *, quiet: bool = False) -> None:
        """Reservations that started or ended since the last look (``quiet``: note them, tell nothing: a
        leader that starts does not tell again what an earlier run told)."""
        for r in reservations:
            step = "ended" if now >= r.end else "started" if now >= r.start and r.cancelled_at is None else None
            if step is None or self._told.get(r.name) == step:
                continue
            self._told[r.name] = step
            if not quiet:
                where = f"{r.node} GPUs {','.join(map(str, r.gpu_indices))}" if r.node else ""
                self.audit.record({"kind": "lab", "action": f"reservation {step}", "target": r.name,
                                   "owner": r.owner, **({"detail": where} if where else {})})
