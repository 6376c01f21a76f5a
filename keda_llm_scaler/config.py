"""Server settings: every ``serve`` flag, its environment variable and its default, in one table."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from keda_llm_scaler.addresses import AddressPolicy, parse_networks
from keda_llm_scaler.ranking_scope import parse_scope

__all__ = [
    "ENV_PREFIX",
    "SETTINGS_HELP",
    "Settings",
    "add_serve_arguments",
    "address_policy",
    "describe",
    "settings_from",
]

ENV_PREFIX: Final = "LLM_SCALER_"


def _bool(raw: str) -> bool:
    # Go's strconv.ParseBool spellings, as KEDA uses for its own flags.
    if raw in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if raw in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"{raw!r} is not a boolean (true/false/1/0)")


def _bool_arg(raw: str) -> bool:
    try:
        return _bool(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _path(raw: str) -> Path | None:
    return Path(raw) if raw else None


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "0.0.0.0"
    grpc_port: int = 9090
    metrics_port: int = 8080
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    log_level: str = "info"
    log_json: bool | None = None
    target_idle_ttl: float = 600.0
    max_targets: int = 1000
    allow_cross_namespace: bool = False
    refuse_networks: str = ""
    allow_networks: str = ""
    warmup_wait: float = 0.5
    max_scrape_bytes: int = 8 * 1024 * 1024
    max_concurrent_scrapes: int = 64
    scrape_workers: str = "auto"
    kube_api_url: str = ""
    kube_token_file: Path | None = None
    kube_ca_file: Path | None = None
    kubeconfig: Path | None = None
    kube_context: str = ""
    shutdown_grace: float = 5.0
    victim_ranking: str = ""
    victim_ranking_interval: float = 10.0
    victim_ranking_burst: int = 16
    state_dir: Path | None = None
    state_configmap: str = ""
    state_interval: float = 10.0

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        for name, port in (("--grpc-port", self.grpc_port), ("--metrics-port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} {port}: out of range; accepted: 0-65535")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"--log-level {self.log_level!r}: accepted: {' | '.join(LOG_LEVELS)}")
        checks: tuple[tuple[str, float, float], ...] = (
            ("target_idle_ttl", self.target_idle_ttl, 0.1),  # 0 would spin the evictor
            ("max_targets", self.max_targets, 1),
            ("warmup_wait", self.warmup_wait, 0.0),
            ("max_scrape_bytes", self.max_scrape_bytes, 1024),
            ("max_concurrent_scrapes", self.max_concurrent_scrapes, 1),
            ("shutdown_grace", self.shutdown_grace, 0.0),
            ("victim_ranking_interval", self.victim_ranking_interval, 1.0),
            ("victim_ranking_burst", self.victim_ranking_burst, 1),
            ("state_interval", self.state_interval, 1.0),
        )
        for name, value, low in checks:
            if not (math.isfinite(value) and value >= low):
                raise ValueError(f"--{name.replace('_', '-')} {value!r}: accepted: a number >= {low:g}")
        workers = self.scrape_workers.strip().lower()
        if workers != "auto" and not (workers.isascii() and workers.isdigit() and int(workers) <= 256):
            raise ValueError(f"--scrape-workers {self.scrape_workers!r}: accepted: auto | 0-256")
        parse_networks(self.refuse_networks, "--refuse-networks")
        parse_networks(self.allow_networks, "--allow-networks")
        parse_scope(self.victim_ranking)
        if self.state_configmap:
            parse_configmap_ref(self.state_configmap)
            if self.state_dir is not None:
                raise ValueError("--state-dir and --state-configmap: one place for learned state, not both")
        if not _valid_host(self.host):
            raise ValueError(f"--host {self.host!r}: accepted: an IP address or a host name")


LOG_LEVELS: Final = ("debug", "info", "warning", "error")
_HOSTNAME: Final = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$"
)


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        # a dotted all-numeric name (999.1.1.1) is a mistyped address, not a host name
        return bool(_HOSTNAME.match(host)) and not all(p.isdigit() for p in host.split("."))


SETTINGS_HELP: Final[dict[str, str]] = {
    "host": "address to listen on (gRPC and metrics)",
    "grpc_port": "gRPC port for KEDA: ExternalScaler, health, reflection (0 picks a free port)",
    "metrics_port": "HTTP port of the scaler's own /metrics (0 picks a free port)",
    "tls_cert": "PEM server certificate for the gRPC port (enables TLS)",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA bundle: require client certificates signed by it (mTLS)",
    "log_level": "debug | info | warning | error",
    "log_json": "JSON logs (default: JSON unless stdout is a terminal)",
    "target_idle_ttl": "seconds without a KEDA call before a target stops being scraped",
    "max_targets": "most targets (ScaledObject fleets) served at once",
    "allow_cross_namespace": "let a ScaledObject discover a Service in another namespace",
    "refuse_networks": "never scrape these: comma-separated CIDRs or loopback | private (link-local and "
    "metadata addresses are always refused)",
    "allow_networks": "scrape only inside these (e.g. the pod CIDR): comma-separated CIDRs or loopback | private",
    "warmup_wait": "seconds a new target's first call may wait for its first scrape",
    "max_scrape_bytes": "largest /metrics body read from a replica",
    "max_concurrent_scrapes": "replica scrapes in flight at once, all targets together",
    "scrape_workers": "processes that fetch and parse replicas' /metrics: auto (one per CPU the pod may "
    "use, at most 4) | a number | 0 (in the scaler process)",
    "kube_api_url": "Kubernetes API URL (default: in-cluster service account, when present)",
    "kube_token_file": "bearer token file for --kube-api-url",
    "kube_ca_file": "CA file for --kube-api-url",
    "kubeconfig": "kubeconfig file for development (token or client-certificate users)",
    "kube_context": "context of --kubeconfig (default: its current-context)",
    "shutdown_grace": "seconds in-flight RPCs get to finish on SIGTERM",
    "victim_ranking": "write controller.kubernetes.io/pod-deletion-cost on fleets' pods from their load, so "
    "scale-downs remove the least busy pod: comma-separated namespaces, or * for all (needs patch on pods there); "
    "empty: off",
    "victim_ranking_interval": "seconds between two victim-ranking passes of one fleet",
    "victim_ranking_burst": "most pod-deletion-cost patches in one pass of one fleet",
    "state_dir": "keep what the fleets learned (capacity per token mix, start-up times, the demand window) in "
    "this directory, read at start; empty: kept in memory only",
    "state_configmap": "the same in this ConfigMap, NAMESPACE/NAME (in a cluster; needs get and update on it); "
    "every scaler pod of a release shares it",
    "state_interval": "seconds between two writes of the learned state",
}

# Field annotations are strings here (from __future__ import annotations).
_PARSERS: Final[dict[str, Callable[[str], Any]]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": _bool,
    "Path | None": _path,
    "bool | None": _bool,
}


def _parser_for(name: str) -> Callable[[str], Any]:
    annotation = next(f.type for f in fields(Settings) if f.name == name)
    return _PARSERS[str(annotation)]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        default = f.default
        shown = "" if default is None or default == "" else f" (default {default})"
        help_text = f"{SETTINGS_HELP[f.name]}{shown}; env {env}"
        if _parser_for(f.name) is not _bool:
            parser.add_argument(flag, dest=f.name, type=_parser_for(f.name), default=None, help=help_text)
            continue
        # --flag alone is true and --no-flag false; the value forms every earlier release needed
        # (--log-json true, --flag=0) still work, so scripts that pass them keep running
        no_flag = "--no-" + flag.removeprefix("--")
        parser.add_argument(
            flag, dest=f.name, nargs="?", const=True, type=_bool_arg, default=None, metavar="BOOL",
            help=f"{help_text}; {no_flag}: false",
        )  # fmt: skip
        parser.add_argument(no_flag, dest=f.name, action="store_false", default=None, help=argparse.SUPPRESS)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Settings:
    """Flags win over environment variables, which win over defaults."""
    values: dict[str, Any] = {}
    for f in fields(Settings):
        flag_value = getattr(args, f.name, None)
        if flag_value is not None:
            values[f.name] = flag_value
        elif (raw := env.get(ENV_PREFIX + f.name.upper())) is not None:
            try:
                values[f.name] = _parser_for(f.name)(raw)
            except ValueError as exc:
                raise ValueError(f"{ENV_PREFIX}{f.name.upper()}: {exc}") from None
    settings = Settings(**values)
    _check_pem(settings)
    return settings


def _check_pem(settings: Settings) -> None:
    """TLS files must be readable PEM now: at bind time gRPC only says it could not listen."""
    for flag, path, marker in (
        ("--tls-cert", settings.tls_cert, "CERTIFICATE"),
        ("--tls-key", settings.tls_key, "PRIVATE KEY"),
        ("--tls-client-ca", settings.tls_client_ca, "CERTIFICATE"),
    ):
        if path is None:
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise ValueError(f"{flag} {path}: {exc.strerror or exc}") from None
        if "-----BEGIN " not in text or marker not in text:
            raise ValueError(f"{flag} {path}: not a PEM file with a {marker.lower()}")


def parse_configmap_ref(raw: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` -> (namespace, name); ValueError naming the flag otherwise."""
    namespace, _, name = raw.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"--state-configmap {raw!r}: accepted: NAMESPACE/NAME")
    return namespace, name


def address_policy(settings: Settings) -> AddressPolicy:
    return AddressPolicy(
        refuse=parse_networks(settings.refuse_networks, "--refuse-networks"),
        allow=parse_networks(settings.allow_networks, "--allow-networks"),
    )


def describe(settings: Settings) -> dict[str, str]:
    return {f.name: str(getattr(settings, f.name)) for f in fields(settings)}
