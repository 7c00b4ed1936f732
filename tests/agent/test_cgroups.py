"""A job's own cgroup on this machine's real cgroups, and cgroup v2's file handling against a folder laid out
like cgroupfs.

The real tests make their cgroups under a parent of their own (``labq-test-<hex>``) and remove it after. They
need root (or a delegated hierarchy): under CI a machine that cannot make cgroups fails them, never skips.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from labq.agent import cgroups
from labq.agent.cgroups import CgroupError, Limits, V1Host, V2Cgroup, V2Host, cpu_list, open_host, probe
from tests.conftest import unavailable

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20
ALLOCATE = "import sys; x = b'1' * (int(sys.argv[1]) << 20); print('allocated', flush=True)"


@pytest.fixture
def real_host():
    """This machine's cgroups (v1 here), under a parent that is the test's own; removed afterwards."""
    parent = f"labq-test-{uuid.uuid4().hex[:8]}"
    confinement = probe(parent=parent)
    if confinement.host is None:
        unavailable("cgroups", confinement.sentence)
    host = confinement.host
    yield host
    folders = [host.base] if isinstance(host, V2Host) else [m / parent for m in set(host.mounts.values())]
    for folder in folders:
        for child in folder.iterdir() if folder.is_dir() else ():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    os.rmdir(child)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _run_inside(cgroup: cgroups.Cgroup, *argv: str) -> subprocess.Popen[str]:
    with cgroup.inside():
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_this_machine_is_found_and_said_in_one_sentence(real_host):
    sentence = probe(parent=real_host.parent).sentence
    assert sentence.startswith("Jobs' CPUs and memory are enforced by the kernel: ") and sentence.endswith(".")
    assert f"cgroup v{real_host.version}" in sentence and "\n" not in sentence
    v2 = (cgroups.ROOT / "cgroup.controllers").exists()
    assert isinstance(real_host, V2Host if v2 else V1Host)


def test_the_limits_are_in_the_kernels_own_files(real_host):
    cgroup = real_host.create("1.1-limits", Limits((0,), 0.5, 64))
    try:
        if isinstance(real_host, V1Host):
            folders = cgroup.by_controller
            assert (folders["cpuset"] / "cpuset.cpus").read_text().strip() == "0"
            mems = folders["cpuset"] / "cpuset.mems"
            assert mems.read_text() == (folders["cpuset"].parent / "cpuset.mems").read_text()
            assert (folders["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert (folders["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"
            assert int((folders["memory"] / "memory.limit_in_bytes").read_text()) == 64 * MIB
            memsw = folders["memory"] / "memory.memsw.limit_in_bytes"
            assert not memsw.exists() or int(memsw.read_text()) == 64 * MIB
        else:
            assert (cgroup.folder / "cpu.max").read_text().split() == ["50000", "100000"]
            assert int((cgroup.folder / "memory.max").read_text()) == 64 * MIB
    finally:
        assert cgroup.remove()
    assert all(not folder.exists() for folder in cgroup.folders)


def test_a_child_forked_inside_is_confined_from_the_start_and_the_parent_steps_out(real_host):
    if len(os.sched_getaffinity(0)) < 2:
        unavailable("two CPUs", "a CPU set of one CPU cannot be told apart from no CPU set on one CPU")
    before = Path("/proc/self/cgroup").read_text()
    cgroup = real_host.create("1.1-inside", Limits(cpu_set=(0,)))
    try:
        child = _run_inside(cgroup, "sh", "-c", "cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status")
        out, _ = child.communicate(timeout=10)
        assert f"/{real_host.parent}/1.1-inside" in out
        assert "Cpus_allowed_list:\t0\n" in out
        assert Path("/proc/self/cgroup").read_text() == before  # the parent is back where it was
        assert os.sched_getaffinity(0) != {0}
    finally:
        assert cgroup.remove()


def test_past_its_memory_limit_the_kernel_kills_and_the_cgroup_says_so(real_host):
    small = real_host.create("1.1-small", Limits(memory_limit_mib=64))
    roomy = real_host.create("1.2-roomy", Limits(memory_limit_mib=512))
    try:
        killed = _run_inside(small, sys.executable, "-c", ALLOCATE, "256")
        fits = _run_inside(roomy, sys.executable, "-c", ALLOCATE, "100")
        assert killed.wait(timeout=30) == -signal.SIGKILL and killed.stdout.read() == ""
        assert fits.wait(timeout=30) == 0 and fits.stdout.read() == "allocated\n"
        assert small.oom_killed() and not roomy.oom_killed()
        assert 32 <= small.memory_peak_mib() <= 64
        assert roomy.memory_peak_mib() >= 100
    finally:
        assert small.remove() and roomy.remove()


def test_a_cpu_quota_holds_busy_processes_to_their_share_of_a_core(real_host):
    # weighted far above the machine's other work (each process at the top of a hierarchy weighs as much as all
    # of the parent's cgroups): only the quota then keeps the two busy processes from two cores
    weight = (real_host.mounts["cpu"] / real_host.parent / "cpu.shares", "262144") if isinstance(real_host, V1Host) \
        else (real_host.base / "cpu.weight", "10000")
    weight[0].write_text(weight[1])
    cgroup = real_host.create("1.1-busy", Limits(cpu_limit=0.5))
    busy = _run_inside(cgroup, "sh", "-c", "for i in 1 2; do (while :; do :; done) & done; wait")
    try:
        seen: list[float] = []  # per window: other work on the machine can take the CPU, never add to the quota
        time.sleep(0.3)
        while len(seen) < 5 and not (seen and seen[-1] >= 0.3):
            used, began = cgroup.cpu_usage_s(), time.monotonic()
            time.sleep(1.5)
            seen.append((cgroup.cpu_usage_s() - used) / (time.monotonic() - began))
        assert all(cores <= 0.7 for cores in seen) and max(seen) >= 0.3, f"cores used under a quota of 0.5: {seen}"
    finally:
        for pid in cgroup.pids():
            os.kill(pid, signal.SIGKILL)
        busy.wait(timeout=10)
    assert cgroup.remove()


def test_a_cgroup_is_removed_only_once_its_processes_are_gone(real_host):
    cgroup = real_host.create("1.1-remove", Limits())
    sleeper = _run_inside(cgroup, "sleep", "300")
    assert cgroup.pids() == {sleeper.pid}
    assert real_host.find("1.1-remove") is not None
    assert cgroup.remove(timeout_s=0.1) is False
    sleeper.kill()
    sleeper.wait(timeout=10)
    assert cgroup.remove() is True
    assert real_host.find("1.1-remove") is None


def test_a_cpu_this_machine_lacks_is_a_sentence_and_leaves_nothing(real_host):
    with pytest.raises(CgroupError, match=r"cannot keep the job on CPUs 4095: .*/cpuset/.* has CPUs 0"):
        real_host.create("1.1-nocpu", Limits(cpu_set=(4095,)))
    assert real_host.find("1.1-nocpu") is None


NOT_ROOT = textwrap.dedent("""
    import os, sys
    from labq.agent.cgroups import probe  # imported as root: the checkout need not be readable by nobody
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    print(probe(parent=sys.argv[1]).sentence)
""")


def test_an_agent_that_is_not_root_hears_why_in_one_sentence(real_host):
    if os.geteuid() != 0:
        unavailable("root", "the test drops from root to nobody")
    for parent in (real_host.parent, f"labq-test-{uuid.uuid4().hex[:8]}"):  # one root made, one not there yet
        said = subprocess.run([sys.executable, "-c", NOT_ROOT, parent], capture_output=True, text=True, timeout=30,
                              check=True).stdout
        assert said.startswith("Jobs' CPU and memory limits are not enforced here, so jobs run unconfined")
        assert "the agent is not root and /sys/fs/cgroup/" in said and f"/{parent}" in said
        assert said.count("\n") == 1 and said.endswith(".\n")


def test_no_cgroup_file_system_is_a_sentence_too(tmp_path):
    confinement = probe(root=tmp_path)
    assert confinement.host is None
    assert confinement.sentence.endswith(f"no cgroup file system is mounted at {tmp_path}.")


def test_real_cgroup_v2_places_and_removes_processes():
    """cgroup v2's own mechanics (mkdir, cgroup.procs, rmdir) on a real cgroup2 mount: the whole hierarchy on a
    v2 machine, the controller-less ``unified`` one of a v1 machine like this one."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[2] == "cgroup2"]
    if not mounts or os.geteuid() != 0:
        unavailable("a cgroup2 mount and root", f"cgroup2 mounts: {mounts}, uid {os.geteuid()}")
    root = Path(mounts[0])
    host = V2Host(root, f"labq-test-{uuid.uuid4().hex[:8]}")
    host.base.mkdir()
    cgroup = host.create("1.1-v2", Limits())
    child = _run_inside(cgroup, "sh", "-c", "cat /proc/self/cgroup; echo .; exec sleep 300")
    try:
        said = "".join(iter(child.stdout.readline, ".\n"))
        assert f"0::/{host.base.relative_to(root)}/1.1-v2\n" in said
        assert cgroup.pids() == {child.pid}
        assert cgroup.remove(timeout_s=0.1) is False
    finally:
        child.kill()
        child.wait(timeout=10)
    assert cgroup.remove() and host.find("1.1-v2") is None
    os.rmdir(host.base)


