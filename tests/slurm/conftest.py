"""A real one-node Slurm for the tests of this folder (``tests/slurm_cluster.py``): started once per module, stopped
after. Without slurm-wlm and munge a test skips, and under CI (where ./install.sh installed them) it fails."""

from __future__ import annotations

import os

import pytest

from tests.slurm_cluster import SlurmCluster


def unavailable(why: str) -> None:
    """Fail under CI (the real part must be there), skip elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs Slurm: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as err:
        cluster.stop()
        unavailable(str(err))
    yield cluster
    cluster.stop()
