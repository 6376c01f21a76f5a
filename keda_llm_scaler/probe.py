"""``keda-llm-scaler probe``: call a running scaler the way KEDA's operator does, and explain the answer.

The calls are KEDA's (KEDA-EXTERNAL-SCALER.md §2-§5): one ScaledObjectRef (the ScaledObject's name and
namespace, the whole trigger metadata with ``scalerAddress`` in it) on every RPC; GetMetricSpec, then
for each spec GetMetrics with the metric name exactly as the spec returned it, then IsActive; the value
read as KEDA reads it (``metricValueFloat`` when > 0, else ``metricValue``). The gRPC answer holds only
the number, so the explanation (dominant term, terms, capacity, offered and planned load) is read from
the scaler's own Prometheus endpoint, from the series of this ScaledObject's target.

Exit codes are per gRPC status class (``EXIT_CODES``); the first failed call ends the exchange, as it
ends KEDA's (KEDA then rebuilds the scaler and retries once; the probe reports the first answer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import httpx

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.config import Settings
from keda_llm_scaler.errors import ScalerError
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.promtext import SampleNames, TextFormatError, parse_samples

__all__ = [
    "EXIT_CODES",
    "OPS",
    "ProbeUsageError",
    "add_probe_arguments",
    "default_metrics_url",
    "exit_code_for",
    "explain",
    "parse_metadata",
    "probe_main",
    "split_address",
]

EXIT_OK: Final = 0
EXIT_OTHER: Final = 1
EXIT_INVALID: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_NO_ANSWER: Final = 4

EXIT_CODES: Final = f"""\
exit codes (from the gRPC status of the first call that failed; no call is made after it):
  {EXIT_OK}  every call answered OK
  {EXIT_OTHER}  any other status: NOT_FOUND, RESOURCE_EXHAUSTED, INTERNAL, UNIMPLEMENTED, ...
  {EXIT_INVALID}  INVALID_ARGUMENT: the scaler refused the metadata (its message names the key);
     also bad local usage (a --metadata without '=', an unreadable --tls-* file, ...)
  {EXIT_UNAVAILABLE}  UNAVAILABLE from the scaler: no fresh data for this fleet (KEDA counts it towards fallback)
  {EXIT_NO_ANSWER}  no answer: nothing listening, TLS handshake refused, connection lost, or DEADLINE_EXCEEDED
     (no answer within --timeout)
