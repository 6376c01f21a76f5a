"""``scripts/controlplane build | run [options] -- CMD ARGS… | versions``.

``run`` creates a private network namespace (``unshare --net``, with a user namespace when not root),
brings up loopback and the pod range 10.244.0.0/24 on it, starts etcd, kube-apiserver,
kube-controller-manager, KEDA's operator and metrics adapter, the pod stand-in and (unless
``--no-scaler``) keda-llm-scaler, then runs CMD inside the namespace with:

- ``KUBECONFIG``: the admin kubeconfig (client certificate, system:masters);
- ``KLS_SCALER_ADDRESS``: the scaler's gRPC address (host:port), for a ScaledObject's ``scalerAddress``;
- ``KLS_SCALER_METRICS``: the scaler's own /metrics URL;
- ``KLS_PODS``: the pod stand-in's control API (``/status``, ``/load``, ``/fail``; ``/records`` with real
  engines);
- ``KLS_PODS_ENGINE``: what the pods run, ``sim`` or ``vllm`` (``--pods``);
- ``KLS_CONTROLPLANE``: faults on request (``POST /restart-apiserver``, ``POST /compact-etcd``);
- ``KLS_CONTROLPLANE_DIR``: the run's directory (``pki/``, ``logs/``, kubeconfigs);
- ``KLS_AUDIT_LOG``: the API server's audit log (JSON lines): every request on EndpointSlices and pods;
- ``KLS_HPA_SYNC_PERIOD``: the HPA controller's sync period in seconds (``--hpa-sync-period``);
- ``KLS_KUBERNETES_VERSION``, ``KLS_KEDA_VERSION``.

Everything is stopped by its pid when CMD ends, whatever its exit, and run exits with CMD's code.
Nothing can reach an address outside the namespace: it has no route but loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from keda_llm_scaler.controlplane.build import KEDA_VERSION, KUBERNETES_VERSION, binaries, build
from keda_llm_scaler.controlplane.cluster import NODE_IP, POD_CIDR, ControlPlane

INSIDE_ENV = "KLS_CONTROLPLANE_INSIDE"
SCALER_GRPC, SCALER_METRICS, PODS_CONTROL, PLANE_CONTROL = 9090, 9091, 7070, 7071


def _say(msg: str) -> None:
    print(f"[controlplane] {msg}", file=sys.stderr, flush=True)


def _enter_namespace(argv: list[str]) -> int:
    unshare = shutil.which("unshare")
    if unshare is None:
        _say("the unshare command (util-linux) is needed for the private network namespace")
        return 2
    flags = ["--net", "--fork", "--kill-child"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    cmd = [unshare, *flags, "--", sys.executable, "-m", "keda_llm_scaler.controlplane", *argv]
    proc = subprocess.Popen(cmd, env={**os.environ, INSIDE_ENV: "1"})

    def forward(signum: int, _frame: object) -> None:
        # unshare neither forwards a signal nor outlives one cleanly (its child would be left to init, or
        # killed without its cleanup): the runner inside gets SIGTERM and stops everything by pid itself
        inner = _children(proc.pid)
        for pid in inner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not inner:
            proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # a second Ctrl-C while the inside stops: keep waiting for it
            continue


def _stop_leftovers(grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every process still below this one (by pid), and reap them."""
    left = _descendants(os.getpid())
    for pid in left:
        _say(f"stopping leftover process {pid}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
        left = _descendants(os.getpid())
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap()


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    # zombies are gone already (only the reaping is left)
    return [p for p in out if _state(p) not in ("Z", "")]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    return out


def _network() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # a /24 on loopback makes every address of the pod range local (Linux's AnyIP): pods bind their own
    subprocess.run(["ip", "addr", "add", f"{NODE_IP}/24", "dev", "lo"], check=True)


def _remove_engine_groups(standin_pid: int) -> None:
    """The pods' engine cgroups the stand-in could not remove itself (stopped past its grace)."""
    from keda_llm_scaler.controlplane.enginepods import cgroup_prefix
    from keda_llm_scaler.enginelab.cgroups import remove_groups

    for path in remove_groups(cgroup_prefix(standin_pid)):
        _say(f"removed the leftover cgroup {path}")


def _engine_built() -> bool:
    from keda_llm_scaler.enginelab.build import engine_env

    return engine_env().complete


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], name: str) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before answering {url}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{name} did not answer {url} within {timeout:.0f}s")


