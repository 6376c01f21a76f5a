"""(b) the capacity the scaler learns on a real engine, and (e) sustained overload with no capacity
arriving, on real vLLM engines each held to its CPU quota (issue #30).

The capacity at the SLO is measured in the same run by a static rate sweep of one engine (open-loop
Poisson, 200-token prompts, 50-token outputs, TTFT SLO 1 s at 95 %), before the overload and again after
it (the mean of the two), and its saturated throughput by a batch it never runs dry on; all with every
engine loaded alike at once (each its own stream), as they run in the overload. Then both engines get
1.5x what they can complete together, for 120 s, and the fleet cannot grow: its two endpoints are all
there is. (1.5x the capacity at the SLO is no overload here: two engines behind least-in-flight routing
pool their queues and met the SLO at 9.7 req/s where one alone missed it at 3.4.) What the load needs
is its rate over the capacity at the SLO.

The SLO is 1 s, or five times one engine's unloaded time to a first token where that is longer: the
regime (b) checks is a first token's own time well inside the SLO. Where it takes more than half of it
(an AVX2-only machine here: 0.35 s unloaded, about twice that beside a full batch), the scaler by design
still lets the queue wait half the SLO (``demand.RateTracker._within_slo``: more replicas do not shorten a
prefill), and it learned 1.04 req/s where the sweeps read 0.67 within 1 s.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import grpc

from keda_llm_scaler.enginelab.loadgen import Arrival, run_load, summarize
from keda_llm_scaler.enginelab.sweep import capacity_at_slo, poisson_arrivals, saturated_throughput
from tests.engine.conftest import Engines
from tests.engine.scaler import Watch, scaler

SLO_S = 1.0
SLO_FLOOR_MULTIPLE = 5.0  # the SLO at least this many unloaded first tokens
PROMPT, OUTPUT = 200, 50
OVERLOAD_S = 120.0
WARMUP_S = 15.0


def _slo_s(engines: Engines) -> float:
    """``SLO_S``, or ``SLO_FLOOR_MULTIPLE`` x the median time to a first token of one request at a time."""
    alone = [Arrival(1.5 * i, PROMPT, 2) for i in range(5)]
    probe = asyncio.run(run_load(engines.urls[:1], alone, engines.model))
    floor = statistics.median(r.ttft_s for r in probe.records if r.ttft_s is not None)
    print(f"unloaded time to a first token: {floor:.3f} s", file=sys.stderr)
    return max(SLO_S, SLO_FLOOR_MULTIPLE * floor)


def test_learned_capacity_matches_the_sweep_and_overload_reads_the_need(engines: Engines, tmp_path: Path) -> None:
    slo_s = _slo_s(engines)
    # one engine's throughput and capacity at the SLO, measured with every engine of the fleet loaded alike,
    # as they run in the overload (an engine swept beside an idle neighbour read 4.18 req/s within the SLO
    # on a CI machine, where the scaler then saw it take in about 3.5 with its neighbour busy)
    throughput = saturated_throughput(engines.urls, engines.model, 8 * engines.max_num_seqs, PROMPT, OUTPUT)
    # the sweep starts at half the saturated throughput, below the knee (4.69 of 6.97 req/s in a run
    # here), rather than at 1 req/s: the same capacity in about half the points; after a warm-up at that
    # rate, so that its first point does not take the engines straight from the burst
    before, points = capacity_at_slo(
        engines.urls, engines.model, slo_s=slo_s, prompt=PROMPT, output=OUTPUT,
        start_rate=max(0.5, throughput / 2), bisections=2, warmup_s=WARMUP_S,
    )  # fmt: skip
    print(f"capacity at the SLO: {before:.2f} req/s from {[(p.rate, p.attainment) for p in points]}", file=sys.stderr)
    assert before > 0.5, "an engine that serves nothing within the SLO: the engine, not the scaler, is broken"
    fleet = len(engines.urls)
    rate = 1.5 * fleet * max(throughput, before)
    arrivals = poisson_arrivals(rate, OVERLOAD_S, PROMPT, OUTPUT, seed=7)
    state_dir = str(tmp_path / "state")
    metadata = {"endpoints": ",".join(engines.urls), "ttftSloSeconds": str(slo_s)}
    with scaler("--state-dir", state_dir) as s:
        trigger = s.trigger("overload", metadata)
        with Watch(trigger) as watch:
            result = asyncio.run(run_load(engines.urls, arrivals, engines.model))
            learned = s.capacity("overload")
        summary = summarize(result, slo_s)
    # the sweep again once the overload has drained, from just below the first one's figure: the reference is
    # the mean of the two, read around the learning. These engines' capacity at the SLO moves between runs
    # and within one (0.59 then 0.45 of the throughput 17 minutes apart; a point repeated on the same
    # arrivals read 93.8 % then 98.7 %), and one sweep's figure carried that into the comparison
    after, again = capacity_at_slo(
        engines.urls, engines.model, slo_s=slo_s, prompt=PROMPT, output=OUTPUT,
        start_rate=max(0.5, 0.9 * before), bisections=2,
    )  # fmt: skip
    print(
        f"capacity at the SLO after: {after:.2f} req/s from {[(p.rate, p.attainment) for p in again]}", file=sys.stderr
    )
    restarted = _restarted_capacity(state_dir, metadata)
    capacity = (before + after) / 2
    need = rate / capacity
    values = [v for _, v in watch.readings]
    report = {
        "slo_s": slo_s,
        "capacity_sweep": capacity,
        "sweep_before": before,
        "sweep_after": after,
        "throughput": throughput,
        "learned": learned,
        "restarted": restarted,
        "rate": rate,
        "need": need,
        "max_composite": max(values, default=None),
        "readings": watch.readings,
        "attainment": summary["slo_attainment"],
        "ttft_p95_s": summary["ttft_p95_s"],
    }
    print(json.dumps(report), file=sys.stderr)
    assert not watch.errors, watch.errors
    # the overload was real: the queue grew and most requests missed the SLO
    assert summary["failed"] == 0 and summary["ttft_p95_s"] > 5 * slo_s
    broken = []  # every contract is checked, so a run that breaks both says so
    # (e) it asks for more than the fleet it has, and at most 3x what the load needs, however long the
    # backlog grows (at 0.2.0 the queue in running batches read 43.7 for a need of 3.3)
    if not max(values) > fleet:
        broken.append(f"(e) the composite never asked for more than the fleet of {fleet}: {max(values)}")
    if not max(values) <= 3 * need:
        broken.append(f"(e) the composite read {max(values)}, more than 3x the need of {need:.2f}")
    # (b) the capacity it learned past the knee is within 30 % of the sweeps'
    if learned is None or learned[0] != "learned":
        broken.append(f"(b) no capacity learned past the knee: {learned}")
    elif not 0.7 * capacity <= learned[1] <= 1.3 * capacity:
        broken.append(f"(b) learned {learned[1]:.2f} req/s against {capacity:.2f} from the sweeps (±30 %)")
    # (#33) a scaler restarted on the same --state-dir, the engines idle: its first answer has the capacity
    # it learned before, which nothing it scrapes now could teach it
    if learned is not None and (
        restarted is None or restarted[0] != learned[0] or abs(restarted[1] - learned[1]) > 0.01 * learned[1]
    ):
        broken.append(f"(#33) restarted on the same --state-dir, it exported {restarted}; it had learned {learned}")
    assert not broken, f"{broken}: {report}"


def _restarted_capacity(state_dir: str, metadata: dict[str, str]) -> tuple[str, float] | None:
    """A new scaler process on ``state_dir``: the capacity it exports right after its first answer."""
    with scaler("--state-dir", state_dir) as s:
        trigger = s.trigger("overload", metadata)
        deadline = time.monotonic() + 30.0
        while True:  # the first call may find the first scrape still running (UNAVAILABLE): ask again
            try:
                trigger.value()
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return s.capacity("overload")