The explanation from the scaler's /metrics is best effort: when it cannot be read the gRPC answers are
still printed and the exit code is theirs.
"""

OPS: Final = ("poll", "spec", "metrics", "active", "stream")
_DEFAULTS: Final = Settings()
DEFAULT_GRPC_PORT: Final = _DEFAULTS.grpc_port
DEFAULT_METRICS_PORT: Final = _DEFAULTS.metrics_port
# KEDA's dial (external_scaler.go): grpc.NewClient(scalerAddress, round_robin, creds); no keepalive, no retries.
_SERVICE_CONFIG: Final = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
TERMS: Final = ("load", "queue", "reject", "assumed", "pressure", "rate", "slo_floor")
_SERIES: Final = SampleNames(
    f"llm_scaler_{n}"
    for n in (
        "composite",
        "composite_term",
        "decision_reason",
        "replica_capacity_requests_per_second",
        "offered_requests_per_second",
        "planned_requests_per_second",
        "replicas",
        "target_up",
        "waiting_requests",
        "deferred_requests",
        "asleep_replicas",
        "wake_replicas",
        "running_requests",
        "kv_usage_ratio",
    )
)


class ProbeUsageError(Exception):
    """Bad local usage: one line on stderr, exit 2."""


# -- arguments -------------------------------------------------------------------------------------


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Call a running scaler exactly as KEDA's operator does (GetMetricSpec, GetMetrics with the\n"
        "spec's metric name, IsActive; or StreamIsActive), print the answers, and explain the value\n"
        "from the scaler's own /metrics: the dominant term, the terms, the capacity and the offered load."
    )
    parser.epilog = EXIT_CODES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "address",
        metavar="ADDRESS",
        help=f"the scaler's gRPC address: host:port, as the trigger's scalerAddress (port default {DEFAULT_GRPC_PORT})",
    )
    parser.add_argument(
        "-m",
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one trigger metadata entry; repeat for each. Sent as scalerMetadata, with scalerAddress=ADDRESS "
        "added unless given: KEDA forwards the trigger's whole metadata",
    )
    parser.add_argument("--name", default="llm", help="ScaledObject name (default llm)")
    parser.add_argument("--namespace", default="default", help="ScaledObject namespace (default default)")
    parser.add_argument(
        "--op",
        choices=OPS,
        default="poll",
        help="poll (default): GetMetricSpec, then GetMetrics with the spec's metric name and IsActive, "
        "one KEDA polling cycle; spec; metrics (GetMetricSpec first, for the name, as KEDA); active; "
        "stream: StreamIsActive, then cancel",
    )
    parser.add_argument(
        "--stream-messages",
        type=int,
        default=None,
        metavar="N",
        help="stream: cancel after N messages (default 1, or unlimited with --stream-for); waiting for "
        "them counts against --timeout unless --stream-for is given",
    )
    parser.add_argument(
        "--stream-for",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stream: read for this long, then cancel (no deadline on the stream, as KEDA opens it)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="one deadline for connecting and all the calls together, as KEDA's metrics adapter gives the "
        "HPA's GetMetricSpec + GetMetrics + IsActive 3 s (default 3); also the /metrics read's",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    tls = parser.add_argument_group("TLS (as KEDA's enableTLS / caCert / tlsClientCert / tlsClientKey)")
    tls.add_argument("--tls", action="store_true", help="use TLS, verifying the server with the default roots")
    tls.add_argument("--tls-ca", type=Path, metavar="FILE", help="PEM CA bundle to verify the server (implies --tls)")
    tls.add_argument("--tls-cert", type=Path, metavar="FILE", help="PEM client certificate, for mTLS (with --tls-key)")
    tls.add_argument("--tls-key", type=Path, metavar="FILE", help="PEM private key of --tls-cert")
    tls.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name to verify the server's certificate against (default: ADDRESS's host)",
    )
    parser.add_argument(
        "--metrics-url",
        metavar="URL",
        help=f"the scaler's own metrics, for the explanation (default http://HOST:{DEFAULT_METRICS_PORT}/metrics, "
        "HOST from ADDRESS)",
    )


def parse_metadata(pairs: Sequence[str]) -> dict[str, str]:
    meta: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ProbeUsageError(f"--metadata {pair!r}: expected KEY=VALUE")
        if key in meta and meta[key] != value:
            raise ProbeUsageError(f"--metadata {key!r} given twice with different values")
        meta[key] = value
    return meta


def split_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``host`` (the default gRPC port), with an optional ``dns:///``."""
    rest = address.removeprefix("dns:///")
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise ProbeUsageError(f"address {address!r}: expected [IPv6]:PORT")
        port = tail[1:]
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    elif ":" in rest:
        raise ProbeUsageError(f"address {address!r}: an IPv6 address goes in brackets, e.g. [::1]:9090")
    else:
        host, port = rest, ""
    if not host or any(c in host for c in "/?#@ "):
        raise ProbeUsageError(f"address {address!r}: expected HOST:PORT")
    if not port:
        return host, DEFAULT_GRPC_PORT
    if not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
        raise ProbeUsageError(f"address {address!r}: port {port!r} is not 1-65535")
    return host, int(port)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def default_metrics_url(address: str) -> str:
    host, _ = split_address(address)
    return f"http://{_host_port(host, DEFAULT_METRICS_PORT)}/metrics"


@dataclass(frozen=True)
class Options:
    target: str  # what grpc dials
    scaler_address: str  # host:port, as the trigger's scalerAddress
    name: str
    namespace: str
    metadata: dict[str, str]
    op: str
    timeout: float
    stream_messages: int | None
    stream_for: float | None
    credentials: grpc.ChannelCredentials | None
    security: str  # plaintext | tls | mtls
    server_name: str | None
    metrics_url: str


