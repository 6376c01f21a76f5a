"""The Helm chart, rendered by Helm's own engine (helm-python-sdk), every object validated against the
Kubernetes schemas (kubernetes-validate), the examples against KEDA's CRD schemas and the scaler's own
metadata parser."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from keda_llm_scaler import __version__
from keda_llm_scaler.config import address_policy, settings_from
from keda_llm_scaler.metadata import parse_trigger

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "keda-llm-scaler"
CRDS = Path(__file__).parent / "fixtures" / "crds"
K8S_VERSION = "1.30.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # Prometheus Operator CRDs: not in kubernetes-validate

ALL_ON = {
    "replicaCount": 2,
    "tls": {"enabled": True, "secretName": "scaler-tls", "requireClientCert": True},
    "rbac": {"namespaces": ["serving", "batch"]},
    "victimRanking": {"namespaces": ["serving"]},
    "networkPolicy": {"enabled": True},
    "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "extraEnv": [{"name": "LLM_SCALER_WARMUP_WAIT", "value": "0.2"}],
    "podAnnotations": {"example.com/team": "inference"},
}


def render(values: dict[str, Any] | None = None, release: str = "keda-llm-scaler") -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(str(CHART))
    try:
        out = chart.render(values or {}, name=release, namespace="keda", is_install=True)
    finally:
        chart.close()
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_is_clean() -> None:
    for values in ({}, ALL_ON, {"rbac": {"clusterWide": True}}):
        report = helm_python.lint(str(CHART), values, strict=True, kube_version=f"v{K8S_VERSION}")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "values",
    [{}, ALL_ON, {"rbac": {"clusterWide": True}, "serviceAccount": {"name": "x"}}],
    ids=["defaults", "everything-on", "cluster-wide"],
)
def test_every_rendered_object_validates(values: dict[str, Any]) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_defaults_render_the_minimum() -> None:
    kinds = sorted(d["kind"] for d in render())
    # discovery's read-only Role, and the learned state's ConfigMap with the Role that may update it alone
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    kinds = sorted(d["kind"] for d in render({"state": {"enabled": False}}))
    assert kinds == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]


def test_everything_on_renders_every_piece() -> None:
    docs = render(ALL_ON)
    kinds = {d["kind"] for d in docs}
    assert {"PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds
    # read access where ScaledObjects are served, and the victim-ranking writer where it is enabled
    roles = sorted(
        r["metadata"]["namespace"] for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-state")
    )
    assert roles == ["batch", "serving", "serving"]
    (cm,) = [c for c in by_kind(docs, "ConfigMap") if not c["metadata"]["name"].endswith("-state")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert '"title": "keda-llm-scaler"' in cm["data"]["keda-llm-scaler.json"]


def test_deployment_is_hardened_and_probed() -> None:
    dep = by_kind(render(), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and isinstance(pod["securityContext"]["runAsUser"], int)
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["grpc"] == {"port": 9090, "service": "liveness"}
    assert c["readinessProbe"]["grpc"] == {"port": 9090, "service": "readiness"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 9090, "metrics": 8080}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["LLM_SCALER_GRPC_PORT"] == "9090" and env["LLM_SCALER_METRICS_PORT"] == "8080"
    assert pod["terminationGracePeriodSeconds"] > float(env["LLM_SCALER_SHUTDOWN_GRACE"])
    assert c["image"] == f"ghcr.io/keda-llm-scaler/keda-llm-scaler:{__version__}"
    assert c["args"] == ["serve"]
    svc = by_kind(render(), "Service")[0]
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"grpc": "grpc", "metrics": "metrics"}
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_the_chart_refuses_loopback_and_its_network_values_parse_as_serve_reads_them() -> None:
    def env_of(values: dict[str, Any] | None = None) -> dict[str, str]:
        (c,) = by_kind(render(values), "Deployment")[0]["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in c["env"] if "value" in e}

    env = env_of()
    assert env["LLM_SCALER_REFUSE_NETWORKS"] == "loopback" and env["LLM_SCALER_ALLOW_NETWORKS"] == ""
    env = env_of({"scaler": {"refuseNetworks": ["loopback", "10.96.0.0/12"], "allowNetworks": ["private"]}})
    settings = settings_from(argparse.Namespace(), {k: v for k, v in env.items() if "NETWORKS" in k})
    policy = address_policy(settings)
    assert "10.96.0.0/12" in {str(n) for n in policy.refuse} and policy.allow


def test_tls_from_a_secret() -> None:
    dep = by_kind(render(ALL_ON), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["LLM_SCALER_TLS_CERT"].endswith("tls.crt") and env["LLM_SCALER_TLS_CLIENT_CA"].endswith("ca.crt")
    assert {"name": "tls", "secret": {"secretName": "scaler-tls"}} in pod["volumes"]
    with pytest.raises(helm_python.HelmError, match=r"tls.secretName is required"):
        render({"tls": {"enabled": True}})


def test_rbac_is_read_only_and_least_privilege() -> None:
    for values in ({}, {"rbac": {"clusterWide": True}}):
        docs = render(values)
        roles = by_kind(docs, "Role") + by_kind(docs, "ClusterRole")
        assert roles
        for role in roles:
            for rule in role["rules"]:
                if role["metadata"]["name"].endswith("-state"):
                    continue  # test_learned_state_is_one_configmap_the_scaler_may_update_and_nothing_else
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
                assert "secrets" not in rule["resources"] and "*" not in rule["resources"]
    assert not by_kind(render(), "ClusterRole")  # namespaced unless asked
    assert by_kind(render({"rbac": {"clusterWide": True}}), "ClusterRoleBinding")
    assert not by_kind(render({"rbac": {"create": False}}), "Role")


def test_learned_state_is_one_configmap_the_scaler_may_update_and_nothing_else() -> None:
    docs = render()
    (cm,) = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-state")]
    assert "data" not in cm, "the chart creates it empty: an upgrade must not reset what the scaler wrote"
    assert cm["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-state")]
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [cm["metadata"]["name"]],
            "verbs": ["get", "update"],
        }
    ]
    (dep,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLM_SCALER_STATE_CONFIGMAP"] == f"{cm['metadata']['namespace']}/{cm['metadata']['name']}"
    # as `serve` reads it
    assert settings_from(argparse.Namespace(), env).state_configmap == env["LLM_SCALER_STATE_CONFIGMAP"]
    off = render({"state": {"enabled": False}})
    assert not [r for r in by_kind(off, "Role") if r["metadata"]["name"].endswith("-state")]
    (dep,) = by_kind(off, "Deployment")
    assert "LLM_SCALER_STATE_CONFIGMAP" not in {
        e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_victim_ranking_grants_patch_on_pods_only_where_it_is_enabled() -> None:
    docs = render({"victimRanking": {"namespaces": ["serving"]}, "rbac": {"namespaces": ["serving", "batch"]}})
    writers = [r for r in by_kind(docs, "Role") if any("patch" in rule["verbs"] for rule in r["rules"])]
    assert [r["metadata"]["namespace"] for r in writers] == ["serving"]  # not batch, though it is read
    assert writers[0]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == writers[0]["metadata"]["name"]]
    assert [b["metadata"]["namespace"] for b in bindings] == ["serving"]
    env = {
        e["name"]: e.get("value")
        for e in by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["LLM_SCALER_VICTIM_RANKING"] == "serving"
    assert env["LLM_SCALER_VICTIM_RANKING_INTERVAL"] == "10" and env["LLM_SCALER_VICTIM_RANKING_BURST"] == "16"
    once = render({"victimRanking": {"namespaces": ["serving", "serving"]}})  # a repeated entry: one grant
    assert len([r for r in by_kind(once, "Role") if r["metadata"]["name"].endswith("-victim-ranking")]) == 1
    with pytest.raises(helm_python.HelmError, match=r"victimRanking.namespaces: list the namespaces"):
        render({"victimRanking": {"namespaces": ["*"]}})  # would render `namespace: *` (a YAML alias)
    off = render()  # the default: no writes anywhere, and no flag
    assert not [r for r in by_kind(off, "Role") if any("patch" in rule["verbs"] for rule in r["rules"])]
    container = by_kind(off, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "LLM_SCALER_VICTIM_RANKING" not in {e["name"] for e in container["env"]}


def test_values_are_documented_and_the_readme_is_generated() -> None:
    import runpy

    module = runpy.run_path(str(ROOT / "scripts" / "chart_readme.py"))
    assert (CHART / "README.md").read_text() == module["render"](), "run: python scripts/chart_readme.py"


# -- examples -------------------------------------------------------------------------------------


def _crd_schema(file: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / file).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    return schema


SCHEMAS = {"ScaledObject": "keda.sh_scaledobjects.yaml", "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KEDA_QUEUE_TRIGGERS = {"redis", "rabbitmq", "kafka", "aws-sqs-queue", "prometheus"}  # KEDA's own scalers


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_keda_crds_and_our_parser(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] not in SCHEMAS:  # the drain examples' Deployments and Services
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # (and tests/test_examples_drain.py)
            continue
        jsonschema.validate(doc, _crd_schema(SCHEMAS[doc["kind"]]))
        if doc["kind"] != "ScaledObject":
            continue
        for trigger in doc["spec"]["triggers"]:
            if trigger["type"] in KEDA_QUEUE_TRIGGERS:  # the queue that wakes a batch fleet from zero
                continue
            assert trigger["type"] in ("external", "external-push")
            meta = trigger["metadata"]
            assert meta["scalerAddress"] == "keda-llm-scaler.keda.svc.cluster.local:9090"
            parse_trigger(doc["metadata"]["namespace"], doc["metadata"]["name"], meta)  # valid for the scaler
        behavior = doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300  # minute-long cold starts
        assert doc["spec"]["fallback"]["replicas"] >= 1


def test_a_broken_example_is_caught() -> None:
    doc = yaml.safe_load((CHART / "examples" / "scaledobject-vllm-external.yaml").read_text())
    doc["spec"]["fallback"] = {"failureThreshold": "three"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _crd_schema(SCHEMAS["ScaledObject"]))


def test_the_schema_check_catches_a_broken_manifest() -> None:
    dep = by_kind(render(), "Deployment")[0]
    dep["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    dep = by_kind(render(), "Deployment")[0]
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpcc"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


def test_the_chart_deploys_the_version_the_package_is() -> None:
    # One version source (pyproject.toml -> package metadata); the chart's appVersion must follow it.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__ != "0+unknown"


def test_two_releases_shard_scaled_objects_without_colliding() -> None:
    # the scale-out path past one pod (docs/performance.md): a release per group of namespaces, each
    # ScaledObject's scalerAddress naming its release's Service
    shards = {
        "llm-scaler-a": {"rbac": {"namespaces": ["team-a"]}, "scaler": {"scrapeWorkers": "2"}},
        "llm-scaler-b": {"rbac": {"namespaces": ["team-b", "team-c"]}},
    }
    rendered = {release: render(values, release) for release, values in shards.items()}
    names = [
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        for docs in rendered.values()
        for d in docs
    ]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for release, docs in rendered.items():
        (svc,) = by_kind(docs, "Service")
        assert svc["metadata"]["name"].startswith(release)
        bound = {
            d["metadata"]["namespace"]
            for d in by_kind(docs, "RoleBinding")
            if not d["metadata"]["name"].endswith("-state")
        }
        assert bound == set(shards[release]["rbac"]["namespaces"])
        (state,) = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-state")]
        assert state["metadata"]["name"].startswith(release)  # each release keeps its own
    (deploy,) = by_kind(rendered["llm-scaler-a"], "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLM_SCALER_SCRAPE_WORKERS"] == "2"


SHADOW = {
    "shadow": {
        "enabled": True,
        "workloads": [
            {
                "name": "llama-70b",
                "namespace": "serving",
                "metadata": {"service": "vllm-llama-70b", "ttftSloSeconds": 2},  # a number, as YAML users write it
                "scaleTargetRef": {"kind": "Deployment", "name": "vllm-llama-70b"},
                "maxReplicaCount": 16,
            },
            {"name": "chat", "metadata": {"service": "vllm-chat"}},  # in the release's namespace
        ],
    },
    "networkPolicy": {"enabled": True},
}


def test_shadow_mode_runs_shadow_on_a_file_it_accepts_and_opens_nothing_that_acts(tmp_path: Path) -> None:
    from keda_llm_scaler.shadow import check_shadow_settings, load_shadow_config

    docs = render(SHADOW)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][:2] == ["shadow", "--config"]
    # the file the pod reads, from the ConfigMap it mounts, as shadow parses it
    (cm,) = by_kind(docs, "ConfigMap")
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "shadow"]
    assert c["args"][2] == f"{mount['mountPath']}/shadow.yaml"
    assert {"name": "shadow", "configMap": {"name": cm["metadata"]["name"]}} in pod["volumes"]
    (tmp_path / "shadow.yaml").write_text(cm["data"]["shadow.yaml"])
    workloads = load_shadow_config(tmp_path / "shadow.yaml")
    assert [(w.namespace, w.name) for w in workloads] == [("serving", "llama-70b"), ("keda", "chat")]
    assert workloads[0].metadata["ttftSloSeconds"] == "2" and workloads[0].max_replicas == 16
    # shadow's refusals (--state-configmap, --victim-ranking) never trip on the chart's own settings
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert "LLM_SCALER_STATE_CONFIGMAP" not in env
    check_shadow_settings(settings_from(argparse.Namespace(), env))
    # no gRPC anywhere: no port, no gRPC probe, no Service port, no ingress rule for KEDA
    assert [p["name"] for p in c["ports"]] == ["metrics"]
    assert c["readinessProbe"]["httpGet"] == {"port": "metrics", "path": "/metrics"}
    assert c["livenessProbe"]["httpGet"] == {"port": "metrics", "path": "/metrics"}
    (svc,) = by_kind(docs, "Service")
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    (netpol,) = by_kind(docs, "NetworkPolicy")
    assert [p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]] == ["metrics"]
    # read-only access where the workloads are, and no state Role (shadow writes nothing to the cluster)
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["keda", "serving"]
    for role in roles:
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}
    # a change to the workloads restarts the pod (it reads the file once)
    other = copy.deepcopy(SHADOW)
    other["shadow"]["workloads"][1]["metadata"]["service"] = "vllm-chat-2"
    (dep2,) = by_kind(render(other), "Deployment")
    key = "checksum/shadow-config"
    before, after = (d["spec"]["template"]["metadata"]["annotations"][key] for d in (dep, dep2))
    assert before != after
    report = helm_python.lint(str(CHART), SHADOW, strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == []
    # serve keeps what shadow drops: KEDA's ingress rule, the state, the rules
    serving = render({"networkPolicy": {"enabled": True}, "prometheusRule": {"enabled": True}})
    (netpol,) = by_kind(serving, "NetworkPolicy")
    assert [p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]] == ["grpc", "metrics"]
    assert by_kind(serving, "PrometheusRule")
    assert not by_kind(render({**SHADOW, "prometheusRule": {"enabled": True}}), "PrometheusRule")


def test_shadow_mode_reads_where_its_workloads_are() -> None:
    def role_namespaces(values: dict[str, Any]) -> list[str]:
        return sorted(r["metadata"]["namespace"] for r in by_kind(render({**SHADOW, **values}), "Role"))

    # rbac.namespaces adds (a `service: ns/name` elsewhere), never replaces the workloads' own
    assert role_namespaces({"rbac": {"namespaces": ["models", "serving"]}}) == ["keda", "models", "serving"]
    # a namespace YAML would read as a number or a boolean stays a string
    odd = copy.deepcopy(SHADOW)
    odd["shadow"]["workloads"][1]["namespace"] = "on"
    odd["shadow"]["workloads"][0]["namespace"] = "123"
    docs = render(odd)
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["123", "on"]
    wide = render({**SHADOW, "rbac": {"clusterWide": True}})
    assert by_kind(wide, "ClusterRole") and not by_kind(wide, "Role")
    chart = helm_python.Chart.load(str(CHART))
    try:
        notes = chart.render(SHADOW, name="shadow", namespace="keda", is_install=True)
    finally:
        chart.close()
    text = next(t for path, t in notes.items() if path.endswith("NOTES.txt"))
    assert "shadow mode" in text and "namespace(s): serving,keda." in text and "scalerAddress" not in text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shadow": {"enabled": True, "workloads": []}}, r"shadow.workloads: list the workloads"),
        ({"victimRanking": {"namespaces": ["serving"]}}, r"victim ranking writes pod-deletion-cost"),
        ({"replicaCount": 2}, r"replicaCount above 1"),
        ({"shadow": {"enabled": True, "workloads": [{"name": "x", "namespace": "*"}]}}, r"namespace \"\*\" of"),
        ({"shadow": {"enabled": True, "workloads": ["x"]}}, r"each entry is a mapping"),
        ({"shadow": {"enabled": True, "workloads": [{"name": "x", "namespace": "a" * 64}]}}, r"not a namespace name"),
        ({"shadow": {"enabled": True, "workloads": [{"name": 42}]}}, r"name 42 is not a string"),
    ],
    ids=["no-workloads", "victim-ranking", "two-pods", "bad-namespace", "not-a-mapping", "too-long", "name-number"],
)
def test_shadow_mode_refuses_what_would_act_or_scrape_twice(change: dict[str, Any], message: str) -> None:
    values = copy.deepcopy(SHADOW)
    for key, value in change.items():
        values[key] = {**values.get(key, {}), **value} if isinstance(value, dict) else value
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)
