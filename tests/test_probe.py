"""`keda-llm-scaler probe` against a real `serve` process and loopback replicas with real /metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme

from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.policy import ReplicaInput, ScoringParams, score_replica
from keda_llm_scaler.probe import (
    EXIT_CODES,
    ProbeUsageError,
    default_metrics_url,
    exit_code_for,
    explain,
    parse_metadata,
    split_address,
)
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, dead_port, replicas
from keda_llm_scaler.testing.serveproc import ServeProcess, serve

EXE = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
FAST = ("scrapeInterval=0.5", "scrapeTimeout=0.4")
# One replica with a known queue: 6 waiting over a batch of 8 running, KV at 0.34.
QUEUED = EngineLoad(waiting=6, running=8, kv=0.34)
JSON_KEYS = {
    "address",
    "security",
    "scaledObject",
    "op",
    "calls",
    "spec",
    "metrics",
    "value",
    "active",
    "stream",
    "error",
    "exit_code",
    "explanation",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "probe", *args], capture_output=True, text=True, timeout=60)


@dataclass
class Setup:
    scaler: ServeProcess
    replica: Replica

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.scaler.metrics_port}/metrics"

    def probe(self, *extra: str, name: str = "llm", endpoint: str | None = None) -> subprocess.CompletedProcess[str]:
        meta = [f"endpoints={endpoint or self.replica.url}", *FAST]
        args = [self.scaler.address, "--namespace", "serving", "--name", name, "--metrics-url", self.metrics_url]
        for pair in meta:
            args += ["--metadata", pair]
        return run(*args, *extra)

    def probe_json(self, *extra: str, **kw: Any) -> tuple[int, dict[str, Any]]:
        out = self.probe("--json", *extra, **kw)
        assert out.stderr == "", out.stderr
        return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    with replicas(vllm_v1([QUEUED])) as (replica,), serve() as scaler:
        s = Setup(scaler, replica)
        # The target's first call registers it; wait for its first scrape to be served (not for a time).
        deadline = time.monotonic() + 30
        while (out := s.probe("--json")).returncode != 0:
            assert time.monotonic() < deadline, out.stdout + out.stderr
            time.sleep(0.2)
        yield s


def expected_composite() -> float:
    """What the scaler's policy makes of the replica's /metrics: the pressure side (no offered load)."""
    return round(score_replica(ReplicaInput(waiting=6, running=8, kv_usage=0.34), ScoringParams()).demand, 3)


def test_the_expected_value_is_a_queue() -> None:
    assert expected_composite() == pytest.approx(0.34 / 0.85 + 6 / 8)  # load 0.4 + queue 0.75


# -- through the real scaler -----------------------------------------------------------------------


def test_poll_cycle_prints_the_answers_and_the_dominant_term(setup: Setup) -> None:
    out = setup.probe()
    assert out.returncode == 0, out.stdout + out.stderr
    value = expected_composite()
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["GetMetricSpec", "GetMetrics", "IsActive"]
    assert "llm_composite target 1 (targetSize 1)" in lines[1]
    assert f"llm_composite = {value:g}" in lines[2]
    assert "true" in lines[3]
    assert f"ceil({value:g} / 1) = {int(value) + 1} replicas" in out.stdout
    assert f"composite {value:g}, dominant term: queue" in out.stdout
    assert "terms: load 0.4, queue 0.75, reject 0, assumed 0, pressure 1.15" in out.stdout
    assert "waiting 6, running 8" in out.stdout and "target_up 1" in out.stdout
    assert out.stderr == ""


def test_json_output(setup: Setup) -> None:
    code, report = setup.probe_json()
    assert code == 0 and report["exit_code"] == 0 and report["error"] is None
    assert set(report) == JSON_KEYS
    assert [c["rpc"] for c in report["calls"]] == ["GetMetricSpec", "GetMetrics", "IsActive"]
    assert all(c["code"] == "OK" for c in report["calls"])
    assert report["spec"] == [{"metricName": "llm_composite", "targetSize": 1, "targetSizeFloat": 1.0}]
    value = expected_composite()
    # GetMetrics was asked for the name the spec returned, and answered for it
    assert report["metrics"] == [
        {"metricName": "llm_composite", "metricValue": 2, "metricValueFloat": value, "value": value}
    ]
    assert report["value"] == value and report["active"] is True
    # the whole trigger metadata, scalerAddress included, as KEDA forwards it
    assert report["scaledObject"] == {
        "name": "llm",
        "namespace": "serving",
        "scalerMetadata": {
            "endpoints": setup.replica.url,
            "scrapeInterval": "0.5",
            "scrapeTimeout": "0.4",
            "scalerAddress": setup.scaler.address,
        },
    }
    e = report["explanation"]
    assert e["available"] is True and e["url"] == setup.metrics_url
    assert e["composite"] == value and e["dominant"] == "queue"
    assert e["terms"]["load"] == pytest.approx(0.4) and e["terms"]["queue"] == pytest.approx(0.75)
    assert e["terms"]["pressure"] == pytest.approx(value)
    assert e["replicas"]["fresh"] == 1 and e["target_up"] == 1.0
    assert e["waiting_requests"] == 6 and e["running_requests"] == 8
    assert e["deferred_requests"] is None  # this engine does not split its waiting: unknown, not 0
    assert (e["asleep_replicas"], e["wake_replicas"]) == (0, 0)
    # the series are this metadata's target's: the id the scaler gives it, computed from the same metadata
    meta = report["scaledObject"]["scalerMetadata"]
    assert e["target"] == parse_trigger("serving", "llm", meta).target_id and e["target_matches_metadata"]
    assert {"capacity", "offered_requests_per_second", "planned_requests_per_second"} <= set(e)


@pytest.mark.parametrize(
    ("op", "rpcs"),
    [
        ("spec", ["GetMetricSpec"]),
        ("metrics", ["GetMetricSpec", "GetMetrics"]),
        ("active", ["IsActive"]),
    ],
)
def test_single_ops(setup: Setup, op: str, rpcs: list[str]) -> None:
    code, report = setup.probe_json("--op", op)
    assert code == 0, report
    assert [c["rpc"] for c in report["calls"]] == rpcs
    assert (report["value"] == expected_composite()) == (op == "metrics")
    assert (report["active"] is True) == (op == "active")
    assert report["explanation"]["dominant"] == "queue"


def test_stream_reads_then_cancels_cleanly(setup: Setup) -> None:
    before = setup.scaler.log().count('"stream_closed"')
    code, report = setup.probe_json("--op", "stream")
    assert code == 0, report
    assert report["stream"] == {"received": [True], "ended": "messages"} and report["active"] is True
    # For a duration: the current state once, then nothing while it stays active (no `true` spam).
    code, report = setup.probe_json("--op", "stream", "--stream-for", "1.5")
    assert code == 0, report
    assert report["stream"] == {"received": [True], "ended": "duration"}
    human = setup.probe("--op", "stream")
    assert human.returncode == 0 and "StreamIsActive  true; cancelled by the probe" in human.stdout
    # Each cancel reached the scaler, which released the stream.
    deadline = time.monotonic() + 10
    while setup.scaler.log().count('"stream_closed"') < before + 3:
        assert time.monotonic() < deadline, setup.scaler.log()[-2000:]
        time.sleep(0.1)


def test_bad_metadata_prints_the_scalers_message_and_exits_2(setup: Setup) -> None:
    out = setup.probe("--metadata", "targetValue=lots")
    assert out.returncode == 2
    assert "GetMetricSpec: INVALID_ARGUMENT: metadata key 'targetValue': 'lots' is not a number" in out.stderr
    assert "INVALID_ARGUMENT: metadata key 'targetValue'" in out.stdout
    code, report = setup.probe_json("--metadata", "engine=tgi", "--op", "active")
    assert code == 2 and report["exit_code"] == 2
    assert report["error"]["rpc"] == "IsActive" and report["error"]["code"] == "INVALID_ARGUMENT"
    assert "metadata key 'engine'" in report["error"]["message"]
    assert report["active"] is None and report["explanation"]["available"] is False


def test_no_fresh_data_is_unavailable_exit_3(setup: Setup) -> None:
    code, report = setup.probe_json(name="unreachable-fleet", endpoint=f"http://127.0.0.1:{dead_port()}")
    assert code == 3, report
    assert report["error"]["rpc"] == "GetMetrics" and report["error"]["code"] == "UNAVAILABLE"
    assert report["error"]["connected"] is True
    assert [c["code"] for c in report["calls"]] == ["OK", "UNAVAILABLE"]  # no IsActive after the failure
    e = report["explanation"]
    assert e["available"] is True and e["target_up"] == 0.0 and e["composite"] is None


def test_metrics_endpoint_unreachable_is_not_an_error(setup: Setup) -> None:
    args = ["--metrics-url", f"http://127.0.0.1:{dead_port()}/metrics"]
    code, report = setup.probe_json(*args)
    assert code == 0 and report["value"] == expected_composite()
    assert report["explanation"]["available"] is False and "ConnectError" in report["explanation"]["reason"]
    human = setup.probe(*args)
    assert human.returncode == 0 and "explanation unavailable from http://127.0.0.1:" in human.stdout


def test_nothing_listening_exits_4() -> None:
    address = f"127.0.0.1:{dead_port()}"
    out = run(address, "--timeout", "2", "--metrics-url", f"http://127.0.0.1:{dead_port()}/metrics")
    assert out.returncode == 4, out.stdout + out.stderr
    assert "GetMetricSpec: UNAVAILABLE" in out.stderr and "Connection refused" in out.stderr
    assert "explanation unavailable: skipped: no answer from the scaler" in out.stdout
    report = json.loads(run(address, "--timeout", "2", "--json", "--op", "stream").stdout)
    assert report["exit_code"] == 4 and report["error"]["connected"] is False


def test_a_server_that_never_answers_exits_4_at_the_deadline() -> None:
    with socket.socket() as listening:  # accepts in the kernel's backlog, never speaks HTTP/2
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        out = run(f"127.0.0.1:{port}", "--timeout", "0.5", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 4 and report["error"]["code"] == "DEADLINE_EXCEEDED"
    assert "no connection to" in report["error"]["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["127.0.0.1:9", "--metadata", "endpoints"], "--metadata 'endpoints': expected KEY=VALUE"),
        (["127.0.0.1:9", "-m", "=x"], "expected KEY=VALUE"),
        (["127.0.0.1:9", "-m", "a=1", "-m", "a=2"], "given twice"),
        (["::1:9090"], "brackets"),
        (["127.0.0.1:99999"], "1-65535"),
        (["127.0.0.1:9", "--timeout", "0"], "--timeout 0"),
        (["127.0.0.1:9", "--stream-for", "1"], "go with --op stream"),
        (["127.0.0.1:9", "--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
        (["127.0.0.1:9", "--tls-ca", "/nonexistent.pem"], "--tls-ca /nonexistent.pem: No such file"),
        (["127.0.0.1:9", "--tls-server-name", "x"], "needs TLS"),
    ],
)
def test_bad_local_usage_is_one_line_exit_2(args: list[str], message: str) -> None:
    out = run(*args)
    assert out.returncode == 2
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_help_documents_the_exit_codes() -> None:
    out = run("--help")
    assert out.returncode == 0
    assert EXIT_CODES in out.stdout
    for line in ("0  every call", "1  any other", "2  INVALID_ARGUMENT", "3  UNAVAILABLE", "4  no answer"):
        assert line in out.stdout


# -- TLS -------------------------------------------------------------------------------------------

HOST = "llm-scaler.keda.svc"


def test_mutual_tls(tmp_path: Path) -> None:
    ca, stranger = trustme.CA(), trustme.CA()
    files = {
        "ca": ca.cert_pem,
        "server_cert": (server := ca.issue_cert(HOST)).cert_chain_pems[0],
        "server_key": server.private_key_pem,
        "client_cert": (client := ca.issue_cert("keda-operator")).cert_chain_pems[0],
        "client_key": client.private_key_pem,
        "stranger_ca": stranger.cert_pem,
    }
    paths = {}
    for name, blob in files.items():
        blob.write_to_path(str(path := tmp_path / f"{name}.pem"))
        paths[name] = str(path)
    env = {
        "LLM_SCALER_TLS_CERT": paths["server_cert"],
        "LLM_SCALER_TLS_KEY": paths["server_key"],
        "LLM_SCALER_TLS_CLIENT_CA": paths["ca"],
        "LLM_SCALER_SCRAPE_WORKERS": "0",
    }
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client.private_key_pem.bytes(),
        certificate_chain=client.cert_chain_pems[0].bytes(),
    )
    with replicas(vllm_v1([QUEUED])) as (replica,), serve(env=env, creds=creds, server_name=HOST) as scaler:
        base = [scaler.address, "-m", f"endpoints={replica.url}", *("-m", FAST[0], "-m", FAST[1]), "--json"]
        base += ["--metrics-url", f"http://127.0.0.1:{scaler.metrics_port}/metrics"]
        client_cert = ["--tls-cert", paths["client_cert"], "--tls-key", paths["client_key"]]
        mtls = ["--tls-ca", paths["ca"], *client_cert, "--tls-server-name", HOST]
        deadline = time.monotonic() + 30
        while (out := run(*base, *mtls)).returncode != 0:  # until the first scrape is served
            assert time.monotonic() < deadline, out.stdout + out.stderr
            time.sleep(0.2)
        report = json.loads(out.stdout)
        assert report["security"] == "mtls" and report["value"] == expected_composite()
        assert report["explanation"]["dominant"] == "queue"
        # no client certificate, or a CA that does not sign the server's: the handshake fails, exit 4
        for args in (
            ["--tls-ca", paths["ca"], "--tls-server-name", HOST],
            ["--tls-ca", paths["stranger_ca"], *client_cert, "--tls-server-name", HOST],
        ):
            refused = run(*base, *args)
            assert refused.returncode == 4, refused.stdout
            assert json.loads(refused.stdout)["error"]["connected"] is False
        plaintext = run(*base, "--timeout", "1")
        assert plaintext.returncode == 4


# -- pieces ----------------------------------------------------------------------------------------


def test_parse_metadata_keeps_everything_after_the_first_equals() -> None:
    assert parse_metadata(["endpoints=http://a:1,http://b:2", "model=a=b", "empty="]) == {
        "endpoints": "http://a:1,http://b:2",
        "model": "a=b",
        "empty": "",
    }
    assert parse_metadata(["a=1", "a=1"]) == {"a": "1"}
    with pytest.raises(ProbeUsageError):
        parse_metadata(["novalue"])


@pytest.mark.parametrize(
    ("address", "host", "port", "metrics"),
    [
        ("llm-scaler.keda:9090", "llm-scaler.keda", 9090, "http://llm-scaler.keda:8080/metrics"),
        ("localhost", "localhost", 9090, "http://localhost:8080/metrics"),
        ("[::1]:6000", "::1", 6000, "http://[::1]:8080/metrics"),
        ("dns:///10.0.0.7:6000", "10.0.0.7", 6000, "http://10.0.0.7:8080/metrics"),
    ],
)
def test_address_and_default_metrics_url(address: str, host: str, port: int, metrics: str) -> None:
    assert split_address(address) == (host, port)
    assert default_metrics_url(address) == metrics


def test_exit_codes_per_status() -> None:
    s = grpc.StatusCode
    assert exit_code_for(s.OK) == 0
    assert exit_code_for(s.INVALID_ARGUMENT) == 2
    assert exit_code_for(s.UNAVAILABLE) == 3
    assert exit_code_for(s.UNAVAILABLE, connected=False) == 4
    assert exit_code_for(s.DEADLINE_EXCEEDED) == 4
    for other in (s.NOT_FOUND, s.RESOURCE_EXHAUSTED, s.INTERNAL, s.UNIMPLEMENTED, s.CANCELLED):
        assert exit_code_for(other) == 1


def _series(target: str, composite: float, dominant: str, namespace: str = "serving") -> str:
    labels = f'namespace="{namespace}",scaledobject="llm",target="{target}"'
    return "\n".join(
        [
            f"llm_scaler_composite{{{labels}}} {composite}",
            f'llm_scaler_composite_term{{{labels},term="rate"}} {composite}',
            f'llm_scaler_decision_reason{{{labels},reason="{dominant}"}} 1.0',
            f'llm_scaler_replica_capacity_requests_per_second{{{labels},source="learned"}} 12.5',
            f"llm_scaler_offered_requests_per_second{{{labels}}} 30.0",
            f"llm_scaler_planned_requests_per_second{{{labels}}} 33.75",
            f'llm_scaler_replicas{{{labels},state="fresh"}} 3.0',
            f"llm_scaler_target_up{{{labels}}} 1.0",
        ]
    )


def test_explain_picks_this_metadatas_target() -> None:
    text = "\n".join(
        [_series("aaaaaaaa", 3.0, "rate"), _series("bbbbbbbb", 1.5, "load"), _series("aaaaaaaa", 9, "queue", "x")]
    )
    e = explain(text, "serving", "llm", "bbbbbbbb")
    assert e["target"] == "bbbbbbbb" and e["composite"] == 1.5 and e["dominant"] == "load"
    e = explain(text, "serving", "llm", "aaaaaaaa")
    assert e["composite"] == 3.0 and e["dominant"] == "rate" and e["terms"] == {"rate": 3.0}
    assert e["capacity"] == {"requests_per_second": 12.5, "source": "learned"}
    assert e["offered_requests_per_second"] == 30.0 and e["planned_requests_per_second"] == 33.75
    assert e["replicas"] == {"fresh": 3}
    ambiguous = explain(text, "serving", "llm", "cccccccc")
    assert ambiguous["available"] is False and "2 targets" in ambiguous["reason"]
    # one target for the ScaledObject: it is the one, whatever the local parse made of the metadata
    assert explain(text, "x", "llm", None)["composite"] == 9
    assert explain(text, "serving", "other", None)["available"] is False
    assert explain("llm_scaler_composite{", "serving", "llm", None)["available"] is False
