"""The engines' CPU quota (scripts/engine run): a cgroup made, a process held to its quota, and every
process in it stopped by pid and the cgroup removed. Real cgroups: needs root (CI runs as root)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from keda_llm_scaler.enginelab.cgroups import CgroupUnavailable, CpuQuota, remove_groups

try:
    CpuQuota(f"kls-probe-{os.getpid()}").remove()
    WRITABLE = ""
except (CgroupUnavailable, OSError) as exc:
    WRITABLE = str(exc)

pytestmark = pytest.mark.skipif(bool(WRITABLE), reason=f"no writable cpu cgroup here: {WRITABLE}")

BUSY = "import time\nwhile True: pass"


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_share(group: CpuQuota | None, seconds: float = 1.5) -> float:
    """CPU seconds per wall second of a busy loop, in ``group`` (joined before exec, as engines are)."""
    argv = ["python3", "-c", BUSY]
    if group is not None:
        argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group.procs_file), *argv]
    proc = subprocess.Popen(argv)
    try:
        time.sleep(0.3)
        c0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (_cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
    finally:
        proc.kill()
        proc.wait()


def test_a_quota_holds_a_busy_process_to_its_share_of_a_core() -> None:
    group = CpuQuota(f"kls-test-{os.getpid()}")
    try:
        group.limit(0.25)
        assert group.limit_cpus() == pytest.approx(0.25)
        free = _busy_share(None)  # the same loop outside any quota, in this run: the reference
        held = _busy_share(group)
        assert held < 0.5 * free and held < 0.4, (held, free)
        assert group.throttled_seconds() > 0
        group.limit(None)
        assert group.limit_cpus() is None
    finally:
        group.remove()
    assert not group.path.exists()


def test_remove_stops_every_process_left_in_the_group_by_pid() -> None:
    group = CpuQuota(f"kls-test-rm-{os.getpid()}")
    # a parent that forks a child and ignores SIGTERM: both must go, the child found by the cgroup
    script = "trap '' TERM; sleep 300 & sleep 300; wait"
    proc = subprocess.Popen(["sh", "-c", f'echo $$ > "$0" && exec sh -c "{script}"', str(group.procs_file)])
    deadline = time.monotonic() + 10
    while len(group.members()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    members = group.members()
    assert len(members) >= 3, members
    group.remove(grace_s=0.5)
    proc.wait(timeout=10)
    assert not group.path.exists()
    for pid in members:
        assert _state(pid) in ("", "Z"), pid  # gone, or a zombie left for its parent to reap


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_groups_left_by_a_killed_owner_are_found_by_prefix_and_removed() -> None:
    # a stand-in killed past its stop grace leaves its engines' groups: the control plane removes them by
    # the prefix its pid gives, and no other group
    prefix = f"kls-test-left-{os.getpid()}-"
    left = [CpuQuota(f"{prefix}{i}") for i in range(2)]
    other = CpuQuota(f"kls-test-keep-{os.getpid()}")
    proc = subprocess.Popen(["sh", "-c", 'echo $$ > "$0" && exec sleep 300', str(left[0].procs_file)])
    try:
        deadline = time.monotonic() + 10
        while not left[0].members() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left[0].members() == [proc.pid]
        assert sorted(remove_groups(prefix, grace_s=0.5)) == sorted(g.path for g in left)
        proc.wait(timeout=10)
        assert not any(g.path.exists() for g in left) and other.path.exists()
        assert remove_groups(prefix) == []
    finally:
        proc.kill()
        proc.wait()
        other.remove()
