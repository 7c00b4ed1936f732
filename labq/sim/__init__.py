"""``labq sim``: replay a workload through labq's scheduler, or a reference policy, on a virtual clock.

- ``model``: what a workload and a result are (pure data).
- ``traces``: reading traces (Philly, CSV, JSON lines) into a workload.
- ``workload``: a generated lab workload (users, diurnal submissions, classes, a deadline week).
- ``cluster``: ``--cluster 4xsim:dgx1,2xsim:ws-4x3090`` into simulated nodes.
- ``engine``: the event loop, with the ``labq``, ``fifo`` and ``sjf`` policies.
- ``report``: queueing delay, JCT, utilization, preemptions; as a table, JSON and plots.
"""
