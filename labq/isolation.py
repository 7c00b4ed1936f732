"""The container policy: which mounts, images and settings a job's container may have.

Pure checks, run twice: by the leader before it stores a job (so a bad job is refused at
submit, with a message saying why) and by the agent again just before it launches (the
leader may be older, and paths resolve differently on each machine). Only the agent's
call means anything for safety: ``check_mounts`` resolves paths on the machine it runs on.

No docker import at module level: the leader imports this module and need not have docker.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from labq.models.job import JobSpec, Mount

#: never mountable, nor anything that resolves to them
FORBIDDEN_SOURCES = ("/", "/etc", "/dev", "/proc", "/sys", "/var/run/docker.sock", "/run/docker.sock")
#: nothing under these either
FORBIDDEN_TREES = ("/etc", "/dev", "/proc", "/sys")
#: no mount may contain these (mounting /run would hand out the docker socket)
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
#: set by labq from the placement, never by the job
GPU_ENV = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")


class IsolationError(ValueError):
    """A job asks for something its container may not have; the message names what and why."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_mounts(mounts: Iterable[Mount], allowed_roots: Iterable[str]) -> list[Mount]:
    """The mounts with their sources resolved (symlinks, ``..``), or IsolationError for the first bad one.

    A source must exist (it is never created) and lie under one of ``allowed_roots``;
    system paths and the docker socket are refused whatever the roots say.
    """
    roots = [os.path.realpath(root) for root in allowed_roots]
    forbidden = {os.path.realpath(p) for p in FORBIDDEN_SOURCES} | set(FORBIDDEN_SOURCES)
    trees = {os.path.realpath(p) for p in FORBIDDEN_TREES} | set(FORBIDDEN_TREES)
    sockets = {os.path.realpath(p) for p in DOCKER_SOCKETS} | set(DOCKER_SOCKETS)
    checked = []
    for mount in mounts:
        name = f"mount {mount.source}:{mount.target}"
        target = str(mount.target)
        if not posixpath.isabs(target):
            raise IsolationError(f"{name}: the target must be an absolute path inside the container")
        target = "/" + posixpath.normpath(target).lstrip("/")  # normpath keeps a leading //
        if target == "/":
            raise IsolationError(f"{name}: the target may not be / (the container's root)")
        if not mount.source or not os.path.isabs(mount.source):
            raise IsolationError(f"{name}: the source must be an absolute path on the node")
        source = os.path.realpath(mount.source)
        if source in forbidden or any(_under(source, tree) for tree in trees):
            raise IsolationError(f"{name}: the source resolves to {source}, a system path that is never mounted")
        if any(_under(socket, source) for socket in sockets):
            raise IsolationError(f"{name}: the source resolves to {source}, which holds the docker socket")
        if not any(_under(source, root) for root in roots if root != "/"):
            allowed = ", ".join(roots) or "none configured"
            raise IsolationError(f"{name}: the source resolves to {source}, outside the allowed roots ({allowed})")
        if not os.path.exists(source):
            raise IsolationError(f"{name}: mount source {mount.source} does not exist on this machine")
        checked.append(Mount(source, target, bool(mount.read_only)))
    return checked


def refuse_checkpoint_folders(mounts: list[Mount], areas: Iterable[str]) -> list[Mount]:
    """``mounts`` (resolved by ``check_mounts``), or IsolationError for one inside a checkpoint area.

    The folders there are other jobs' checkpoints: a job gets its own mounted by the agent,
    at ``$LABQ_CHECKPOINT_DIR``, and may mount nothing else from them, whatever the allowed roots say.
    """
    resolved = [os.path.realpath(area) for area in areas]
    for mount in mounts:
        for area in resolved:
            if _under(mount.source, area) or _under(area, mount.source):
                raise IsolationError(f"mount {mount.source}:{mount.target}: it is in or holds the checkpoint "
                                     f"folders ({area}); a job may see only its own, which labq mounts for it "
                                     "at $LABQ_CHECKPOINT_DIR")
    return mounts


