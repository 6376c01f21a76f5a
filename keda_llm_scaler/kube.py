"""A small read-only Kubernetes API client for discovery.

Credentials: the in-cluster service account (token + CA, token re-read every minute because projected
tokens rotate), or a kubeconfig for development (token or client certificate; exec/auth-provider
plugins are not supported). One pooled httpx client; GETs are cached for a short TTL and concurrent
identical GETs share one request, so any number of targets watching the same Service, workload or
ScaledObject cost one API call per TTL.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

__all__ = ["KubeClient", "KubeConfig", "KubeError", "label_selector"]

SA_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S: Final = 60.0
FAST_TTL_S: Final = 2.0  # endpoints and pods: what scaling follows
SLOW_TTL_S: Final = 30.0  # ScaledObjects and workloads: change with deploys


class KubeError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class KubeConfig:
    api_url: str
    token_file: Path | None = None
    ca_file: Path | None = None
    token: str | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 5.0

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> KubeConfig | None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SA_DIR / "token").exists():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", SA_DIR / "token", SA_DIR / "ca.crt")

    @classmethod
    def from_kubeconfig(cls, path: Path, context: str | None = None) -> KubeConfig:
        """The cluster and user of ``context`` (default: current-context) in a kubeconfig file."""
        import yaml  # only development setups read kubeconfigs

        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise KubeError(f"kubeconfig {path}: {exc}") from exc

        def named(kind: str, name: str) -> dict[str, Any]:
            for item in doc.get(kind) or []:
                if item.get("name") == name:
                    return dict(item.get(kind[:-1]) or {})
            raise KubeError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")

        ctx_name = context or doc.get("current-context")
        if not ctx_name:
            raise KubeError(f"kubeconfig {path}: no current-context and no --kube-context")
        ctx = named("contexts", ctx_name)
        cluster, user = named("clusters", ctx["cluster"]), named("users", ctx["user"])
        if "exec" in user or "auth-provider" in user:
            raise KubeError(
                f"kubeconfig {path}: user {ctx['user']!r} uses an exec/auth-provider plugin; "
                "use a token or client certificate"
            )
        base = path.parent
        private = Path(tempfile.mkdtemp(prefix="keda-llm-scaler-kube-"))

        def file_or_data(file_key: str, data_key: str, source: dict[str, Any], name: str) -> Path | None:
            if source.get(data_key):
                out = private / name
                out.write_bytes(base64.b64decode(source[data_key]))
                out.chmod(0o600)
                return out
            if source.get(file_key):
                return (base / str(source[file_key])).resolve()
            return None

        token_file = Path(user["tokenFile"]) if user.get("tokenFile") else None
        return cls(
            api_url=str(cluster["server"]).rstrip("/"),
            token_file=token_file,
            token=user.get("token"),
            ca_file=file_or_data("certificate-authority", "certificate-authority-data", cluster, "ca.crt"),
            client_cert_file=file_or_data("client-certificate", "client-certificate-data", user, "client.crt"),
            client_key_file=file_or_data("client-key", "client-key-data", user, "client.key"),
            insecure_skip_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        )


def label_selector(selector: Mapping[str, Any]) -> str:
    """A LabelSelector object (matchLabels + matchExpressions) as a query-string selector."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise KubeError(f"unsupported selector operator {op!r}")
    if not parts:
        raise KubeError("empty selector: refusing to select every pod of the namespace")
    return ",".join(parts)


