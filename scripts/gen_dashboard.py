"""Writes charts/keda-llm-scaler/files/dashboard.json (Grafana) from the panel list below.

python scripts/gen_dashboard.py        # tests check the committed file is what this writes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "charts" / "keda-llm-scaler" / "files" / "dashboard.json"
SEL = 'namespace="$namespace",scaledobject="$scaledobject"'
HPA = 'namespace="$namespace",horizontalpodautoscaler="keda-hpa-$scaledobject"'

# (title, unit, [(expr, legend)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Composite vs desired vs ready replicas",
        "short",
        [
            (f"llm_scaler_composite{{{SEL}}}", "composite (trigger {{target}})"),
            (f"kube_horizontalpodautoscaler_status_desired_replicas{{{HPA}}}", "HPA desired"),
            (f"kube_horizontalpodautoscaler_status_current_replicas{{{HPA}}}", "HPA current"),
            (f'llm_scaler_replicas{{{SEL},state="fresh"}}', "ready, scraped"),
            (f'llm_scaler_replicas{{{SEL},state="starting"}}', "starting"),
        ],
    ),
    (
        "Composite terms (replica-equivalents)",
        "short",
        [
            (f"llm_scaler_composite_term{{{SEL}}}", "{{term}}"),
        ],
    ),
    (
        "Offered load vs planned demand vs fleet capacity",
        "reqps",
        [
            (f"llm_scaler_offered_requests_per_second{{{SEL}}}", "offered (calm window)"),
            (f"llm_scaler_planned_requests_per_second{{{SEL}}}", "planned (offered + growth + headroom)"),
            (
                f"llm_scaler_replica_capacity_requests_per_second{{{SEL}}} * on (namespace, scaledobject, target) "
                f'group_left llm_scaler_replicas{{{SEL},state="fresh"}}',
                "ready replicas x capacity ({{source}})",
            ),
        ],
    ),
    (
        "Decision reason",
        "short",
        [
            (f"llm_scaler_decision_reason{{{SEL}}} == 1", "{{reason}}"),
        ],
    ),
    (
        "Waiting and running requests",
        "short",
        [
            (f"llm_scaler_waiting_requests{{{SEL}}}", "waiting"),
            (f"llm_scaler_running_requests{{{SEL}}}", "running"),
        ],
    ),
    (
        "KV-cache usage (mean over replicas)",
        "percentunit",
        [
            (f"llm_scaler_kv_usage_ratio{{{SEL}}}", "KV usage"),
        ],
    ),
    (
        "Rejects and preemptions",
        "reqps",
        [
            (f"llm_scaler_rejects_per_second{{{SEL}}}", "rejects/s"),
            (f"llm_scaler_preemptions_per_second{{{SEL}}}", "preemptions/s"),
        ],
    ),
    (
        "TTFT and queue time p95",
        "s",
        [
            (f"llm_scaler_ttft_p95_seconds{{{SEL}}}", "TTFT p95"),
            (f"llm_scaler_queue_time_p95_seconds{{{SEL}}}", "queue time p95"),
        ],
    ),
    (
        "Replicas by scrape state",
        "short",
        [
            (f"llm_scaler_replicas{{{SEL}}}", "{{state}}"),
        ],
    ),
    (
        "Scrape errors by reason",
        "ops",
        [
            (f"sum by (reason) (rate(llm_scaler_scrape_errors_total{{{SEL}}}[5m]))", "{{reason}}"),
        ],
    ),
    (
        "Scrape duration, slot wait p95 and cycle time",
        "s",
        [
            (
                f"histogram_quantile(0.95, sum by (le) (rate(llm_scaler_scrape_duration_seconds_bucket{{{SEL}}}[5m])))",
                "replica scrape p95",
            ),
            (
                f"histogram_quantile(0.95, sum by (le) (rate(llm_scaler_scrape_wait_seconds_bucket{{{SEL}}}[5m])))",
                "wait for a scrape slot p95",
            ),
            (f"llm_scaler_scrape_cycle_seconds{{{SEL}}}", "cycle (trigger {{target}})"),
            (f"llm_scaler_snapshot_age_seconds{{{SEL}}}", "snapshot age (trigger {{target}})"),
        ],
    ),
    (
        "gRPC latency p99 by method",
        "s",
        [
            (
                "histogram_quantile(0.99, sum by (le, method) (rate(llm_scaler_rpc_duration_seconds_bucket[5m])))",
                "{{method}}",
            ),
        ],
    ),
    (
        "gRPC calls by method and code",
        "ops",
        [
            ("sum by (method, code) (rate(llm_scaler_rpc_duration_seconds_count[5m]))", "{{method}} {{code}}"),
            (
                "sum by (method) (rate(llm_scaler_rpc_no_request_total[5m]))",
                "{{method}} no request (over 1 MiB, cut off, or empty)",
            ),
        ],
    ),
]


def dashboard() -> dict[str, object]:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
                "targets": [
                    {
                        "refId": chr(ord("A") + j),
                        "expr": expr,
                        "legendFormat": legend,
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    }
                    for j, (expr, legend) in enumerate(targets)
                ],
            }
        )
    variable = {
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "refresh": 2,
        "includeAll": False,
        "multi": False,
    }
    return {
        "title": "keda-llm-scaler",
        "uid": "keda-llm-scaler",
        "description": "Composite demand served to KEDA, its terms and signals, scrape health and gRPC latency",
        "tags": ["keda", "llm", "vllm", "sglang", "autoscaling"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {
            "list": [
                {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus"},
                {
                    **variable,
                    "name": "namespace",
                    "label": "namespace",
                    "query": "label_values(llm_scaler_composite, namespace)",
                    "definition": "label_values(llm_scaler_composite, namespace)",
                },
                {
                    **variable,
                    "name": "scaledobject",
                    "label": "ScaledObject",
                    "query": 'label_values(llm_scaler_composite{namespace="$namespace"}, scaledobject)',
                    "definition": 'label_values(llm_scaler_composite{namespace="$namespace"}, scaledobject)',
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
