"""A job sees its own checkpoint folder and no other job's: a real leader and agent on a real dockerd.

The admin allows mounts from /shared and keeps checkpoints on /shared/checkpoints, as a lab with one
shared file system does: the leader's policy then lets a spec name another job's checkpoint folder,
and the agent must refuse it on the node. Each job's folder belongs to its user, mode 0700.
"""

from __future__ import annotations

import stat

import pytest

from labq.isolation import IsolationError, check_mounts, refuse_checkpoint_folders
from labq.models.job import Mount
from tests.docker.conftest import IMAGE, container_lab
from tests.e2e.conftest import TEST_CONFIG

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def shared_lab(docker_client, tmp_path):
    shared = tmp_path / "shared"
    (shared / "checkpoints").mkdir(parents=True)
    (shared / "datasets").mkdir()
    shared.chmod(0o755)
    (shared / "checkpoints").chmod(0o755)
    config = TEST_CONFIG.replace("[jobs]\n", f'[jobs]\nallowed_mount_roots = ["{shared}"]\n'
                                             f'checkpoint_root = "{shared / "checkpoints"}"\n')
    with container_lab(docker_client, tmp_path / "lab", config) as lab:
        lab.shared = shared
        yield lab


def test_a_job_may_not_mount_another_jobs_checkpoint_folder(shared_lab):
    lab = shared_lab
    owner = lab.submit("sh", "-c", 'echo secret-weights > "$LABQ_CHECKPOINT_DIR/model.pt"', image=IMAGE,
                       token=lab.token)
    assert lab.wait_state(owner, "succeeded", "failed", timeout=90)["state"] == "succeeded", \
        lab.labq("logs", str(owner)).stdout
    folder = lab.shared / "checkpoints" / str(owner)
    assert (folder / "model.pt").read_text() == "secret-weights\n"
    mode = folder.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == 65534, "the folder is not nobody's alone"

    thief = lab.submit("cat", "/loot/model.pt", image=IMAGE, mount=f"{folder}:/loot:ro", token=lab.token)
    done = lab.wait_state(thief, "failed", "succeeded", timeout=90)
    log = lab.labq("logs", str(thief)).stdout
    assert done["state"] == "failed" and done["exit_code"] == 126, log
    assert "a job may see only its own" in log and "secret-weights" not in log

    whole = lab.submit("ls", "/all", image=IMAGE, mount=f"{lab.shared}:/all:ro", token=lab.token)
    assert lab.wait_state(whole, "failed", "succeeded", timeout=90)["exit_code"] == 126  # it holds them all

    data = lab.submit("ls", "/data", image=IMAGE, mount=f"{lab.shared / 'datasets'}:/data:ro", token=lab.token)
    assert lab.wait_state(data, "succeeded", "failed", timeout=90)["state"] == "succeeded"  # the rest still mounts


def test_checkpoint_areas_refuse_mounts_in_them_and_above_them(tmp_path):
    area = tmp_path / "checkpoints"
    (area / "4").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    for source in (area / "4", area, tmp_path):
        with pytest.raises(IsolationError, match="a job may see only its own"):
            refuse_checkpoint_folders(check_mounts([Mount(str(source), "/x")], [str(tmp_path)]), [str(area)])
    ok = check_mounts([Mount(str(tmp_path / "data"), "/x")], [str(tmp_path)])
    assert refuse_checkpoint_folders(ok, [str(area)]) == ok
