"""``labq export``: a job's spec as the same job for a bigger cluster, Slurm (``slurm``) or Kubernetes (``k8s``).

Pure functions from a ``JobSpec`` to text, no I/O: what has no equivalent there is said, in the output's own
comments, never dropped silently. The job's checkpoint contract goes with it: the same variables
(``LABQ_CHECKPOINT_DIR``, ``LABQ_RESUMED``, ...) filled from what that cluster knows.
"""

from __future__ import annotations

from labq.export.k8s import K8sOptions, to_k8s
from labq.export.slurm import SlurmOptions, to_sbatch

__all__ = ["K8sOptions", "SlurmOptions", "to_k8s", "to_sbatch"]