# --- cgroup v2's files ------------------------------------------------------------------------


@pytest.fixture
def fake_v2(tmp_path: Path) -> Path:
    """A folder laid out like a cgroup v2 root with a ``labq`` parent, as the kernel shows them.

    This machine runs cgroup v1: its cpu, cpuset and memory controllers are bound to v1 hierarchies, and a
    controller serves one hierarchy at a time, so no cgroup v2 with those controllers can be mounted here to
    test against. So V2Host's file handling meets this folder instead: what it writes is read back, and what
    the kernel would write (counters, events) the tests write themselves. The mechanics without controllers
    (cgroup.procs, rmdir) are tested on the real cgroup2 mount above.
    """
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "labq").mkdir()
    for name in ("cgroup.procs", "cgroup.subtree_control", "memory.swap.max"):
        (tmp_path / "labq" / name).write_text("")
    return tmp_path


def test_v2_is_chosen_by_cgroup_controllers_and_gives_its_controllers_to_the_jobs(fake_v2):
    host = open_host(fake_v2, "labq")
    assert isinstance(host, V2Host) and host.version == 2
    assert (fake_v2 / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory"
    assert (fake_v2 / "labq" / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory"
    said = probe(fake_v2, "labq").sentence
    assert said == f"Jobs' CPUs and memory are enforced by the kernel: cgroup v2 under {fake_v2}/labq."


def test_v2_without_the_controllers_says_which_are_missing(fake_v2):
    (fake_v2 / "cgroup.controllers").write_text("io memory pids\n")
    confinement = probe(fake_v2, "labq")
    assert confinement.host is None
    assert confinement.sentence.endswith(f"cgroup v2 at {fake_v2} does not offer the cpu, cpuset controllers.")


def test_v2_limits_are_written_as_the_kernel_reads_them(fake_v2):
    host = open_host(fake_v2, "labq")
    cgroup = host.create("7.2-abc", Limits((0, 2, 3), 1.5, 64))
    folder = fake_v2 / "labq" / "7.2-abc"
    assert cgroup.folder == folder
    assert (folder / "cpuset.cpus").read_text() == "0,2-3"
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (folder / "memory.max").read_text() == str(64 * MIB)
    assert (folder / "memory.swap.max").read_text() == "0"
    plain = host.create("7.3-abc", Limits())
    assert sorted(p.name for p in plain.folder.iterdir()) == []  # no limit asked: the kernel's defaults
    (fake_v2 / "labq" / "memory.swap.max").unlink()  # a kernel without swap accounting
    assert not (host.create("7.4-abc", Limits(memory_limit_mib=8)).folder / "memory.swap.max").exists()


def test_v2_usage_is_read_from_its_counters(fake_v2):
    cgroup = open_host(fake_v2, "labq").create("7.2-abc", Limits(memory_limit_mib=64))
    folder = cgroup.folder
    (folder / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    assert cgroup.cpu_usage_s() == 2.5 and not cgroup.oom_killed()
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert cgroup.oom_killed()
    for current in (10 * MIB, 30 * MIB + 1, 5 * MIB):  # a kernel without memory.peak: the shim samples
        (folder / "memory.current").write_text(f"{current}\n")
        cgroup.sample()
    assert cgroup.memory_peak_mib() == 31
    (folder / "memory.peak").write_text(f"{100 * MIB}\n")
    assert cgroup.memory_peak_mib() == 100


def test_v2_a_process_is_placed_by_cgroup_procs_and_a_busy_cgroup_stays(fake_v2):
    cgroup = open_host(fake_v2, "labq").create("7.2-abc", Limits())
    cgroup.add(4242)
    assert cgroup.pids() == {4242}
    assert cgroup.remove(timeout_s=0) is False and cgroup.folder.exists()
    assert isinstance(open_host(fake_v2, "labq").find("7.2-abc"), V2Cgroup)


@pytest.mark.parametrize("cpus, text", [((0,), "0"), ((3, 1, 2), "1-3"), ((0, 2, 3, 5, 7, 8), "0,2-3,5,7-8"),
                                        ((4, 4), "4")])
def test_cpu_sets_are_written_in_the_kernels_list_format(cpus, text):
    assert cpu_list(cpus) == text


def test_a_parent_is_required(fake_v2):
    with pytest.raises(CgroupError, match="a parent of their own"):
        open_host(fake_v2, "/")
