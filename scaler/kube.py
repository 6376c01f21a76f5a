"""A minimal read-only Kubernetes API client: in-cluster service-account credentials, or explicit ones.

Only what discovery needs: list a Service's EndpointSlices and check that the Service exists. One
pooled httpx client; the bearer token is re-read from disk every minute because projected
service-account tokens rotate.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

__all__ = ["KubeClient", "KubeConfig", "KubeError"]

SA_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S: Final = 60.0


class KubeError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class KubeConfig:
    api_url: str
    token_file: Path | None = None
    ca_file: Path | None = None
    timeout_s: float = 5.0

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> KubeConfig | None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SA_DIR / "token").exists():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", SA_DIR / "token", SA_DIR / "ca.crt")


class KubeClient:
    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        verify: ssl.SSLContext | bool = True
        if config.ca_file is not None and config.api_url.startswith("https"):
            verify = ssl.create_default_context(cafile=str(config.ca_file))
        self._http = httpx.AsyncClient(
            base_url=config.api_url,
            verify=verify,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=8),
        )
        self._token: str | None = None
        self._token_read_at = -TOKEN_REFRESH_S

    def _auth(self) -> dict[str, str]:
        if self._config.token_file is None:
            return {}
        now = time.monotonic()
        if now - self._token_read_at >= TOKEN_REFRESH_S:
            self._token = self._config.token_file.read_text().strip()
            self._token_read_at = now
        return {"Authorization": f"Bearer {self._token}"}

    async def _get(self, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        try:
            return await self._http.get(path, params=params, headers=self._auth())
        except (httpx.HTTPError, OSError) as exc:
            raise KubeError(f"Kubernetes API {path}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _fail(resp: httpx.Response, what: str) -> KubeError:
        try:
            message = resp.json().get("message", "")
        except ValueError:
            message = resp.text[:200]
        return KubeError(f"Kubernetes API {what}: HTTP {resp.status_code} {message}".rstrip())

    async def list_endpointslices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        resp = await self._get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            {"labelSelector": f"kubernetes.io/service-name={service}"},
        )
        if resp.status_code != 200:
            raise self._fail(resp, f"list EndpointSlices of {namespace}/{service}")
        items = resp.json().get("items") or []
        return [i for i in items if isinstance(i, dict)]

    async def service_exists(self, namespace: str, service: str) -> bool:
        resp = await self._get(f"/api/v1/namespaces/{namespace}/services/{service}")
        if resp.status_code == 404:
            return False
        if resp.status_code != 200:
            raise self._fail(resp, f"get Service {namespace}/{service}")
        return True

    async def aclose(self) -> None:
        await self._http.aclose()
