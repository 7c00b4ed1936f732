"""The container policy with real paths: hostile mounts, images, GPU variables, root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labq.isolation import IsolationError, check_env, check_image, check_mounts, container_settings
from labq.models.job import JobSpec, Mount

SHM_64 = JobSpec("alice", ("x",), shm_size_mib=64)  #: a job whose container asks for a small /dev/shm


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "set").mkdir(parents=True)
    return root


@pytest.mark.parametrize("source", ["/", "/etc", "/etc/passwd", "/dev", "/dev/null", "/proc/self", "/proc", "/sys",
                                    "/var/run/docker.sock", "/run/docker.sock", "/run", "/var/run"])
def test_system_paths_are_refused_whatever_the_roots(source: str) -> None:
    with pytest.raises(IsolationError, match=f"mount {source}:/x"):
        check_mounts([Mount(source, "/x")], ["/"])


def test_dotdot_cannot_climb_out_of_an_allowed_root(data: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    with pytest.raises(IsolationError, match="outside the allowed roots"):
        check_mounts([Mount(f"{data}/set/../../secret", "/x")], [str(data)])


def test_a_symlink_inside_an_allowed_root_cannot_point_at_etc(data: Path) -> None:
    (data / "innocent").symlink_to("/etc")
    with pytest.raises(IsolationError, match="resolves to /etc, a system path"):
        check_mounts([Mount(str(data / "innocent"), "/x")], [str(data)])


def test_a_sibling_with_a_common_prefix_is_not_under_the_root(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data-other").mkdir()
    with pytest.raises(IsolationError, match="outside the allowed roots"):
        check_mounts([Mount(str(tmp_path / "data-other"), "/x")], [str(tmp_path / "data")])


def test_a_missing_source_is_refused_and_not_created(data: Path) -> None:
    missing = data / "nope"
    with pytest.raises(IsolationError, match=f"mount source {missing} does not exist on this machine"):
        check_mounts([Mount(str(missing), "/x")], [str(data)])
    assert not missing.exists()


@pytest.mark.parametrize("target", ["relative", "/", "//", "/a/.."])
def test_targets_must_be_absolute_and_not_the_root(data: Path, target: str) -> None:
    with pytest.raises(IsolationError, match="target"):
        check_mounts([Mount(str(data / "set"), target)], [str(data)])


def test_no_roots_allow_nothing(data: Path) -> None:
    with pytest.raises(IsolationError, match="none configured"):
        check_mounts([Mount(str(data / "set"), "/x")], [])


def test_a_good_mount_comes_back_resolved(tmp_path: Path, data: Path) -> None:
    (tmp_path / "link").symlink_to(data)  # the allowed root itself through a symlink
    got = check_mounts([Mount(f"{data}/set/./", "/data/", True), Mount(str(data), "/all")], [str(tmp_path / "link")])
    assert got == [Mount(os.path.realpath(data / "set"), "/data", True), Mount(os.path.realpath(data), "/all", False)]


@pytest.mark.parametrize(("image", "allowed", "ok"), [
    ("anything:1", [], True),
    ("pytorch/pytorch:2.3", ["pytorch/*"], True),
    ("registry.lab/train:v2", ["pytorch/*", "registry.lab/*:*"], True),
    ("registry.lab/train", ["registry.lab/*:*"], False),
    ("evil/pytorch:1", ["pytorch/*"], False),
    ("", [], False),
])
def test_image_allow_list(image: str, allowed: list[str], ok: bool) -> None:
    if ok:
        check_image(image, allowed)
    else:
        with pytest.raises(IsolationError, match="image"):
            check_image(image, allowed)


@pytest.mark.parametrize("key", ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"])
def test_the_job_may_not_pick_its_gpus(key: str) -> None:
    with pytest.raises(IsolationError, match=f"may not set {key}: labq sets them"):
        check_env({"SEED": "1", key: "all"})
    check_env({"SEED": "1"})


def test_root_is_refused_unless_allowed() -> None:
    with pytest.raises(IsolationError, match="root"):
        container_settings(SHM_64, 0, 0, (), True, [])
    assert container_settings(SHM_64, 0, 0, (), True, [], allow_root=True)["user"] == "0:0"


def test_settings_encode_the_isolation(data: Path) -> None:
    mounts = check_mounts([Mount(str(data / "set"), "/data", True)], [str(data)])
    real = container_settings(JobSpec("alice", ("x",), shm_size_mib=2048), 1000, 1000, ("GPU-a", "GPU-b"), False,
                              mounts, groups=(1000, 27))
    assert real["user"] == "1000:1000" and real["group_add"] == ["1000", "27"]
    assert real["cap_drop"] == ["ALL"] and real["security_opt"] == ["no-new-privileges"]
    assert real["privileged"] is False and real["init"] is True and real["shm_size"] == "2048m"
    assert "network_mode" not in real and "pid_mode" not in real and real["ipc_mode"] == "private"
    assert real["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    [request] = real["device_requests"]
    assert request["DeviceIDs"] == ["GPU-a", "GPU-b"] and request["Capabilities"] == [["gpu"]]
    [mount] = real["mounts"]
    assert (mount["Source"], mount["Target"], mount["Type"], mount["ReadOnly"]) == (str(data / "set"), "/data",
                                                                                   "bind", True)
    sim = container_settings(SHM_64, 1000, 1000, ("0", "2"), True, [])
    assert "device_requests" not in sim and sim["environment"] == {"NVIDIA_VISIBLE_DEVICES": "0,2"}
    assert container_settings(SHM_64, 1000, 1000, (), False, [])["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_the_policy_module_does_not_import_docker() -> None:
    import subprocess
    import sys

    code = "import sys, labq.isolation; assert 'docker' not in sys.modules, 'docker imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_kernels_limits_and_the_tmpdir_become_dockers_settings(data: Path) -> None:
    limited = container_settings(SHM_64, 1000, 1000, (), True, [], cpu_set=(3, 0, 1), cpu_limit=1.5,
                                 memory_limit_mib=640, tmpdir=str(data / "set"))
    assert (limited["cpuset_cpus"], limited["nano_cpus"]) == ("0,1,3", 1_500_000_000)
    assert limited["mem_limit"] == limited["memswap_limit"] == 640 << 20  # equal: no swap beyond it
    [tmp] = limited["mounts"]
    assert (tmp["Source"], tmp["Target"], tmp["Type"], tmp["ReadOnly"]) == (str(data / "set"), "/tmp", "bind", False)
    plain = container_settings(SHM_64, 1000, 1000, (), True, [])
    assert not {"cpuset_cpus", "nano_cpus", "mem_limit", "memswap_limit"} & set(plain) and plain["mounts"] == []


def test_with_a_tmpdir_the_job_may_not_mount_its_own_tmp(data: Path) -> None:
    mounts = check_mounts([Mount(str(data / "set"), "/tmp/")], [str(data)])
    with pytest.raises(IsolationError, match="labq mounts the job's own temporary folder at /tmp"):
        container_settings(SHM_64, 1000, 1000, (), True, mounts, tmpdir=str(data))
    assert len(container_settings(SHM_64, 1000, 1000, (), True, mounts)["mounts"]) == 1  # no tmpdir: it may
    with pytest.raises(IsolationError, match="absolute path"):
        container_settings(SHM_64, 1000, 1000, (), True, [], tmpdir="relative/tmp")
