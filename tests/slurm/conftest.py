"""A real one-node Slurm for the tests of this folder (``tests/slurm_cluster.py``): started once per module, stopped
after. Without slurm-wlm and munge a test skips, and under CI (where ./install.sh installed them) it fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import unavailable
from tests.slurm_cluster import SlurmCluster


def running(cluster: SlurmCluster, what: str = "Slurm") -> Iterator[SlurmCluster]:
    """For a fixture (``yield from``): ``cluster`` started, and stopped after. One that cannot start fails the test
    under CI and skips it elsewhere (``what`` says what was missing)."""
    try:
        cluster.start()
    except RuntimeError as err:
        cluster.stop()
        unavailable(what, str(err))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from running(SlurmCluster(tmp_path_factory.mktemp("slurm")))