def check_image(image: str, allowed_images: Sequence[str]) -> None:
    """Any image when ``allowed_images`` is empty; else it must match one of the fnmatch patterns."""
    if not image or not image.strip():
        raise IsolationError("a container job needs an image")
    if allowed_images and not any(fnmatch.fnmatchcase(image, pattern) for pattern in allowed_images):
        raise IsolationError(f"image {image} is not allowed here (allowed: {', '.join(allowed_images)})")


def check_env(env: Mapping[str, str]) -> None:
    """Refuse GPU-selecting variables: labq sets them from the job's placement."""
    taken = sorted(key for key in env if key in GPU_ENV)
    if taken:
        raise IsolationError(f"the job may not set {', '.join(taken)}: labq sets them to the GPUs it placed the job on")


def container_settings(spec: JobSpec, uid: int, gid: int, gpu_uuids: Sequence[str], simulated: bool,
                       mounts: Iterable[Mount], *, allow_root: bool = False, groups: Sequence[int] = (),
                       cpu_set: Sequence[int] = (), cpu_limit: float | None = None,
                       memory_limit_mib: int | None = None, tmpdir: str = "") -> dict[str, Any]:
    """Keyword arguments for docker's ``containers.create``/``run`` that encode the isolation, with the container
    settings ``spec`` asks for (its /dev/shm).

    ``mounts`` must have passed ``check_mounts``. ``gpu_uuids`` are the placed GPUs' UUIDs,
    or their indices on a simulated node (where no device is requested). The returned
    ``environment`` holds only labq's GPU variables: merge it last over the job's own.
    The kernel's limits: the CPUs it may run on, the cores of CPU time, the memory (MiB, and no swap
    beyond it); ``tmpdir``, the job's own folder on the node, is its /tmp.
    """
    from docker.types import DeviceRequest
    from docker.types import Mount as DockerMount

    if uid < 0 or gid < 0:
        raise IsolationError(f"bad uid:gid {uid}:{gid}")
    if uid == 0 and not allow_root:
        raise IsolationError("a container job may not run as root (uid 0): give the job a non-root user")
    if spec.shm_size_mib <= 0:
        raise IsolationError(f"shm size must be positive, not {spec.shm_size_mib} MiB")
    mounts = list(mounts)
    if tmpdir:
        if not os.path.isabs(tmpdir):
            raise IsolationError(f"the job's temporary folder must be an absolute path, not {tmpdir!r}")
        taken = next((m for m in mounts if posixpath.normpath(str(m.target)) == "/tmp"), None)
        if taken is not None:
            raise IsolationError(f"mount {taken.source}:{taken.target}: labq mounts the job's own temporary folder "
                                 "at /tmp")
        mounts.append(Mount(os.path.realpath(tmpdir), "/tmp"))
    gpus = [str(g) for g in gpu_uuids]
    settings: dict[str, Any] = {
        "user": f"{uid}:{gid}",
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "privileged": False,
        "ipc_mode": "private",  # network stays the default bridge; pid mode the container's own
        "init": True,
        "shm_size": f"{spec.shm_size_mib}m",
        "mounts": [DockerMount(m.target, m.source, type="bind", read_only=m.read_only) for m in mounts],
        # "void": as if unset, so an image that bakes in NVIDIA_VISIBLE_DEVICES=all sees no GPU
        "environment": {"NVIDIA_VISIBLE_DEVICES": ",".join(gpus) if gpus else "void"},
    }
    if cpu_set:
        settings["cpuset_cpus"] = ",".join(str(cpu) for cpu in sorted(set(cpu_set)))
    if cpu_limit is not None:
        settings["nano_cpus"] = round(cpu_limit * 1e9)
    if memory_limit_mib is not None:
        settings["mem_limit"] = settings["memswap_limit"] = memory_limit_mib << 20  # equal: no swap
    if groups:
        settings["group_add"] = [str(g) for g in groups if g != 0 or allow_root]
    if gpus and not simulated:
        settings["device_requests"] = [DeviceRequest(device_ids=gpus, capabilities=[["gpu"]])]
        settings["environment"]["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
    return settings