def _read(flag: str, path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProbeUsageError(f"{flag} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ProbeUsageError(f"{flag} {path}: not a PEM file")
    return data


def _options(args: argparse.Namespace) -> Options:
    host, port = split_address(args.address)
    scaler_address = _host_port(host, port)
    metadata = parse_metadata(args.metadata)
    metadata.setdefault("scalerAddress", scaler_address)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ProbeUsageError(f"--timeout {args.timeout:g}: accepted: a number of seconds > 0")
    if args.stream_messages is not None and args.stream_messages < 1:
        raise ProbeUsageError(f"--stream-messages {args.stream_messages}: accepted: a number >= 1")
    if args.stream_for is not None and not (math.isfinite(args.stream_for) and args.stream_for > 0):
        raise ProbeUsageError(f"--stream-for {args.stream_for:g}: accepted: a number of seconds > 0")
    if (args.stream_messages is not None or args.stream_for is not None) and args.op != "stream":
        raise ProbeUsageError("--stream-messages and --stream-for go with --op stream")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ProbeUsageError("--tls-cert and --tls-key go together")
    use_tls = bool(args.tls or args.tls_ca or args.tls_cert)
    if args.tls_server_name and not use_tls:
        raise ProbeUsageError("--tls-server-name needs TLS (--tls or --tls-ca)")
    credentials = None
    security = "plaintext"
    if use_tls:
        ca = _read("--tls-ca", args.tls_ca) if args.tls_ca else None
        cert = _read("--tls-cert", args.tls_cert) if args.tls_cert else None
        key = _read("--tls-key", args.tls_key) if args.tls_key else None
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        security = "mtls" if cert else "tls"
    metrics_url = args.metrics_url or default_metrics_url(args.address)
    if not metrics_url.startswith(("http://", "https://")):
        raise ProbeUsageError(f"--metrics-url {metrics_url!r}: expected an http:// or https:// URL")
    return Options(
        target=("dns:///" if args.address.startswith("dns:///") else "") + scaler_address,
        scaler_address=scaler_address,
        name=args.name,
        namespace=args.namespace,
        metadata=metadata,
        op=args.op,
        timeout=args.timeout,
        stream_messages=args.stream_messages,
        stream_for=args.stream_for,
        credentials=credentials,
        security=security,
        server_name=args.tls_server_name,
        metrics_url=metrics_url,
    )


# -- the calls -------------------------------------------------------------------------------------


def exit_code_for(code: grpc.StatusCode, connected: bool = True) -> int:
    """The documented exit code of a call that ended with ``code``; ``connected`` is False when the
    channel had no connection when it failed (gRPC reports that as UNAVAILABLE too)."""
    if code == grpc.StatusCode.OK:
        return EXIT_OK
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (code == grpc.StatusCode.UNAVAILABLE and not connected):
        return EXIT_NO_ANSWER
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return EXIT_INVALID
    if code == grpc.StatusCode.UNAVAILABLE:
        return EXIT_UNAVAILABLE
    return EXIT_OTHER


@dataclass
class Report:
    opts: Options
    calls: list[dict[str, Any]] = field(default_factory=list)
    spec: list[dict[str, Any]] | None = None
    metrics: list[dict[str, Any]] | None = None
    value: float | None = None
    active: bool | None = None
    stream: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    exit_code: int = EXIT_OK
    explanation: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        o = self.opts
        return {
            "address": o.scaler_address,
            "security": o.security,
            "scaledObject": {"name": o.name, "namespace": o.namespace, "scalerMetadata": o.metadata},
            "op": o.op,
            "calls": self.calls,
            "spec": self.spec,
            "metrics": self.metrics,
            "value": self.value,
            "active": self.active,
            "stream": self.stream,
            "error": self.error,
            "exit_code": self.exit_code,
            "explanation": self.explanation,
        }


class _Failed(Exception):
    pass


@contextlib.asynccontextmanager
async def _channel(opts: Options) -> AsyncIterator[grpc.aio.Channel]:
    options: list[tuple[str, Any]] = [("grpc.service_config", _SERVICE_CONFIG)]
    if opts.server_name:
        options.append(("grpc.ssl_target_name_override", opts.server_name))
    if opts.credentials is None:
        channel = grpc.aio.insecure_channel(opts.target, options=options)
    else:
        channel = grpc.aio.secure_channel(opts.target, opts.credentials, options=options)
    try:
        yield channel
    finally:
        await channel.close()


async def _connect(channel: grpc.aio.Channel, budget: float) -> None:
    """Wait, within ``budget``, until the channel is READY or has failed to connect. A failed channel is
    left to the first call, which then fails at once with gRPC's reason (refused, TLS handshake, ...)."""
    state = channel.get_state(try_to_connect=True)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(budget):
            while state not in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)


class _Session:
    def __init__(self, channel: grpc.aio.Channel, report: Report) -> None:
        self.channel = channel
        self.report = report
        self.opts = report.opts
        self.stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        self.ref = pb.ScaledObjectRef(
            name=self.opts.name, namespace=self.opts.namespace, scalerMetadata=self.opts.metadata
        )
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._deadline = loop.time() + self.opts.timeout

    def left(self) -> float:
        return max(0.0, self._deadline - self._clock())

    def _fail(self, rpc: str, exc: grpc.aio.AioRpcError, started: float) -> _Failed:
        code = exc.code()
        connected = self.channel.get_state() == grpc.ChannelConnectivity.READY
        message = exc.details() or ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and not connected:
            message = f"no connection to {self.opts.scaler_address} within {self.opts.timeout:g} s ({message})"
        self.report.calls.append(
            {"rpc": rpc, "code": code.name, "elapsed_ms": _ms(started), "message": message, "connected": connected}
        )
        self.report.error = {"rpc": rpc, "code": code.name, "message": message, "connected": connected}
        self.report.exit_code = exit_code_for(code, connected)
        return _Failed()

    def _ok(self, rpc: str, started: float) -> None:
        self.report.calls.append({"rpc": rpc, "code": "OK", "elapsed_ms": _ms(started)})

    async def spec(self) -> list[str]:
        started = time.perf_counter()
        try:
            resp = await self.stub.GetMetricSpec(self.ref, timeout=self.left())
        except grpc.aio.AioRpcError as exc:
            raise self._fail("GetMetricSpec", exc, started) from None
        self._ok("GetMetricSpec", started)
        self.report.spec = [
            {"metricName": s.metricName, "targetSize": s.targetSize, "targetSizeFloat": s.targetSizeFloat}
            for s in resp.metricSpecs
        ]
        if not resp.metricSpecs:  # KEDA: "no metric specs returned from scalers"; nothing to ask GetMetrics for
            self.report.error = {"rpc": "GetMetricSpec", "code": "OK", "message": "no metric spec returned"}
            self.report.exit_code = EXIT_OTHER
            raise _Failed()
        return [s.metricName for s in resp.metricSpecs]

    async def metrics(self, name: str) -> None:
        started = time.perf_counter()
        try:
            resp = await self.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=name), timeout=self.left()
            )
        except grpc.aio.AioRpcError as exc:
            raise self._fail("GetMetrics", exc, started) from None
        self._ok("GetMetrics", started)
        values = [
            {
                "metricName": v.metricName,
                "metricValue": v.metricValue,
                "metricValueFloat": v.metricValueFloat,
                # KEDA's reading: the float only when > 0, else the int (external_scaler.go)
                "value": v.metricValueFloat if v.metricValueFloat > 0 else float(v.metricValue),
            }
            for v in resp.metricValues
        ]
        self.report.metrics = [*(self.report.metrics or []), *values]
        # The HPA sums every value returned for one metric name.
        self.report.value = (self.report.value or 0.0) + sum(v["value"] for v in values)

    async def active(self) -> None:
        started = time.perf_counter()
        try:
            resp = await self.stub.IsActive(self.ref, timeout=self.left())
        except grpc.aio.AioRpcError as exc:
            raise self._fail("IsActive", exc, started) from None
        self._ok("IsActive", started)
        self.report.active = resp.result

    async def stream(self) -> None:
        opts = self.opts
        limit = opts.stream_messages if opts.stream_messages is not None else (None if opts.stream_for else 1)
        connected = self.channel.get_state() == grpc.ChannelConnectivity.READY
        # KEDA opens the stream without a deadline; without --stream-for the probe bounds the wait for its
        # messages with --timeout (and a channel that could not connect always gets the deadline).
        call = self.stub.StreamIsActive(
            self.ref, timeout=self.left() if opts.stream_for is None or not connected else None
        )
        received: list[bool] = []
        self.report.stream = {"received": received, "ended": None}
        started = time.perf_counter()

        async def read() -> str:
            async for msg in call:
                received.append(msg.result)
                if limit is not None and len(received) >= limit:
                    return "messages"
            return "server"  # the scaler ended the stream with OK (it is shutting down)

        try:
            if opts.stream_for is None:
                ended = await read()
            else:
                try:
                    ended = await asyncio.wait_for(read(), opts.stream_for)
                except TimeoutError:
                    ended = "duration"
        except grpc.aio.AioRpcError as exc:
            raise self._fail("StreamIsActive", exc, started) from None
        finally:
            call.cancel()  # a clean cancel: the scaler sees CANCELLED and releases the stream
        self.report.stream["ended"] = ended
        self._ok("StreamIsActive", started)
        if received:
            self.report.active = received[-1]


