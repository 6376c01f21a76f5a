"""keda-llm-scaler loadgen: arrivals rescaled from a trace, open-loop streaming requests, client-side TTFT
and inter-token latency, least-in-flight routing, failures counted as misses; the CLI's JSON and PNG.

The engines here are OpenAI-compatible streaming servers on loopback (real HTTP, real SSE) whose first
token and token gaps are set by the test; real vLLM is in tests/engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web

from keda_llm_scaler.enginelab.loadgen import Arrival, rescale, run_load, summarize
from keda_llm_scaler.enginelab.sweep import capacity_at_slo
from keda_llm_scaler.testing.replicas import dead_port

FIRST_TOKEN_S = 0.05
TOKEN_GAP_S = 0.01


@contextmanager
def openai_server(
    status: int = 200, first_token_s: float = FIRST_TOKEN_S, ending: str = "length", slots: int | None = None
) -> Iterator[tuple[str, list[dict]]]:
    """A streaming /v1/completions on loopback: the first token after ``first_token_s``, then one per
    TOKEN_GAP_S, ``max_tokens`` of them (some with empty text, as a byte-level token inside a UTF-8
    character streams), the last with vLLM's ``finish_reason``, then a usage chunk with no choices and
    [DONE]. ``ending``: "length" (a whole answer), "abort" (vLLM shutting down without a drain: half the
    tokens, then finish_reason abort), "drop" (the connection closes after half). ``slots``: at most that many
    answers at once, the rest wait for one (a batch cap). Records each body."""
    bodies: list[dict] = []
    loop = asyncio.new_event_loop()
    batch = asyncio.Semaphore(slots) if slots else None
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        if status != 200:
            return web.json_response({"error": "overloaded"}, status=status)
        if batch is not None:
            async with batch:
                return await answer(request, body)
        return await answer(request, body)

    async def answer(request: web.Request, body: dict) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(first_token_s)
        n = body["max_tokens"] if ending == "length" else max(1, body["max_tokens"] // 2)
        for i in range(n):
            if i:
                await asyncio.sleep(TOKEN_GAP_S)
            if ending == "drop" and i == n - 1:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            text = "" if i % 3 == 2 else f"t{i}"
            finish = (ending if ending != "drop" else None) if i == n - 1 else None
            chunk = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{holder['port']}", bodies
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_rescale_sends_the_asked_rate_over_the_run_whatever_the_traces_own() -> None:
    # a trace quiet at first (1 req/s for 100 s) then busy (10 req/s): 5 req/s over 20 s is 100 arrivals
    rows = [(float(i), 300, 40) for i in range(100)] + [(100 + i / 10, 3000, 900) for i in range(1000)]
    arrivals = rescale(rows, 5.0, 20.0, max_prompt=1024, max_output=256)
    assert abs(len(arrivals) - 100) <= 1
    assert all(0 <= a.t < 20.0 for a in arrivals) and arrivals == sorted(arrivals, key=lambda a: a.t)
    assert {(a.prompt_tokens, a.output_tokens) for a in arrivals} <= {(300, 40), (1024, 256)}
    fixed = rescale(rows, 5.0, 20.0, prompt_tokens=200, output_tokens=50)
    assert {(a.prompt_tokens, a.output_tokens) for a in fixed} == {(200, 50)}
    # no rate: the trace's own times, cut at the duration
    assert [a.t for a in rescale(rows, None, 10.0)] == [float(i) for i in range(10)]


def test_streaming_ttft_and_inter_token_gaps_are_measured_per_request() -> None:
    with openai_server() as (url, bodies):
        arrivals = [Arrival(0.02 * i, 7, 6) for i in range(10)]
        result = asyncio.run(run_load([url], arrivals, "fake-model"))
    assert len(result.records) == 10 and len(bodies) == 10
    assert all(len(b["prompt"]) == 7 and b["max_tokens"] == 6 and b["stream"] and b["ignore_eos"] for b in bodies)
    for r in result.records:
        assert r.error is None and r.tokens == 6  # empty-text chunks are tokens too; the usage chunk is not
        assert r.ttft_s is not None and r.ttft_s >= FIRST_TOKEN_S
        # one gap per token after the first; a single gap can read short when the one before it was read
        # late (the client's scheduling), their sum cannot
        assert len(r.itl_s) == 5 and min(r.itl_s) > 0 and sum(r.itl_s) >= 5 * TOKEN_GAP_S * 0.9
        assert r.e2e_s is not None and r.e2e_s >= r.ttft_s + sum(r.itl_s) * 0.99
    s = summarize(result, slo_ttft_s=60.0)
    assert s["completed"] == 10 and s["slo_attainment"] == 1.0 and s["output_tokens"] == 60
    # an SLO below the server's own first-token delay: nothing meets it
    assert summarize(result, slo_ttft_s=FIRST_TOKEN_S / 2)["slo_attainment"] == 0.0


def test_requests_go_to_the_engine_with_fewest_in_flight_and_failures_are_misses() -> None:
    with openai_server(first_token_s=0.3) as (slow, _), openai_server(status=503) as (failing, _):
        arrivals = [Arrival(0.01 * i, 3, 2) for i in range(20)]
        result = asyncio.run(run_load([slow, failing], arrivals, "fake-model"))
    s = summarize(result, slo_ttft_s=60.0)
    # the failing engine answers at once, so it has fewer in flight and gets most requests
    assert s["per_url"][failing] > s["per_url"][slow] > 0
    assert s["errors"] == {"http_503": s["per_url"][failing]}
    assert s["completed"] == s["per_url"][slow] and s["failed"] == s["per_url"][failing]
    assert s["slo_attainment"] == pytest.approx(s["completed"] / 20)


def test_the_sweep_warms_up_uncounted_and_finds_the_rate_a_capped_server_serves_within_the_slo() -> None:
    # two slots, each held 0.05 + 4 x 0.01 s: about 22 req/s flat out; within 0.3 s far below that
    with openai_server(slots=2) as (url, bodies):
        capacity, points = capacity_at_slo(
            url, "fake-model", slo_s=0.3, prompt=3, output=5, start_rate=4.0, duration_s=2.0, bisections=1,
            warmup_s=2.0,
        )  # fmt: skip
    counted = sum(p.summary["requests"] for p in points)
    assert len(bodies) > counted  # the warm-up's requests reached the server and no point counted them
    assert points[0].rate == 4.0 and points[0].attainment >= 0.95
    assert any(p.attainment < 0.95 for p in points) and 4.0 <= capacity < 2 * 2 / 0.09


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
    return subprocess.run([exe, "loadgen", *args], capture_output=True, text=True, timeout=120)


def test_the_cli_replays_a_bundled_trace_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    with openai_server() as (url, bodies):
        out, png = tmp_path / "s.json", tmp_path / "s.png"
        proc = _cli(
            "--url", url, "--trace", "bursty", "--rate", "20", "--duration", "2", "--max-prompt-tokens", "16",
            "--max-output-tokens", "4", "--json", str(out), "--plot", str(png),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert abs(summary["requests"] - 40) <= 1 and summary["completed"] == summary["requests"]
    assert summary["model"] == "fake-model" and summary["slo_attainment"] == 1.0
    assert all(len(b["prompt"]) <= 16 and b["max_tokens"] <= 4 for b in bodies[-summary["requests"] :])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "completed" in proc.stderr  # the closing line


def test_the_cli_says_what_is_wrong() -> None:
    bad = _cli("--url", "http://127.0.0.1:9", "--rate", "0")
    assert bad.returncode == 2 and "--rate must be > 0" in bad.stderr
    down = _cli("--url", f"http://127.0.0.1:{dead_port()}", "--rate", "5", "--duration", "1")
    assert down.returncode == 3 and "cannot list models" in down.stderr
    missing = _cli("--url", "http://127.0.0.1:9", "--trace", "/nonexistent.csv")
    assert missing.returncode == 2 and "nonexistent.csv" in missing.stderr


@pytest.mark.parametrize(("ending", "complete"), [("length", True), ("abort", False), ("drop", False)])
def test_a_stream_is_complete_only_when_the_engine_finished_it(ending: str, complete: bool) -> None:
    # the drain tests count a stream cut when an engine stopped: aborted or dropped is not an answer
    with openai_server(ending=ending) as (url, _):
        result = asyncio.run(run_load([url], [Arrival(0.0, 8, 10)], "fake-model", timeout_s=10))
    (rec,) = result.records
    assert rec.complete is complete, rec
    assert rec.finish_reason == {"length": "length", "abort": "abort", "drop": None}[ending]
    assert (rec.error is None) is (ending != "drop")
