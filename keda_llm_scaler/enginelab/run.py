"""Real vLLM engines on loopback, each in its own cgroup with a CPU quota, stopped by pid and cgroup.

An engine is started unthrottled and held to its quota once ready: start-up on these machines is
compile-bound (torch inductor's warm-up, ~40 s of the ~100 s), and N engines starting at once on 2
cores under half a core each would take many minutes for a figure that measures nothing but the quota.
The serving capacity is what the quota is for.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from keda_llm_scaler.enginelab.build import MODEL_NAME, EngineEnv, ensure_model
from keda_llm_scaler.enginelab.cgroups import CpuQuota

__all__ = [
    "Engine",
    "EngineSpec",
    "free_port",
    "is_ready",
    "launch_engine",
    "native_dtype",
    "resolved_dtype",
    "start_engines",
    "stop_engines",
]

READY_TIMEOUT_S = 900.0  # several engines compiling at once on 2 cores


def _say(msg: str) -> None:
    print(f"[engine] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class EngineSpec:
    cpus: float | None = 0.5  # the quota once ready; None: unthrottled (then engines share the cores)
    max_num_seqs: int = 16
    layers: int = 4
    kv_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (whole GiB): 262,144 tokens of this model
    max_model_len: int = 2048
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    dtype: str = "auto"  # vLLM's --dtype; "auto": native_dtype()


# CPU flags that make bfloat16 a native type for vLLM's CPU kernels (AVX512-BF16, AMX)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def native_dtype(cpuinfo: str | None = None) -> str:
    """bfloat16 on CPUs that compute it natively, float32 elsewhere. On an AVX2-only CPU (an AMD EPYC
    here) the same 7-layer engine under bfloat16 decoded one sequence at 67 ms a token where bfloat16
    machines decoded an 8-layer one at 11: every bfloat16 operation converts through float32 there."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "bfloat16"
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return "bfloat16" if flags & BF16_FLAGS else "float32"


def resolved_dtype(spec: EngineSpec) -> str:
    return native_dtype() if spec.dtype == "auto" else spec.dtype


@dataclass
class Engine:
    index: int
    url: str
    proc: subprocess.Popen[bytes]
    cgroup: CpuQuota
    log: Path
    started: float
    ready_s: float | None = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_environment(spec: EngineSpec) -> dict[str, str]:
    threads = "1" if spec.cpus is None else str(max(1, math.ceil(spec.cpus)))
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_gib),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the cgroup shares the cores; pinning would fight it
        "OMP_NUM_THREADS": threads,
        "HF_HUB_OFFLINE": "1",  # the model is local: nothing is fetched
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONWARNINGS": "ignore",
    }


def _argv(env: EngineEnv, spec: EngineSpec, port: int) -> list[str]:
    model = ensure_model(env, spec.layers)
    return [
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` entry point fails: the distribution is vllm-cpu
        "--model",
        str(model),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        spec.host,
        "--port",
        str(port),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--max-model-len",
        str(spec.max_model_len),
        "--dtype",
        resolved_dtype(spec),
        *spec.extra_args,
    ]


def launch_engine(
    env: EngineEnv, spec: EngineSpec, index: int, group_name: str, log: Path, port: int | None = None
) -> Engine:
    """Start one engine at ``spec.host`` (port: free unless given) in a new cgroup, unthrottled until
    ``hold_to_quota``; it returns at once (``is_ready`` says when it serves)."""
    port = free_port(spec.host) if port is None else port
    group = CpuQuota(group_name)
    group.limit(None)
    # the shell joins the cgroup, then becomes the engine: every process it forks is in it too
    argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group.procs_file), *_argv(env, spec, port)]
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=engine_environment(spec), start_new_session=True
            )
    except BaseException:
        group.remove(grace_s=1.0)
        raise
    engine = Engine(index, f"http://{spec.host}:{port}", proc, group, log, time.monotonic())
    _say(f"engine {index}: pid {proc.pid}, {engine.url}, cgroup {group.path}, log {log}")
    return engine


def start_engines(env: EngineEnv, n: int, spec: EngineSpec, log_dir: Path, tag: str) -> list[Engine]:
    """Start ``n`` engines and wait until each answers /health and lists its model; then apply the quota."""
    engines: list[Engine] = []
    try:
        for i in range(n):
            engines.append(launch_engine(env, spec, i, f"kls-engine-{tag}-{i}", log_dir / f"engine-{i}.log"))
        _wait_ready(engines)
        for e in engines:
            e.cgroup.limit(spec.cpus)
        return engines
    except BaseException:
        stop_engines(engines)
        raise


def _wait_ready(engines: list[Engine]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    next_report = time.monotonic() + 15.0
    while any(e.ready_s is None for e in engines):
        for e in engines:
            if e.ready_s is not None:
                continue
            if is_ready(e):
                _say(f"engine {e.index} ready in {e.ready_s:.0f} s")
        if time.monotonic() > deadline:
            raise RuntimeError(f"engines not ready within {READY_TIMEOUT_S:.0f} s")
        if time.monotonic() > next_report:
            waiting = [e.index for e in engines if e.ready_s is None]
            _say(f"waiting for engines {waiting} ({time.monotonic() - engines[0].started:.0f} s)")
            next_report += 15.0
        time.sleep(1.0)


def is_ready(e: Engine) -> bool:
    """True once the engine lists its model (and sets ``ready_s``); raises if it exited before that."""
    if e.ready_s is not None:
        return True
    if e.proc.poll() is not None:
        tail = e.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"engine {e.index} exited with {e.proc.returncode} before ready:\n{tail}")
    if _answers(e.url + "/v1/models"):
        e.ready_s = time.monotonic() - e.started
        return True
    return False


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(resp.status == 200 and MODEL_NAME in resp.read().decode(errors="replace"))
    except (OSError, urllib.error.URLError):
        return False


def stop_engines(engines: list[Engine], grace_s: float = 15.0) -> None:
    """SIGTERM each engine's process group (vLLM stops its engine core and workers), then every pid left
    in its cgroup, SIGKILL after the grace; reap, and remove the cgroups."""
    for e in engines:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(e.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for e in engines:
        with contextlib.suppress(subprocess.TimeoutExpired):
            e.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(e.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            e.proc.wait(timeout=5.0)
    for e in engines:
        try:
            e.cgroup.remove(grace_s=5.0)
        except OSError as exc:
            _say(f"engine {e.index}: could not remove {e.cgroup.path}: {exc}")
