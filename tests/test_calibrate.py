"""calibrate's fit and the profile it writes: known step-time coefficients are recovered from points made
with them, the file is what `replay --profile FILE` reads, and the API server's overhead reaches every
simulated TTFT and nothing else. (The probes on a real engine run in docs/sim-to-real.md's benchmark.)"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from keda_llm_scaler.enginelab.calibrate import (
    INTERACTION_BOUND,
    OVERLOAD_WINDOW,
    STEADY_SCALE_BOUNDS,
    Fit,
    ServingScales,
    _matching,
    fit_decode,
    fit_prefill,
    least_squares,
    prefill_alone,
    scaled,
    serving_mix,
    serving_overhead_ms,
    serving_scales,
    simulated_queue_ms,
    simulated_serving,
    simulated_throughput,
    simulated_window_rate,
    steady_scale,
    write_profile,
)
from keda_llm_scaler.enginelab.sweep import poisson_arrivals
from keda_llm_scaler.sim.profiles import Profile, get_profile, load_profile
from keda_llm_scaler.sim.replica import Request, SimReplica


def test_least_squares_recovers_a_plane_and_zeroes_what_the_data_cannot_tell() -> None:
    rows = [(1.0, x, y) for x in (1.0, 2.0, 5.0) for y in (0.0, 3.0)]
    ys = [2.0 + 0.5 * x - 1.5 * y for _, x, y in rows]
    assert least_squares(rows, ys) == pytest.approx([2.0, 0.5, -1.5])
    # a column of zeros has no information: 0, not a division by zero
    assert least_squares([(1.0, 0.0), (1.0, 0.0)], [3.0, 3.0]) == pytest.approx([3.0, 0.0])


def test_the_decode_and_prefill_fits_recover_the_step_time_model() -> None:
    c, d, e, b, f = 12.0, 0.8, 0.3, 0.05, 2e-5
    decode = [
        (n, n * (16 + 48.0) + extra, c + d * n + e * (n * 64.0 + extra) / 1000)
        for n in (1, 4, 8, 16)
        for extra in (0.0, 5000.0)
    ]
    assert fit_decode(decode) == pytest.approx((c, d, e))
    prefill = [(p, c + b * p + f * p * p / 2) for p in (32, 256, 512, 1024)]
    assert fit_prefill(prefill, c) == pytest.approx((b, f))
    # measured under load: each prefill step also carried the decodes beside it, which come off first
    beside = [(p, c + b * p + f * p * p / 2 + d * n + e * n * (p + 12) / 1000, n) for p, n in
              ((32, 2.5), (256, 3.0), (512, 2.8), (1024, 3.2))]  # fmt: skip
    assert fit_prefill(prefill_alone(beside, d, e, 24), c) == pytest.approx((b, f))
    # noise that would make a coefficient negative drops that term instead of fitting a negative cost
    cf, df, ef = fit_decode([(1, 100.0, 10.0), (4, 400.0, 12.0), (8, 300.0, 14.0)])
    assert min(cf, df, ef) >= 0
    # the batch barely matters at short contexts, the context a lot at long ones (as on a CPU engine): the
    # context term is kept when the batch's comes out negative
    cpu = [(1, 64, 38.0), (4, 256, 29.5), (8, 512, 29.4), (16, 1024, 36.6), (1, 816, 32.9), (4, 3264, 56.7),
           (8, 6528, 84.2), (16, 13056, 110.2)]  # fmt: skip
    c2, d2, e2 = fit_decode(cpu)
    assert d2 >= 0 and e2 > 4.0 and c2 > 20.0


def test_the_profile_file_loads_and_replays(tmp_path: Path) -> None:
    fit = Fit(
        18.7, 0.094, 1.38, 0.0, 0.0, 0.0123, 34.0, 262144, 16, {"prefill": [[32, 33.2]], "decode": [[1, 64, 19.0]]}
    )
    path = tmp_path / "cpu.json"
    write_profile(fit, path, name="cpu", description="test", cold_start_s=60.0)
    profile = load_profile(path)
    assert (profile.c_ms, profile.max_num_seqs, profile.kv_tokens, profile.ttft_overhead_ms) == (18.7, 16, 262144, 34.0)
    assert profile.g_ms == 0.0123 and profile.ttft_overhead_by_streams == ()
    exe = Path(sys.executable).parent / "keda-llm-scaler"
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{i // 4:02d}.{(i % 4) * 25:02d}0000,200,20\n" for i in range(120)
    ))  # fmt: skip
    proc = subprocess.run(
        [str(exe), "replay", "--trace", str(trace), "--profile", str(path), "--policy", "static", "--knob", "1",
         "--slo-ttft", "1", "--json"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["profile"] == str(path) and summary["requests"] == 120 and summary["slo_attainment"] > 0


def test_the_api_server_overhead_adds_to_every_ttft_and_to_nothing_else() -> None:
    base = get_profile("8b-h100")
    slow = dataclasses.replace(base, ttft_overhead_ms=40.0)
    done = {}
    for name, profile in (("base", base), ("slow", slow)):
        replica = SimReplica(profile)
        replica.submit([Request(i, 0.01 * i, 300, 30) for i in range(50)])
        replica.advance(60.0)
        done[name] = sorted(replica.finished, key=lambda r: r.rid)
    for a, b in zip(done["base"], done["slow"], strict=True):
        assert b.ttft == pytest.approx(a.ttft + 0.040)
        assert b.finished_at == pytest.approx(a.finished_at)  # the engine's schedule is the same


def test_the_api_server_overhead_by_answers_streaming_follows_the_decodes_at_each_first_token() -> None:
    """A profile with ``ttft_overhead_by_streams`` adds to each first token the point for the answers
    decoding on the replica at that moment (linear between points, flat past the last), and moves no
    step: a request alone takes the idle point, one sent into a full batch the busy one."""
    base = dataclasses.replace(get_profile("8b-h100"), max_num_seqs=8)
    table = ((0, 3.0), (1, 20.0), (3, 50.0))
    assert [dataclasses.replace(base, ttft_overhead_by_streams=table).first_token_overhead_ms(n)
            for n in (0, 1, 2, 3, 7)] == [3.0, 20.0, 35.0, 50.0, 50.0]  # fmt: skip
    assert dataclasses.replace(base, ttft_overhead_ms=7.0).first_token_overhead_ms(5) == 7.0  # no table: flat
    shapes = [Request(0, 0.0, 200, 400)] + [Request(i, 0.2 + 0.05 * i, 100, 20) for i in range(1, 5)]
    done = {}
    for name, profile in (("base", base), ("table", dataclasses.replace(base, ttft_overhead_by_streams=table))):
        replica = SimReplica(profile)
        replica.submit([Request(r.rid, r.arrival, r.prompt, r.output) for r in shapes])
        replica.advance(60.0)
        done[name] = {r.rid: r for r in replica.finished}
    extra = {rid: done["table"][rid].ttft - done["base"][rid].ttft for rid in done["base"]}  # type: ignore[operator]
    # the first request is alone at its first token; the next come while it (and those before them) decode
    assert extra[0] == pytest.approx(0.003)
    assert extra[1] == pytest.approx(0.020)
    assert extra[4] == pytest.approx(0.050)
    assert 0.020 < extra[2] < 0.050
    for rid, r in done["base"].items():
        assert done["table"][rid].finished_at == pytest.approx(r.finished_at)  # the engine's schedule is the same


def test_the_serving_overhead_puts_the_models_mean_ttft_at_the_clients() -> None:
    """The API server's time is fitted last, on the final model: what the client waited on average in
    the serving phase beyond what the model gives the same arrivals. An engine whose clients wait 37 ms
    more than its steps (the same arrivals through the model with that overhead stand in for it) gets
    37 ms back whatever overhead the model carried, and the model with it then gives the client's mean.
    A client faster than the model is no negative time; an unknown client reading is no fit."""
    fitted = dataclasses.replace(get_profile("8b-h100"), max_num_seqs=16, max_num_batched_tokens=2048, c_ms=20.0)
    shapes = serving_mix()
    arrivals = poisson_arrivals(0.5 * simulated_throughput(fitted, shapes), 60.0, 0, 0, seed=4, mix=shapes)

    def mean_ms(profile: Profile) -> float:
        replica = SimReplica(profile)
        replica.submit([Request(i, a.t, a.prompt_tokens, a.output_tokens) for i, a in enumerate(arrivals)])
        replica.advance(3600.0)
        return 1000.0 * statistics.fmean(r.ttft for r in replica.finished if r.ttft is not None)

    client = mean_ms(dataclasses.replace(fitted, ttft_overhead_ms=37.0))
    assert serving_overhead_ms(dataclasses.replace(fitted, ttft_overhead_ms=5.0), arrivals, client) == pytest.approx(
        37.0
    )
    fitted_overhead = serving_overhead_ms(fitted, arrivals, client)
    assert fitted_overhead is not None
    assert mean_ms(dataclasses.replace(fitted, ttft_overhead_ms=fitted_overhead)) == pytest.approx(client)
    assert serving_overhead_ms(fitted, arrivals, 0.5 * mean_ms(fitted)) == 0.0
    for unknown in (None, 0.0, float("nan"), float("inf")):
        assert serving_overhead_ms(fitted, arrivals, unknown) is None


def test_the_serving_scales_recover_how_much_slower_an_engine_serves_than_its_probes_say() -> None:
    """The last step of calibrate: an engine whose decode steps under serving load are 1.3x what the
    probes fitted and whose prefill tokens cost more with every decode beside them (the same arrivals
    through the model so bent stand in for it) gets that factor and that g back, and the bent model then
    gives the engine's mean inter-token latency, mean prefill and never-dry rate. An engine whose
    prefills were faster than the probes' takes a prefill factor below 1 instead. Past the bounds the
    fit is not bent; without a prefill reading one factor matches the inter-token latency; an unreadable
    engine leaves the model as it was."""
    fitted = dataclasses.replace(get_profile("8b-h100"), max_num_seqs=16, max_num_batched_tokens=2048, c_ms=20.0)
    shapes = serving_mix()
    never_dry = simulated_throughput(fitted, shapes)
    assert never_dry > 0
    arrivals = poisson_arrivals(0.6 * never_dry / 1.5, 60.0, 0, 0, seed=3, mix=shapes)
    g = 2.0 * fitted.b_ms / fitted.max_num_seqs  # a prefill token beside a full batch costs 3x one alone
    engine = scaled(fitted, 1.3, 1.0, g)
    engine_itl, engine_prefill = simulated_serving(engine, arrivals)
    model_itl, model_prefill = simulated_serving(fitted, arrivals)
    assert engine_itl is not None and model_itl is not None and engine_itl > 1.25 * model_itl
    assert engine_prefill is not None and model_prefill is not None and engine_prefill > 1.3 * model_prefill
    s = serving_scales(fitted, arrivals, engine_itl, engine_prefill)
    assert (s.k_decode, s.k_prefill) == pytest.approx((1.3, 1.0), rel=0.03)
    # a mean over a minute of arrivals tells g within some 10 % (a step more or less moves a few prefills)
    assert s.g_ms == pytest.approx(g, rel=0.15)
    assert simulated_serving(s.apply(fitted), arrivals) == pytest.approx((engine_itl, engine_prefill), rel=0.01)
    assert simulated_throughput(s.apply(fitted), shapes) == pytest.approx(
        simulated_throughput(engine, shapes), rel=0.02
    )

    quick = scaled(fitted, 1.3, 0.7, 0.0)
    quick_itl, quick_prefill = simulated_serving(quick, arrivals)
    assert quick_itl is not None and quick_prefill is not None
    s = serving_scales(fitted, arrivals, quick_itl, quick_prefill)
    assert s.k_decode == pytest.approx(1.3, rel=0.03) and s.k_prefill == pytest.approx(0.7, rel=0.1)
    assert s.g_ms == 0.0
    assert simulated_serving(s.apply(fitted), arrivals) == pytest.approx((quick_itl, quick_prefill), rel=0.01)

    g_bound = INTERACTION_BOUND * fitted.b_ms / fitted.max_num_seqs
    assert serving_scales(fitted, arrivals, 100 * engine_itl, 100 * engine_prefill) == ServingScales(2.5, 1.0, g_bound)
    assert serving_scales(fitted, arrivals, engine_itl / 100, engine_prefill / 100) == ServingScales(0.5, 0.5, 0.0)
    one = serving_scales(fitted, arrivals, engine_itl, None)
    assert one.k_decode == one.k_prefill and one.g_ms == 0.0
    assert simulated_serving(one.apply(fitted), arrivals)[0] == pytest.approx(engine_itl, rel=1e-3)
    assert serving_scales(fitted, arrivals, 0.0, engine_prefill) == ServingScales(1.0, 1.0, 0.0)
    # the regime each ran in, recorded beside the fit: the same arrivals queue longer on slower steps
    light, heavy = simulated_queue_ms(fitted, arrivals), simulated_queue_ms(scaled(fitted, 2.0), arrivals)
    assert light is not None and heavy is not None and heavy > 2 * light
    assert serving_scales(fitted, arrivals, float("nan")) == ServingScales(1.0, 1.0, 0.0)


def test_a_prefill_cost_that_grows_with_the_decodes_beside_it_holds_at_a_lighter_load() -> None:
    """Why g and not a factor on the prefill side: fitted on a busy engine, the factor slows every
    prefill alike, so at a light load (few decodes beside each prompt) the model's prefills are slower
    than the engine's; g carries the busy engine's extra only where decodes are beside the prompt."""
    fitted = dataclasses.replace(get_profile("8b-h100"), max_num_seqs=16, max_num_batched_tokens=2048, c_ms=20.0)
    shapes = serving_mix()
    never_dry = simulated_throughput(fitted, shapes)
    busy = poisson_arrivals(0.8 * never_dry / 1.5, 60.0, 0, 0, seed=5, mix=shapes)
    light = poisson_arrivals(0.15 * never_dry / 1.5, 120.0, 0, 0, seed=6, mix=shapes)
    engine = scaled(fitted, 1.0, 1.0, 3.0 * fitted.b_ms / fitted.max_num_seqs)
    engine_itl, engine_prefill = simulated_serving(engine, busy)
    assert engine_itl is not None and engine_prefill is not None
    with_g = serving_scales(fitted, busy, engine_itl, engine_prefill).apply(fitted)
    one_factor = scaled(
        fitted, 1.0, _matching(lambda k: simulated_serving(scaled(fitted, 1.0, k), busy)[1] or 0.0, engine_prefill)
    )
    assert simulated_serving(one_factor, busy)[1] == pytest.approx(engine_prefill, rel=0.01)  # both fit the busy engine
    light_engine, light_g, light_factor = (simulated_serving(p, light)[1] for p in (engine, with_g, one_factor))
    assert light_engine is not None and light_g is not None and light_factor is not None
    assert light_g == pytest.approx(light_engine, rel=0.05)
    assert light_factor > 1.15 * light_engine


def test_the_steady_scale_makes_the_model_serve_steady_overload_at_the_engines_rate() -> None:
    """calibrate's last phase: an engine that serves steady overload 25 % slower than the model (every
    step x 1.25: the same arrivals through the model so slowed stand in for it) gets 1.25 back, and the
    model so scaled then queues a load past the knee of another mix as that engine does. The rate is
    counted only in the window, where both run with a queue; an unknown rate leaves the model alone, and
    one past the bounds takes the bound."""
    served = dataclasses.replace(get_profile("8b-h100"), max_num_seqs=16, max_num_batched_tokens=2048, c_ms=20.0)
    shapes = serving_mix()
    never_dry = simulated_throughput(served, shapes)
    overload = poisson_arrivals(1.5 * never_dry, OVERLOAD_WINDOW[1], 0, 0, seed=37, mix=shapes)
    engine = scaled(served, 1.25, 1.25, served.g_ms * 1.25)
    engine_rps = simulated_window_rate(engine, overload, OVERLOAD_WINDOW)
    model_rps = simulated_window_rate(served, overload, OVERLOAD_WINDOW)
    assert engine_rps < 0.85 * model_rps  # saturated, each completes at its own rate, not the arrivals'
    k = steady_scale(served, overload, OVERLOAD_WINDOW, engine_rps)
    assert k == pytest.approx(1.25, rel=0.03)
    final = scaled(served, k, k, served.g_ms * k)
    assert simulated_window_rate(final, overload, OVERLOAD_WINDOW) == pytest.approx(engine_rps, rel=0.02)

    # held out: another mix at 1.2 x what the engine serves of it, the median wait in the queue
    other = [(p // 2, 2 * o) for p, o in shapes]
    flood = poisson_arrivals(3 * never_dry, 60.0, 0, 0, seed=2, mix=other)
    past_knee = poisson_arrivals(
        1.2 * simulated_window_rate(engine, flood, (15.0, 60.0)), 60.0, 0, 0, seed=4, mix=other
    )

    def median_wait(profile: object) -> float:
        replica = SimReplica(profile)  # type: ignore[arg-type]
        replica.submit([Request(i, a.t, a.prompt_tokens, a.output_tokens) for i, a in enumerate(past_knee)])
        replica.advance(3600.0)
        waits = sorted(r.queued_at_admit for r in replica.finished if r.queued_at_admit is not None)
        return waits[len(waits) // 2]

    assert median_wait(final) == pytest.approx(median_wait(engine), rel=0.1)
    assert median_wait(served) < 0.5 * median_wait(engine)  # the unscaled model queues far less

    assert steady_scale(served, overload, OVERLOAD_WINDOW, 0.0) == 1.0
    assert steady_scale(served, overload, OVERLOAD_WINDOW, float("nan")) == 1.0
    assert steady_scale(served, overload, OVERLOAD_WINDOW, engine_rps / 100) == STEADY_SCALE_BOUNDS[1]
    assert steady_scale(served, overload, OVERLOAD_WINDOW, model_rps * 100) == STEADY_SCALE_BOUNDS[0]


def test_the_serving_mix_is_calibrates_own_and_fixed() -> None:
    mix = serving_mix()
    assert mix == serving_mix() and len(set(mix)) > 32
    assert all(96 <= p <= 768 and 24 <= o <= 192 for p, o in mix)
