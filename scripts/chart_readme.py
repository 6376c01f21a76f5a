"""Writes charts/keda-llm-scaler/README.md: the install guide plus a values table generated from the
`# --` comments in values.yaml (the helm-docs convention, without needing helm-docs).

    python scripts/chart_readme.py         # tests check the committed README is what this writes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "keda-llm-scaler"

HEADER = """# keda-llm-scaler Helm chart

Deploys [keda-llm-scaler](../../README.md), a KEDA external scaler for vLLM and SGLang fleets, next to
KEDA: a Deployment (non-root, read-only root filesystem, no capabilities, gRPC health probes), a
ClusterIP Service (`grpc`, `metrics`), a ServiceAccount with read-only discovery RBAC (namespaced by
default), and optionally a PodDisruptionBudget, a NetworkPolicy, a ServiceMonitor, a PrometheusRule with
the alerts and a Grafana dashboard ConfigMap. Example ScaledObjects and a TriggerAuthentication for mTLS
are in `examples/`.

```sh
helm install keda-llm-scaler charts/keda-llm-scaler --namespace keda \\
  --set rbac.namespaces='{serving}'      # the namespaces of your ScaledObjects
```

TLS from a Secret (for example a cert-manager Certificate with `tls.crt`, `tls.key`, `ca.crt`):
`--set tls.enabled=true --set tls.secretName=keda-llm-scaler-tls [--set tls.requireClientCert=true]`,
then `enableTLS: "true"` in the trigger and `examples/triggerauthentication-mtls.yaml`.

## Values

This table is generated from the `# --` comments in `values.yaml` by `scripts/chart_readme.py`.

| key | default | description |
|---|---|---|
"""


def _comments(lines: list[str]) -> dict[str, str]:
    """Map dotted keys to the `# --` comment block right above them."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    collecting = False
    for raw in lines:
        stripped = raw.strip()
        if stripped.startswith("# --"):
            pending, collecting = [stripped[4:].strip()], True
            continue
        if stripped.startswith("#") and collecting:
            pending.append(stripped[1:].strip())
            continue
        if not stripped or stripped.startswith("-"):
            continue
        indent = len(raw) - len(raw.lstrip())
        key = stripped.split(":", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending:
            out[".".join(k for _, k in stack)] = " ".join(pending)
        pending, collecting = [], False
    return out


def _leaves(values: Any, prefix: str, documented: dict[str, str]) -> list[tuple[str, Any]]:
    if prefix in documented or not isinstance(values, dict) or not values:
        return [(prefix, values)]
    rows = []
    for k, v in values.items():
        rows.extend(_leaves(v, f"{prefix}.{k}" if prefix else k, documented))
    return rows


def render() -> str:
    text = (CHART / "values.yaml").read_text()
    documented = _comments(text.splitlines())
    rows = _leaves(yaml.safe_load(text), "", documented)
    missing = [k for k, _ in rows if k not in documented]
    if missing:
        raise SystemExit(f"values.yaml keys without a '# --' comment: {missing}")
    table = "".join(f"| `{k}` | `{json.dumps(v)}` | {documented[k]} |\n" for k, v in rows)
    return HEADER + table


if __name__ == "__main__":
    (CHART / "README.md").write_text(render())
    print(f"wrote {CHART / 'README.md'}", file=sys.stderr)