async def _exchange(report: Report) -> None:
    opts = report.opts
    async with _channel(opts) as channel:
        session = _Session(channel, report)
        await _connect(channel, session.left())
        try:
            if opts.op == "active":
                await session.active()
            elif opts.op == "stream":
                await session.stream()
            else:
                names = await session.spec()
                if opts.op != "spec":
                    for name in names:  # KEDA: per spec, GetMetrics(name as returned) then IsActive
                        await session.metrics(name)
                        if opts.op == "poll":
                            await session.active()
        except _Failed:
            pass


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


# -- the explanation -------------------------------------------------------------------------------


def _target_id(namespace: str, name: str, metadata: Mapping[str, str]) -> str | None:
    """The id the scaler gives this trigger's target, when the metadata parses here as it does there."""
    try:
        return parse_trigger(namespace, name, metadata, allow_cross_namespace=True).target_id
    except ScalerError:
        return None


def explain(text: str, namespace: str, name: str, target_id: str | None) -> dict[str, Any]:
    """This ScaledObject's target, as the scaler's /metrics describes it; ``available`` False with a
    ``reason`` when it is not there."""
    try:
        samples = parse_samples(text, _SERIES)
    except TextFormatError as exc:
        return {"available": False, "reason": f"not Prometheus text: {exc}"}
    mine = {
        n: [s for s in series if s.labels.get("namespace") == namespace and s.labels.get("scaledobject") == name]
        for n, series in samples.items()
    }
    ids = sorted({s.labels.get("target", "") for series in mine.values() for s in series})
    if not ids:
        return {
            "available": False,
            "reason": f"no series for {namespace}/{name}: this scaler serves no such target (not called yet, "
            "evicted after its idle TTL, or another scaler replica answered)",
        }
    if target_id in ids:
        chosen = target_id
    elif len(ids) == 1:
        chosen = ids[0]
    else:
        return {
            "available": False,
            "reason": f"{len(ids)} targets for {namespace}/{name} ({', '.join(ids)}: triggers with different "
            "metadata) and none has this metadata's id",
        }

    def series(metric: str) -> list[tuple[dict[str, str], float]]:
        return [(s.labels, s.value) for s in mine.get(f"llm_scaler_{metric}", []) if s.labels.get("target") == chosen]

    def one(metric: str) -> float | None:
        found = series(metric)
        return found[0][1] if found else None

    terms = {labels.get("term", ""): value for labels, value in series("composite_term")}
    dominant = [labels.get("reason", "") for labels, value in series("decision_reason") if value == 1]
    capacity = series("replica_capacity_requests_per_second")
    out: dict[str, Any] = {
        "available": True,
        "target": chosen,
        "target_matches_metadata": chosen == target_id,
        "target_up": one("target_up"),
        "composite": one("composite"),
        "dominant": dominant[0] if dominant else None,
        "terms": {t: terms[t] for t in TERMS if t in terms},
        "capacity": {"requests_per_second": capacity[0][1], "source": capacity[0][0].get("source")}
        if capacity
        else None,
        "offered_requests_per_second": one("offered_requests_per_second"),
        "planned_requests_per_second": one("planned_requests_per_second"),
        "replicas": {labels.get("state", ""): int(value) for labels, value in series("replicas")},
        "waiting_requests": one("waiting_requests"),
        "deferred_requests": one("deferred_requests"),
        "asleep_replicas": one("asleep_replicas"),
        "wake_replicas": one("wake_replicas"),
        "running_requests": one("running_requests"),
        "kv_usage_ratio": one("kv_usage_ratio"),
    }
    if out["composite"] is None:
        out["note"] = "no composite yet: the target's first scrape cycle has not finished, or it has no fresh data"
    return out