def _run_inside(args: argparse.Namespace) -> int:
    _network()
    bins = binaries()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kls-controlplane-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cp = ControlPlane(workdir, bins, hpa_sync_period_s=args.hpa_sync_period)
    code = 1
    cmd_proc: subprocess.Popen[bytes] | None = None
    pods: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        if cmd_proc is not None and cmd_proc.poll() is None:
            cmd_proc.send_signal(signum)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # PR_SET_CHILD_SUBREAPER: what CMD starts and leaves behind (a test's own scaler, killed pytest's
    # children) is reparented here instead of to init, so the stop below can find it by pid
    ctypes.CDLL(None, use_errno=True).prctl(36, 1)
    try:
        cp.start()
        pods = cp._spawn(
            "pod-standin",
            [sys.executable, "-m", "keda_llm_scaler.controlplane.standin", "--kubeconfig", str(cp.kubeconfig),
             "--control", f"127.0.0.1:{PODS_CONTROL}", "--pod-cidr", POD_CIDR, "--profile", args.profile,
             "--mix", args.mix, "--ready-after", str(args.ready_after), "--engine", args.pods,
             "--engine-cpus", str(args.engine_cpus), "--engine-max-num-seqs", str(args.engine_max_num_seqs),
             "--log-dir", str(workdir / "logs" / "engines")],
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{PODS_CONTROL}/status", 30, pods, "pod stand-in")
        cp.serve_control(PLANE_CONTROL)
        env = {
            "KUBECONFIG": str(cp.kubeconfig),
            "KLS_CONTROLPLANE": f"http://127.0.0.1:{PLANE_CONTROL}",
            "KLS_PODS": f"http://127.0.0.1:{PODS_CONTROL}",
            "KLS_PODS_ENGINE": args.pods,
            "KLS_CONTROLPLANE_DIR": str(workdir),
            "KLS_AUDIT_LOG": str(cp.audit_log),
            "KLS_HPA_SYNC_PERIOD": f"{args.hpa_sync_period:g}",
            "KLS_KUBERNETES_VERSION": KUBERNETES_VERSION,
            "KLS_KEDA_VERSION": KEDA_VERSION,
        }
        if not args.no_scaler:
            scaler = cp._spawn(
                "keda-llm-scaler",
                [sys.executable, "-m", "keda_llm_scaler", "serve", "--host", "127.0.0.1",
                 "--grpc-port", str(SCALER_GRPC), "--metrics-port", str(SCALER_METRICS),
                 "--kubeconfig", str(cp.kubeconfig), "--log-json", "true", "--victim-ranking", "*",
                 *shlex.split(args.scaler_args)],
            )  # fmt: skip
            _wait_http(f"http://127.0.0.1:{SCALER_METRICS}/metrics", 30, scaler, "keda-llm-scaler")
            env["KLS_SCALER_ADDRESS"] = f"127.0.0.1:{SCALER_GRPC}"
            env["KLS_SCALER_METRICS"] = f"http://127.0.0.1:{SCALER_METRICS}/metrics"
        (workdir / "env.json").write_text(json.dumps({**env, "timings": cp.timings}, indent=1) + "\n")
        if not args.cmd:
            _say("control plane is up; no CMD given, stopping")
            code = 0
        else:
            cmd_proc = subprocess.Popen(args.cmd, env={**os.environ, **env})
            code = cmd_proc.wait()
            if code < 0:  # killed by a signal: the shell's 128 + N
                code = 128 - code
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # a component that would not start: say which, with its log's tail
        _say(f"failed: {exc}")
        code = 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # stopping now: a second signal must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        if cmd_proc is not None and cmd_proc.poll() is None:
            cmd_proc.kill()
            cmd_proc.wait()
        standin_pid = pods.pid if pods is not None else None
        cp.stop()
        _stop_leftovers()
        if args.pods == "vllm" and standin_pid is not None:
            _remove_engine_groups(standin_pid)
        cp.cleanup()
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif code != 0 or args.keep:
            _say(f"logs kept in {workdir / 'logs'}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="scripts/controlplane", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or reuse) kube-apiserver, kube-controller-manager and KEDA")
    sub.add_parser("versions", help="print the versions and where the binaries are cached")
    run = sub.add_parser("run", help="start everything in a private network namespace and run CMD there")
    run.add_argument("--hpa-sync-period", type=float, default=15.0, help="seconds (Kubernetes' default 15)")
    run.add_argument("--profile", default="8b-h100", help="the pods' replica profile (default 8b-h100)")
    run.add_argument("--mix", default="decode-heavy", help="the load's token mix (default decode-heavy)")
    run.add_argument("--ready-after", type=float, default=3.0, help="seconds a pod takes to become Ready")
    run.add_argument(
        "--pods",
        choices=("sim", "vllm"),
        default="sim",
        help="what a pod runs: the replica model (default) or a real vLLM engine at its address (scripts/engine "
        "build first); with vllm, /load sends real streaming requests and GET /records lists them",
    )
    run.add_argument("--engine-cpus", type=float, default=0.5, help="with --pods vllm: each engine's CPU quota")
    run.add_argument("--engine-max-num-seqs", type=int, default=16, help="with --pods vllm: --max-num-seqs")
    run.add_argument("--no-scaler", action="store_true", help="do not start keda-llm-scaler")
    run.add_argument(
        "--scaler-args", default="", help="more `serve` flags for the scaler (they override the run's own)"
    )
    run.add_argument("--workdir", default=None, help="keep the run's files here (default: a temporary dir)")
    run.add_argument("--keep", action="store_true", help="keep the temporary directory (logs) after the run")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS…")
    args = ap.parse_args(argv)
    if args.command == "build":
        b = build()
        print(b.bin)
        return 0
    if args.command == "versions":
        b = binaries()
        print(json.dumps({"kubernetes": KUBERNETES_VERSION, "keda": KEDA_VERSION, "bin": str(b.bin),
                          "complete": b.complete}))  # fmt: skip
        return 0
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    if os.environ.get(INSIDE_ENV) != "1":
        if args.pods == "vllm" and not _engine_built():
            _say("--pods vllm needs the engine environment: run scripts/engine build first")
            return 2
        if not binaries().complete:
            _say("binaries missing: building them first (scripts/controlplane build)")
            build()
        return _enter_namespace(argv)
    return _run_inside(args)


if __name__ == "__main__":
    raise SystemExit(main())
