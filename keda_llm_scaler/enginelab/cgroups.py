"""A CPU quota per engine: cgroup v1 (``cpu.cfs_quota_us``) or v2 (``cpu.max``), made and removed here.

N engines on one machine share its cores unless each is held to its own quota; with one, N engines have
N times the capacity of one, as N GPU replicas do, so scaling out relieves a queue as it does in a
cluster. Where no cgroup can be written, :class:`CgroupUnavailable` says why: an unthrottled run would
make every engine share the same cores and its figures would mean nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CPU_PERIOD_US", "CgroupUnavailable", "CpuQuota", "cpu_controller", "remove_groups"]

CPU_PERIOD_US = 100_000  # the kernel's default CFS period
_ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    """No writable cgroup with the cpu controller: engines cannot be held to a quota here."""


@dataclass(frozen=True)
class _Layout:
    version: int  # 1 or 2
    parent: Path  # where the engines' groups are made


def cpu_controller() -> _Layout:
    """Where a CPU quota can be set: the v1 ``cpu`` hierarchy, else the v2 root with ``cpu`` delegated."""
    v1 = _ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        layout = _Layout(1, v1)
    elif "cpu" in _read(_ROOT / "cgroup.controllers").split():
        if "cpu" not in _read(_ROOT / "cgroup.subtree_control").split():
            try:
                (_ROOT / "cgroup.subtree_control").write_text("+cpu")
            except OSError as exc:
                raise CgroupUnavailable(f"cgroup v2: cannot enable the cpu controller under {_ROOT}: {exc}") from exc
        layout = _Layout(2, _ROOT)
    else:
        raise CgroupUnavailable(
            f"no cpu cgroup controller under {_ROOT} (neither v1 cpu.cfs_quota_us nor v2 cgroup.controllers)"
        )
    if not os.access(layout.parent, os.W_OK):
        raise CgroupUnavailable(f"{layout.parent} is not writable (run as root, or delegate a cgroup to this user)")
    return layout


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class CpuQuota:
    """One engine's cgroup: made with no limit, so the engine starts at full speed, then :meth:`limit`
    holds it to ``cpus`` cores; :meth:`remove` stops every process left in it, by pid, and deletes it."""

    def __init__(self, name: str) -> None:
        self.layout = cpu_controller()
        self.path = self.layout.parent / name
        try:
            self.path.mkdir()
        except FileExistsError:
            self._kill_members()
            self._rmdir()
            self.path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot make the cgroup {self.path}: {exc}") from exc

    @classmethod
    def existing(cls, path: Path) -> CpuQuota:
        """A group made earlier (by another process), to stop its members and remove it."""
        group = cls.__new__(cls)
        group.layout, group.path = cpu_controller(), path
        return group

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def limit(self, cpus: float | None) -> None:
        """Hold the group to ``cpus`` cores (None: no limit)."""
        if self.layout.version == 1:
            quota = -1 if cpus is None else max(1000, round(cpus * CPU_PERIOD_US))
            (self.path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            value = "max" if cpus is None else str(max(1000, round(cpus * CPU_PERIOD_US)))
            (self.path / "cpu.max").write_text(f"{value} {CPU_PERIOD_US}")

    def limit_cpus(self) -> float | None:
        """The quota in force, read back from the kernel (None: unlimited)."""
        if self.layout.version == 1:
            quota = int(_read(self.path / "cpu.cfs_quota_us") or -1)
            period = int(_read(self.path / "cpu.cfs_period_us") or CPU_PERIOD_US)
            return None if quota < 0 else quota / period
        limit, period_v2 = [*_read(self.path / "cpu.max").split(), "max", str(CPU_PERIOD_US)][:2]
        return None if limit == "max" else int(limit) / int(period_v2)

    def throttled_seconds(self) -> float:
        """How long the kernel held the group back for its quota (cpu.stat), in seconds."""
        stats = dict(line.split() for line in _read(self.path / "cpu.stat").splitlines() if line.count(" ") == 1)
        if self.layout.version == 1:
            return int(stats.get("throttled_time", 0)) / 1e9
        return int(stats.get("throttled_usec", 0)) / 1e6

    def members(self) -> list[int]:
        return [int(p) for p in _read(self.procs_file).split()]

    def _kill_members(self, grace_s: float = 10.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            pids = self.members()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while self.members() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.members():
                return

    def _rmdir(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # busy while the last members are reaped
                time.sleep(0.1)
        self.path.rmdir()

    def remove(self, grace_s: float = 10.0) -> None:
        self._kill_members(grace_s)
        self._rmdir()


def remove_groups(prefix: str, grace_s: float = 5.0) -> list[Path]:
    """Stop every process left in the groups whose name starts with ``prefix`` (by pid) and delete the
    groups: what an owner killed before its own cleanup (a stand-in past its stop grace) left behind."""
    try:
        parent = cpu_controller().parent
    except CgroupUnavailable:
        return []
    removed = []
    for path in sorted(parent.glob(f"{prefix}*")):
        if path.is_dir():
            CpuQuota.existing(path).remove(grace_s)
            removed.append(path)
    return removed
