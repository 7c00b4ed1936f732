"""A real one-node Slurm for the tests of this folder (``tests/slurm_cluster.py``): started once per module, stopped
after. Without slurm-wlm and munge a test skips, and under CI (where ./install.sh installed them) it fails."""

from __future__ import annotations

import pytest

from tests.conftest import unavailable
from tests.slurm_cluster import SlurmCluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as err:
        cluster.stop()
        unavailable("Slurm", str(err))
    yield cluster
    cluster.stop()