class KubeClient:
    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        verify: ssl.SSLContext | bool = True
        if config.api_url.startswith("https"):
            ctx = ssl.create_default_context(cafile=str(config.ca_file) if config.ca_file else None)
            if config.insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if config.client_cert_file is not None:
                ctx.load_cert_chain(
                    str(config.client_cert_file), str(config.client_key_file) if config.client_key_file else None
                )
            verify = ctx
        self._http = httpx.AsyncClient(
            base_url=config.api_url,
            verify=verify,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=8),
            trust_env=False,
        )
        self._token: str | None = config.token
        self._token_read_at = -TOKEN_REFRESH_S
        self._cache: dict[str, tuple[float, Any]] = {}
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self.requests = 0  # API calls made (what the cache saves is visible in tests)

    def _auth(self) -> dict[str, str]:
        if self._config.token_file is not None:
            now = time.monotonic()
            if now - self._token_read_at >= TOKEN_REFRESH_S:
                self._token = self._config.token_file.read_text().strip()
                self._token_read_at = now
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _fetch(self, path: str, params: Mapping[str, str] | None, what: str, allow_404: bool) -> Any:
        self.requests += 1
        try:
            resp = await self._http.get(path, params=params, headers=self._auth())
        except (httpx.HTTPError, OSError) as exc:
            raise KubeError(f"Kubernetes API {what}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code == 404 and allow_404:
            return None
        if resp.status_code != 200:
            try:
                message = resp.json().get("message", "")
            except ValueError:
                message = resp.text[:200]
            raise KubeError(f"Kubernetes API {what}: HTTP {resp.status_code} {message}".rstrip())
        try:
            return resp.json()
        except ValueError as exc:
            raise KubeError(f"Kubernetes API {what}: invalid JSON") from exc

    async def get(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        what: str = "",
        ttl: float = FAST_TTL_S,
        allow_404: bool = False,
    ) -> Any:
        """GET with a short cache and request sharing; None for a 404 when ``allow_404``.

        The request runs in its own task: a caller that is cancelled (a target being evicted) does not
        cancel it for the other targets waiting on the same object.
        """
        key = path + "?" + "&".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < ttl:
            return cached[1]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch_and_cache(key, path, params, what or path, allow_404))
            self._inflight[key] = task
            task.add_done_callback(self._done(key))
        return await asyncio.shield(task)

    def _done(self, key: str) -> Callable[[asyncio.Task[Any]], None]:
        def done(task: asyncio.Task[Any]) -> None:
            self._inflight.pop(key, None)
            if not task.cancelled():
                task.exception()  # retrieved: every waiter re-raises it itself

        return done

    async def _fetch_and_cache(
        self, key: str, path: str, params: Mapping[str, str] | None, what: str, allow_404: bool
    ) -> Any:
        value = await self._fetch(path, params, what, allow_404)
        self._cache[key] = (time.monotonic(), value)
        return value

    async def list_endpointslices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        data = await self.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={service}"},
            what=f"list EndpointSlices of {namespace}/{service}",
        )
        return [i for i in (data or {}).get("items") or [] if isinstance(i, dict)]

    async def service_exists(self, namespace: str, service: str) -> bool:
        data = await self.get(
            f"/api/v1/namespaces/{namespace}/services/{service}",
            ttl=SLOW_TTL_S,
            what=f"get Service {namespace}/{service}",
            allow_404=True,
        )
        return data is not None

    async def get_scaledobject(self, namespace: str, name: str) -> dict[str, Any] | None:
        data = await self.get(
            f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/{name}",
            ttl=SLOW_TTL_S,
            what=f"get ScaledObject {namespace}/{name}",
            allow_404=True,
        )
        return data if isinstance(data, dict) else None

    async def get_workload(self, namespace: str, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}.get(kind)
        if plural is None or api_version != "apps/v1":
            raise KubeError(
                f"scaleTargetRef {api_version}/{kind} is not supported: Deployment or StatefulSet "
                "(apps/v1); name the replicas with `service` or `endpoints` instead"
            )
        data = await self.get(
            f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}",
            ttl=SLOW_TTL_S,
            what=f"get {kind} {namespace}/{name}",
            allow_404=True,
        )
        return data if isinstance(data, dict) else None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        data = await self.get(
            f"/api/v1/namespaces/{namespace}/pods",
            params={"labelSelector": selector},
            what=f"list pods {selector} in {namespace}",
        )
        return [i for i in (data or {}).get("items") or [] if isinstance(i, dict)]

    async def aclose(self) -> None:
        await self._http.aclose()