async def _explanation(report: Report) -> dict[str, Any]:
    opts = report.opts
    url = opts.metrics_url
    try:
        async with httpx.AsyncClient(timeout=opts.timeout, trust_env=False) as client:
            resp = await client.get(url)
            resp.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return {"available": False, "url": url, "reason": f"HTTP {exc.response.status_code}"}
    except httpx.HTTPError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else "no answer"
        return {"available": False, "url": url, "reason": f"{type(exc).__name__}: {reason}"}
    target_id = _target_id(opts.namespace, opts.name, opts.metadata)
    return {"url": url, **explain(resp.text, opts.namespace, opts.name, target_id)}


async def _run(opts: Options) -> Report:
    report = Report(opts)
    await _exchange(report)
    if report.exit_code == EXIT_NO_ANSWER:
        report.explanation = {"available": False, "reason": "skipped: no answer from the scaler"}
    elif report.exit_code == EXIT_INVALID:
        report.explanation = {"available": False, "reason": "skipped: the scaler refused the metadata"}
    else:
        report.explanation = await _explanation(report)
    return report


# -- output ----------------------------------------------------------------------------------------


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{round(value, 3):g}{unit}"


def _print_human(report: Report) -> None:
    o = report.opts
    print(f"scaler {o.scaler_address} ({o.security}), ScaledObject {o.namespace}/{o.name}, op {o.op}")
    for call in report.calls:
        rpc, ms = call["rpc"], f"{call['elapsed_ms']:g} ms"
        if call["code"] != "OK":
            print(f"  {rpc:<15} {call['code']}: {call['message']}  ({ms})")
        elif rpc == "GetMetricSpec":
            specs = ", ".join(
                f"{s['metricName']} target {s['targetSizeFloat']:g} (targetSize {s['targetSize']})"
                for s in report.spec or []
            )
            print(f"  {rpc:<15} {specs or 'no spec'}  ({ms})")
        elif rpc == "GetMetrics":
            values = ", ".join(f"{v['metricName']} = {v['value']:g}" for v in report.metrics or [])
            print(f"  {rpc:<15} {values or 'no value'}  ({ms})")
        elif rpc == "IsActive":
            print(f"  {rpc:<15} {str(report.active).lower()}  ({ms})")
        elif rpc == "StreamIsActive" and report.stream is not None:
            got = " ".join(str(r).lower() for r in report.stream["received"]) or "no message"
            why = {
                "messages": "cancelled by the probe after its messages",
                "duration": "cancelled by the probe after --stream-for",
                "server": "ended by the scaler (OK)",
            }.get(report.stream["ended"] or "", "")
            print(f"  {rpc:<15} {got}; {why}  ({ms})")
    if report.spec and report.value is not None and report.spec[0]["targetSizeFloat"] > 0:
        target = report.spec[0]["targetSizeFloat"]
        print(
            f"  HPA (AverageValue, KEDA's default metricType): ceil({report.value:g} / {target:g}) = "
            f"{math.ceil(round(report.value / target, 9))} replicas"
        )
    _print_explanation(report.explanation or {})


