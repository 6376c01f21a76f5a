"""The scaler's own /metrics: names, labels, values that match what KEDA is served."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from scaler.sim.keda import KedaEmulator
from tests.payloads import EngineLoad, vllm_v1
from tests.replicas import replicas, unused_port
from tests.scalerproc import channel_to, running_scaler

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def test_exported_values_match_the_served_composite() -> None:
    with replicas(vllm_v1([EngineLoad(10, 20, 0.85)]), vllm_v1([EngineLoad(0, 5, 0.17)])) as fleet:
        dead = f"http://127.0.0.1:{unused_port()}"
        async with running_scaler() as server, channel_to(server) as ch:
            keda = KedaEmulator(ch, "llm", "serving", {"endpoints": ",".join([*(r.url for r in fleet), dead]), **FAST})
            served = (await keda.poll()).value
            m = await asyncio.to_thread(scrape, server.metrics_port)
    labels = {"namespace": "serving", "scaledobject": "llm"}

    def value(name: str, **extra: str) -> float:
        matches = [v for lab, v in m[name] if {**labels, **extra}.items() <= lab.items()]
        assert len(matches) == 1, (name, m.get(name))
        return matches[0]

    assert value("llm_scaler_composite") == served == 1 + 10 / 20 + 0.2 + 1.0  # dead replica: at target
    assert value("llm_scaler_composite_term", term="assumed") == 1.0
    assert value("llm_scaler_composite_term", term="queue") == 0.5
    assert value("llm_scaler_replicas", state="fresh") == 2
    assert value("llm_scaler_replicas", state="expired") == 1
    assert value("llm_scaler_waiting_requests") == 10 and value("llm_scaler_running_requests") == 25
    assert value("llm_scaler_kv_usage_ratio") == (0.85 + 0.17) / 2
    assert value("llm_scaler_target_up") == 1 and value("llm_scaler_active") == 1
    assert value("llm_scaler_decision_reason", reason="load") == 1
    assert value("llm_scaler_scrape_errors_total", reason="connect_error") >= 1
    assert value("llm_scaler_scrape_duration_seconds_count") >= 3
    assert any(lab.get("method") == "GetMetrics" and lab.get("code") == "OK"
               for lab, _ in m["llm_scaler_rpc_duration_seconds_count"])
    assert all(name.startswith("llm_scaler_") for name in m)
