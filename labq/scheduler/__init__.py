"""The pure scheduler: a function of (jobs, nodes, reservations, usage, policy, now).

No I/O and no clock reads: the leader, the simulator and ``labq why`` all call
the same code with the time passed in.
"""

from labq.scheduler.cycle import schedule
from labq.scheduler.fit import eligible_mask, why_never_fits, why_never_fits_reservation, why_no_node_runs_user
from labq.scheduler.placement import SetChoice, best_set
from labq.scheduler.policy import Policy, decay_usage, order_queue

__all__ = ["Policy", "SetChoice", "best_set", "decay_usage", "eligible_mask", "order_queue", "schedule",
           "why_never_fits", "why_never_fits_reservation", "why_no_node_runs_user"]