def _print_explanation(e: dict[str, Any]) -> None:
    where = f" from {e['url']}" if e.get("url") else ""
    if not e.get("available"):
        print(f"explanation unavailable{where}: {e.get('reason')}")
        return
    print(f"explanation{where} (target {e['target']}):")
    if e["composite"] is None:
        print(f"  {e['note']}")
    else:
        print(f"  composite {_num(e['composite'])}, dominant term: {e['dominant'] or '-'}")
        print("  terms: " + ", ".join(f"{t} {_num(v)}" for t, v in e["terms"].items()))
        cap = e["capacity"]
        capacity = (
            f"{_num(cap['requests_per_second'])} req/s per replica ({cap['source']})"
            if cap
            else "unknown (no rate term)"
        )
        print(
            f"  capacity {capacity}; offered {_num(e['offered_requests_per_second'], ' req/s')}, "
            f"planned {_num(e['planned_requests_per_second'], ' req/s')}"
        )
    replicas = ", ".join(f"{state} {n}" for state, n in e["replicas"].items()) or "-"
    print(
        f"  replicas: {replicas}; waiting {_num(e['waiting_requests'])}, running {_num(e['running_requests'])}, "
        f"kv_usage {_num(e['kv_usage_ratio'])}; target_up {_num(e['target_up'])}"
    )
    if e.get("deferred_requests"):
        print(
            f"  deferred {_num(e['deferred_requests'])}: waiting on LoRA, a KV transfer or a blocked status, "
            "not counted as demand"
        )
    if e.get("asleep_replicas"):
        print(
            f"  asleep {_num(e['asleep_replicas'])} (not capacity until woken): the need asks to wake "
            f"{_num(e.get('wake_replicas'))} of them before any new replica"
        )


def probe_main(args: argparse.Namespace) -> int:
    try:
        opts = _options(args)
    except ProbeUsageError as exc:
        print(f"keda-llm-scaler probe: {exc}", file=sys.stderr)
        return EXIT_INVALID
    report = asyncio.run(_run(opts))
    if args.json:
        print(json.dumps(report.as_json(), sort_keys=True))
    else:
        _print_human(report)
        if report.error is not None:
            e = report.error
            print(f"keda-llm-scaler probe: {e['rpc']}: {e['code']}: {e['message']}", file=sys.stderr)
    return report.exit_code
