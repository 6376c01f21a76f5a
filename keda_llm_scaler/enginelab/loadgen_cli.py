"""``keda-llm-scaler loadgen`` arguments and main (the generator itself: ``enginelab.loadgen``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from keda_llm_scaler.enginelab.loadgen import discover_model, plot, progress_printer, rescale, run_load, summarize

__all__ = ["add_loadgen_arguments", "loadgen_main"]


def add_loadgen_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        action="append",
        required=True,
        help="an engine's base URL (http://host:8000); repeat for several: each request goes to the one "
        "with the fewest in flight, as a gateway does",
    )
    p.add_argument("--model", default=None, help="the served model name (default: the first in /v1/models)")
    p.add_argument("--trace", default="conv", help="CSV in the Azure format, or a bundled one: conv, bursty")
    p.add_argument("--rate-curve", default=None, metavar="CSV", help="a ServeGen rate curve ('servegen': bundled)")
    p.add_argument("--curve-model", default=None, help="with --rate-curve: the model column")
    p.add_argument("--hours", default=None, metavar="A:B", help="replay hours A to B of the trace or curve")
    p.add_argument("--peak-rate", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="RPS",
        help="rescale the arrivals in time to this mean rate, e.g. what the target serves (default: the trace's)",
    )
    p.add_argument("--duration", type=float, default=300.0, metavar="S", help="seconds of arrivals (default 300)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="every prompt this long (default: the trace's)")
    p.add_argument("--output-tokens", type=int, default=None, help="every output this long (default: the trace's)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="clamp the trace's prompts (default 1024)")
    p.add_argument("--max-output-tokens", type=int, default=256, help="clamp the trace's outputs (default 256)")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT SLO in seconds, for attainment (default 1)")
    p.add_argument("--skip", type=float, default=0.0, metavar="S", help="leave the first S seconds out of figures")
    p.add_argument("--timeout", type=float, default=300.0, help="per request, seconds (default 300)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the arrivals and token counts; prompts are fresh on every run (no prefix-cache hits)",
    )
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE", help="the summary (default: stdout)")
    p.add_argument("--plot", default=None, metavar="PNG", help="offered load and TTFT over time")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _rows(args: argparse.Namespace) -> list[tuple[float, int, int]]:
    from keda_llm_scaler.sim.trace import TRACES
    from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload, TraceWorkload, Workload, parse_hours

    hours = parse_hours(args.hours) if args.hours else None
    trace = TRACES.get(args.trace, Path(args.trace))
    if args.rate_curve is not None:
        curve = BUNDLED_CURVE if args.rate_curve == "servegen" else Path(args.rate_curve)
        workload: Workload = CurveWorkload.build(
            curve, trace, model=args.curve_model, hours=hours, rate_scale=1.0, peak_rate=args.peak_rate, seed=args.seed
        )
    else:
        workload = TraceWorkload.from_file(trace, 1.0, args.seed, hours, "conversation")
    return list(workload.rows())


def loadgen_main(args: argparse.Namespace) -> int:
    if args.rate is not None and not args.rate > 0:
        print("keda-llm-scaler loadgen: --rate must be > 0", file=sys.stderr)
        return 2
    urls = [u.rstrip("/") for u in args.url]
    try:
        rows = _rows(args)
    except (OSError, ValueError) as exc:
        print(f"keda-llm-scaler loadgen: {exc}", file=sys.stderr)
        return 2
    arrivals = rescale(
        rows,
        args.rate,
        args.duration,
        max_prompt=args.max_prompt_tokens,
        max_output=args.max_output_tokens,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    if not arrivals:
        print("keda-llm-scaler loadgen: no arrivals in that trace window", file=sys.stderr)
        return 2
    try:
        model = args.model or asyncio.run(discover_model(urls[0]))
    except Exception as exc:  # any failure to reach the engine is the user's URL: say which
        print(f"keda-llm-scaler loadgen: cannot list models at {urls[0]}/v1/models: {exc}", file=sys.stderr)
        return 3
    progress = None if args.quiet else progress_printer(len(arrivals))
    result = asyncio.run(run_load(urls, arrivals, model, timeout_s=args.timeout, progress=progress))
    summary = summarize(result, args.slo_ttft, skip_s=args.skip)
    summary.update({"urls": urls, "model": model, "trace": str(args.trace), "rate": args.rate})
    text = json.dumps(summary, indent=2, sort_keys=True)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    else:
        print(text)
    if args.plot:
        plot(summary, Path(args.plot), f"loadgen: {len(arrivals)} requests on {len(urls)} engine(s)")
    if not args.quiet:
        att = summary["slo_attainment"]
        print(
            f"loadgen: {summary['completed']}/{summary['requests']} completed, TTFT p50 {summary['ttft_p50_s']} s, "
            f"p95 {summary['ttft_p95_s']} s, attainment {att if att is None else round(100 * att, 2)} %",
            file=sys.stderr,
        )
    return 0
