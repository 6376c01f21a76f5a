"""Command line: ``keda-llm-scaler serve`` and ``keda-llm-scaler inspect``. Argument wiring only."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from keda_llm_scaler import __version__

# Only the standard library is imported before main() runs: a Ctrl-C during the imports of the server
# (grpc, aiohttp: a few hundred ms) must reach main()'s handler, not print a traceback from an import.
if TYPE_CHECKING:
    from keda_llm_scaler.policy import ScoringParams
    from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (argparse prints the whole usage first: 25 lines for serve)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _build_parser(command: str | None = None) -> argparse.ArgumentParser:
    from keda_llm_scaler.config import add_serve_arguments
    from keda_llm_scaler.engines import ENGINE_CHOICES
    from keda_llm_scaler.metadata import DEFAULTS

    parser = _Parser(
        prog="keda-llm-scaler",
        description="KEDA external scaler for vLLM/SGLang fleets (waiting queue, KV-cache pressure, rejects).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the gRPC scaler for KEDA",
        description="Run the ExternalScaler gRPC service. Every flag can also be set "
        "through the environment variable named in its help.",
    )
    add_serve_arguments(serve)
    shadow = sub.add_parser(
        "shadow",
        help="scrape and score workloads exactly as serve does, without acting: what the scaler would ask for",
        description="Scrape and score the workloads of --config exactly as serve does, but answer no KEDA: "
        "their current autoscaler keeps control. Exports llm_scaler_composite and "
        "llm_scaler_shadow_desired_replicas beside the workloads' own replicas; --record writes what it saw. "
        "Takes every serve flag (Kubernetes access, ports, learned state).",
    )
    shadow.add_argument("--config", type=Path, required=True, help="the workloads (YAML; docs/shadow.md)")
    shadow.add_argument("--record", type=Path, default=None, help="append one JSON line per workload per cycle")
    add_serve_arguments(shadow)
    shadow_report = sub.add_parser(
        "shadow-report",
        help="turn a shadow recording (or Prometheus' copy of its series) into a PNG and a markdown report",
    )
    if command == "shadow-report":
        from keda_llm_scaler.shadow_report import add_shadow_report_arguments

        add_shadow_report_arguments(shadow_report)
    inspect = sub.add_parser(
        "inspect",
        help="read one replica's /metrics and print its signals",
        description="Read one replica's /metrics (a URL or a file) and print the signals the scaler extracts from it.",
    )
    inspect.add_argument(
        "target", help="base URL (http://host:8000, or host:port), /metrics URL, or a file ('-' = stdin)"
    )
    inspect.add_argument("--engine", choices=ENGINE_CHOICES, default="auto")
    inspect.add_argument("--model", default=None, help="only series with this model_name")
    inspect.add_argument("--timeout", type=float, default=5.0, help="seconds, for a URL (default 5)")
    inspect.add_argument("--target-kv-usage", type=float, default=DEFAULTS["targetKvUsage"])
    inspect.add_argument("--target-queue-depth", type=float, default=DEFAULTS["targetQueueDepth"])
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    replay = sub.add_parser(
        "replay",
        help="replay a request trace through a simulated fleet under a policy",
        description="Replay a request trace (Azure CSV format) through a simulated vLLM "
        "fleet under the HPA and one scaling policy, or --sweep all of them.",
    )
    demo = sub.add_parser(
        "demo",
        help="run a simulated fleet, the real scaler and a KEDA+HPA emulator (~1 min)",
        description="A small simulated vLLM fleet serving real /metrics on loopback, the real "
        "scaler server and a KEDA+HPA emulator calling it over gRPC, replaying a "
        "bundled trace about 12x faster than real time. Writes a summary and a PNG.",
    )
    probe = sub.add_parser(
        "probe",
        help="call a running scaler as KEDA does (spec, metrics, active, stream) and explain its answer",
    )
    loadgen = sub.add_parser(
        "loadgen",
        help="send a trace's arrivals to real engines as streaming OpenAI requests (open loop) and measure TTFT",
        description="Open-loop streaming /v1/completions load from a trace (Azure CSV, a bundled one, or a "
        "ServeGen curve), rescaled to --rate, against one or more engines; measures TTFT and inter-token "
        "latency client-side and writes a JSON summary and a PNG.",
    )
    calibrate = sub.add_parser(
        "calibrate",
        help="fit a replica profile for the simulator from a short benchmark of a running vLLM engine",
        description="Send prefill and decode probes to a running vLLM V1 engine, read its own histograms and "
        "cache config, and write a profile (the bundled profiles' step-time model) for replay --profile FILE.",
    )
    if command == "calibrate":
        from keda_llm_scaler.enginelab.calibrate import add_calibrate_arguments

        add_calibrate_arguments(calibrate)
    if command == "loadgen":
        from keda_llm_scaler.enginelab.loadgen_cli import add_loadgen_arguments

        add_loadgen_arguments(loadgen)
    if command == "probe":  # gRPC and httpx clients: loaded only for this command
        from keda_llm_scaler.probe import add_probe_arguments

        add_probe_arguments(probe)
    # The simulator is imported only for its own commands: `serve` and `inspect` never load it.
    if command == "replay":
        from keda_llm_scaler.sim.replay import add_replay_arguments

        add_replay_arguments(replay)
    elif command == "demo":
        from keda_llm_scaler.sim.demo import add_demo_arguments

        add_demo_arguments(demo)
    return parser


class InspectError(Exception):
    pass


async def _fetch_signals(target: str, engine: str, model: str | None, timeout: float) -> ReplicaSignals:
    from keda_llm_scaler.errors import BadMetadata
    from keda_llm_scaler.metadata import DEFAULTS, endpoint_urls
    from keda_llm_scaler.scrape import Scraper

    try:
        (url,) = endpoint_urls(target, str(DEFAULTS["metricsPath"]))
    except BadMetadata as exc:
        raise InspectError(f"{target}: {str(exc).split(': ', 1)[-1]}") from None
    scraper = Scraper(max_concurrency=1)
    try:
        result = await scraper.scrape(url, timeout=timeout, engine=engine, model=model)
    finally:
        await scraper.aclose()
    if result.signals is None:
        raise InspectError(f"{url}: {result.reason}: {result.detail}")
    return result.signals


# host:port[/path] (a name, an IPv4 address or [IPv6]), or an IP address alone: what `inspect` reads as a
# URL when no file has that name. A bare word (metrics.txt, data/x) stays a file: it is more often a typo.
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][-A-Za-z0-9.]*):[0-9]{1,5}(/\S*)?$")
_BARE_IP = re.compile(r"^([0-9]{1,3}(\.[0-9]{1,3}){3}|\[[0-9A-Fa-f:.]+\]|localhost)(/\S*)?$")


def _as_url(target: str) -> str | None:
    if "://" in target:
        return target
    if target != "-" and not Path(target).exists() and (_HOST_PORT.match(target) or _BARE_IP.match(target)):
        return f"http://{target}"
    return None


def _read_signals(args: argparse.Namespace) -> tuple[str, ReplicaSignals]:
    import asyncio

    from keda_llm_scaler.engines import read_replica
    from keda_llm_scaler.errors import ReplicaError
    from keda_llm_scaler.promtext import TextFormatError

    target: str = args.target
    if (url := _as_url(target)) is not None:
        return url, asyncio.run(_fetch_signals(url, args.engine, args.model, args.timeout))
    try:
        text = sys.stdin.read() if target == "-" else Path(target).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise InspectError(f"cannot read {target}: no such file (for a URL: host:port or http://...)") from None
    except OSError as exc:
        raise InspectError(f"cannot read {target}: {exc.strerror or exc}") from None
    if not text.strip():
        raise InspectError(f"{'stdin' if target == '-' else target}: empty input")
    try:
        return target, read_replica(text, args.engine, args.model)
    except (TextFormatError, ReplicaError) as exc:
        raise InspectError(f"{target}: {exc}") from None


def _report(source: str, s: ReplicaSignals, params: ScoringParams) -> dict[str, Any]:
    from keda_llm_scaler.demand import kv_utilization
    from keda_llm_scaler.policy import ReplicaInput, score_replica
    from keda_llm_scaler.signals import histogram_quantile

    engines = tuple((e.waiting, e.running) for e in s.engines) if len(s.engines) > 1 else ()
    score = score_replica(
        ReplicaInput(
            waiting=s.waiting, running=s.running, kv_usage=s.kv_usage, kv_usage_max=s.kv_usage_max, engines=engines
        ),
        params,
    )
    return {
        "source": source,
        "engine": s.engine,
        "models": list(s.models),
        "sleeping": None if s.sleep_level is None else s.sleep_level > 0,  # None: the engine does not say
        "signals": {
            # the capacity-waiting where the engine splits its waiting (vLLM 0.30+), beside what it defers
            "waiting": s.waiting,
            "deferred": s.deferred,
            "sleep_level": s.sleep_level,
            "running": s.running,
            "kv_usage": s.kv_usage,
            "kv_usage_max": s.kv_usage_max,
            "preemptions_total": s.preemptions_total,
            "rejects_total": s.rejects_total,
            "admitted_total": s.admitted_total,
            "faults_total": s.faults_total,
            "prompt_tokens_total": s.prompt_tokens_total,
            "generation_tokens_total": s.generation_tokens_total,
            "ttft_p95_s_since_start": histogram_quantile(0.95, s.ttft) if s.ttft else None,
            "itl_p95_s_since_start": histogram_quantile(0.95, s.itl) if s.itl else None,
            "queue_time_p95_s_since_start": histogram_quantile(0.95, s.queue_time) if s.queue_time else None,
        },
        "engines": [
            {"rank": e.rank, "waiting": e.waiting, "running": e.running, "kv_usage": e.kv_usage} for e in s.engines
        ],
        # What this replica alone adds to the composite's pressure side (no rates: one scrape has none),
        # and the share of its capacity its KV says it serves (the demand's reading before one is learned).
        "demand": round(score.demand, 3),
        "kv_utilization": round(kv_utilization(s.kv_usage_max), 3),
    }


def _print_human(report: dict[str, Any]) -> None:
    sig = report["signals"]
    print(f"{report['source']}: {report['engine']}  models={','.join(report['models']) or '-'}")
    print(
        f"  waiting={sig['waiting']:g} running={sig['running']:g} kv_usage={sig['kv_usage']:.3f} "
        f"(max {sig['kv_usage_max']:.3f})  demand={report['demand']:g} replica-equivalents  "
        f"~{100 * report['kv_utilization']:.0f} % of capacity by its KV"
    )
    if sig["deferred"]:
        print(f"  deferred={sig['deferred']:g} (waiting on LoRA, a KV transfer or a blocked status: not demand)")
    if report["sleeping"]:
        print(f"  asleep (level {sig['sleep_level']}): its 0 waiting and 0 running are not free capacity")
    for e in report["engines"]:
        print(f"  engine {e['rank']}: waiting={e['waiting']:g} running={e['running']:g} kv_usage={e['kv_usage']:.3f}")


def _command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


SIM_EXTRA_HINT = "pip install 'keda-llm-scaler[sim]'"


def _plots_missing(args: argparse.Namespace) -> str | None:
    """Why this run cannot draw the plots it will be asked for, checked before it simulates for minutes."""
    if args.command == "demo":
        needs = "the demo's plot"
    elif args.command == "replay" and args.plot is not None:
        needs = "--plot"
    elif args.command == "replay" and args.sweep:
        needs = "--sweep's Pareto plot"
    elif args.command == "loadgen" and args.plot is not None:
        needs = "--plot"
    elif args.command == "shadow-report":
        needs = "the report's plots"
    else:
        return None  # a replay without --plot or --sweep draws nothing: it runs without matplotlib
    try:
        import keda_llm_scaler.sim.plots  # noqa: F401 - the module the run imports when it draws
    except ModuleNotFoundError as exc:
        return f"{needs} needs {exc.name}, which is not installed: {SIM_EXTRA_HINT}"
    return None


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # before serve's event loop takes the signal over: as Ctrl-C, a quiet stop


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _command(argv) != "serve":
        return _main(argv)
    # A stop asked while serve starts (imports, settings, binding; ~2 s) is a stop, not an error: no
    # traceback, exit 0. From run() on, the event loop takes both signals (keda_llm_scaler/server.py).
    # SIGINT too, not left to Python's default: a process started from a non-interactive shell's
    # background job inherits SIGINT ignored, and Python then installs no handler for it, so a Ctrl-C
    # (or the process group's SIGINT) during start-up was lost while the same signal a second later stopped it.
    try:
        # inside the try: a signal that arrives as its handler is installed runs that handler on the way
        # out of signal.signal itself (a CI run saw the KeyboardInterrupt escape from there, exit -2)
        signal.signal(signal.SIGTERM, _stop_starting)
        signal.signal(signal.SIGINT, _stop_starting)
        return _main(argv)
    except KeyboardInterrupt:
        return 0
    finally:
        # Exiting: the event loop has given the signals back to their defaults, and a late Ctrl-C or
        # SIGTERM must not print a traceback or kill the process while it exits.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _main(argv: list[str]) -> int:
    try:
        args = _build_parser(_command(argv)).parse_args(argv)
    except ModuleNotFoundError as exc:
        print(f"keda-llm-scaler: {exc}; the simulator needs its extra: {SIM_EXTRA_HINT}", file=sys.stderr)
        return 2
    if args.command == "inspect":
        from keda_llm_scaler.policy import ScoringParams

        try:
            if not 0 < args.target_kv_usage <= 1:
                raise InspectError(f"--target-kv-usage {args.target_kv_usage:g}: accepted: a number in (0, 1]")
            if not args.target_queue_depth > 0:
                raise InspectError(f"--target-queue-depth {args.target_queue_depth:g}: accepted: a number > 0")
            source, signals = _read_signals(args)
            params = ScoringParams(args.target_kv_usage, args.target_queue_depth)
        except InspectError as exc:
            print(f"keda-llm-scaler inspect: {exc}", file=sys.stderr)
            return 2
        report = _report(source, signals, params)
        if args.json:
            print(json.dumps(report, sort_keys=True))
        else:
            _print_human(report)
        return 0

    if args.command == "shadow-report":
        if (missing := _plots_missing(args)) is not None:
            print(f"keda-llm-scaler shadow-report: {missing}", file=sys.stderr)
            return 2
        from keda_llm_scaler.shadow_report import shadow_report_main

        return shadow_report_main(args)

    if args.command == "shadow":
        return _shadow(args)

    if args.command == "probe":
        from keda_llm_scaler.probe import probe_main

        return probe_main(args)

    if args.command == "calibrate":
        from keda_llm_scaler.enginelab.calibrate import calibrate_main

        return calibrate_main(args)

    if args.command == "loadgen":
        if (missing := _plots_missing(args)) is not None:
            print(f"keda-llm-scaler loadgen: {missing}", file=sys.stderr)
            return 2
        from keda_llm_scaler.enginelab.loadgen_cli import loadgen_main

        return loadgen_main(args)

    if args.command in ("demo", "replay"):
        if (missing := _plots_missing(args)) is not None:
            print(f"keda-llm-scaler {args.command}: {missing}", file=sys.stderr)
            return 2
        if args.command == "demo" and args.engine == "vllm":
            from keda_llm_scaler.enginelab.demo import engine_demo_main

            return engine_demo_main(args)
        if args.command == "demo":
            from keda_llm_scaler.sim.demo import demo_main

            return demo_main(args)
        from keda_llm_scaler.sim.replay import replay_main

        return replay_main(args)

    return _serve(args)


def _shadow(args: argparse.Namespace) -> int:
    import asyncio

    from keda_llm_scaler.config import settings_from
    from keda_llm_scaler.errors import ScalerError
    from keda_llm_scaler.kube import KubeError
    from keda_llm_scaler.logs import configure_logging
    from keda_llm_scaler.server import BindError
    from keda_llm_scaler.shadow import ShadowConfigError, check_shadow_settings, load_shadow_config, run_shadow

    try:
        settings = settings_from(args)
        check_shadow_settings(settings)
        workloads = load_shadow_config(args.config)
    except (ValueError, ShadowConfigError) as exc:
        print(f"keda-llm-scaler shadow: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    try:
        if args.record is None:
            asyncio.run(run_shadow(settings, workloads))
        else:
            with args.record.open("a") as record:
                asyncio.run(run_shadow(settings, workloads, record))
    except (BindError, KubeError, ScalerError) as exc:  # a port, a kubeconfig, metadata Kubernetes must read
        print(f"keda-llm-scaler shadow: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"keda-llm-scaler shadow: {exc}", file=sys.stderr)
        return 1
    return 0


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from keda_llm_scaler.config import settings_from
    from keda_llm_scaler.kube import KubeError
    from keda_llm_scaler.logs import configure_logging
    from keda_llm_scaler.server import BindError, run

    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"keda-llm-scaler serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    try:
        asyncio.run(run(settings))
    except (BindError, KubeError) as exc:  # a setting the server cannot start with (a port, a kubeconfig)
        print(f"keda-llm-scaler serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"keda-llm-scaler serve: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
