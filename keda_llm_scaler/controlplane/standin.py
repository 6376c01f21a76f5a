"""The pod stand-in's command: ``python -m keda_llm_scaler.controlplane.standin`` (``scripts/controlplane
run`` starts it). Pods run the replica model (``pods.PodStandIn``) or, with ``--engine vllm``, one real
vLLM engine each (``enginepods.EnginePodStandIn``)."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.controlplane.enginepods import EnginePodStandIn
from keda_llm_scaler.controlplane.pods import PodStandIn
from keda_llm_scaler.enginelab.build import engine_env
from keda_llm_scaler.enginelab.run import EngineSpec

__all__ = ["main"]


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m keda_llm_scaler.controlplane.standin", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--control", default="127.0.0.1:7070", help="host:port of the control API")
    ap.add_argument("--pod-cidr", default="10.244.0.0/24")
    ap.add_argument("--profile", default="8b-h100")
    ap.add_argument("--mix", default="decode-heavy", help="a lognormal token mix of sim.mixes")
    ap.add_argument("--ready-after", type=float, default=3.0, help="seconds from start to Ready (model loading)")
    ap.add_argument("--slo-ttft", type=float, default=2.0)
    ap.add_argument(
        "--engine", choices=("sim", "vllm"), default="sim", help="a pod runs the replica model, or a real vLLM engine"
    )
    ap.add_argument("--engine-cpus", type=float, default=0.5, help="vllm: each engine's CPU quota once ready")
    ap.add_argument("--engine-max-num-seqs", type=int, default=16)
    ap.add_argument("--engine-layers", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=200, help="vllm: the load's prompt length")
    ap.add_argument("--output-tokens", type=int, default=50, help="vllm: the load's output length")
    ap.add_argument("--log-dir", type=Path, default=Path("."), help="vllm: where each engine's log goes")
    args = ap.parse_args(argv)
    api = Api.from_kubeconfig(args.kubeconfig)
    standin: PodStandIn
    if args.engine == "vllm":
        spec = EngineSpec(cpus=args.engine_cpus, max_num_seqs=args.engine_max_num_seqs, layers=args.engine_layers)
        args.log_dir.mkdir(parents=True, exist_ok=True)
        standin = EnginePodStandIn(api, args.pod_cidr, engine_env(), spec, args.log_dir, args.slo_ttft,
                                   args.prompt_tokens, args.output_tokens)  # fmt: skip
    else:
        standin = PodStandIn(api, args.pod_cidr, args.profile, args.mix, args.ready_after, args.slo_ttft)
    standin.register_node()
    host, _, port = args.control.rpartition(":")
    server = standin.serve_control(host, int(port))
    threading.Thread(target=standin.watch_pods, daemon=True, name="pod-watch").start()
    # SIGTERM (the control plane stopping) unwinds like ^C, so the engines are stopped by their pids
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        standin.run_engines()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        standin.stopping.set()
        standin.stop_all()
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
