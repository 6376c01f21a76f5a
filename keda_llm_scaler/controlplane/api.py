"""A synchronous admin client of the e2e control plane: server-side apply of any kind, reads, watches.

Kinds are mapped to their REST paths through the API server's own discovery, so CRDs (KEDA's) and
aggregated APIs work like built-in kinds. This is the harness's client: the scaler keeps its own
(``keda_llm_scaler.kube``), which is what the e2e tests exercise.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["Api", "ApiError", "ProcessDied", "eventually", "reply_json"]

FIELD_MANAGER = "keda-llm-scaler-e2e"


class ProcessDied(Exception):
    """A component of the control plane exited: waiting longer cannot help."""


class ApiError(Exception):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:400]}")
        self.status = status


@dataclass(frozen=True)
class Resource:
    prefix: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        out = self.prefix
        if self.namespaced and namespace:
            out += f"/namespaces/{namespace}"
        out += f"/{self.plural}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out


class Api:
    def __init__(self, server: str, ca: Path, cert: Path | None = None, key: Path | None = None,
                 token: str | None = None, timeout: float = 30.0) -> None:  # fmt: skip
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        tls = ssl.create_default_context(cafile=str(ca))
        if cert and key:
            tls.load_cert_chain(str(cert), str(key))
        self._client = httpx.Client(base_url=server, verify=tls, headers=headers, timeout=timeout)
        self._resources: dict[tuple[str, str], Resource] = {}

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Api:
        """The first cluster and user of a kubeconfig the harness wrote (client certificate files)."""
        conf = yaml.safe_load(path.read_text())
        cluster, user = conf["clusters"][0]["cluster"], conf["users"][0]["user"]
        return cls(cluster["server"], Path(cluster["certificate-authority"]), Path(user["client-certificate"]),
                   Path(user["client-key"]))  # fmt: skip

    def close(self) -> None:
        self._client.close()

    # -- discovery ------------------------------------------------------------------------------
    def resource(self, api_version: str, kind: str) -> Resource:
        key = (api_version, kind)
        if key not in self._resources:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = self.request("GET", prefix, what=f"discovery of {api_version}")
            for r in listing.get("resources", []):
                if "/" not in r["name"]:
                    self._resources[(api_version, r["kind"])] = Resource(prefix, r["name"], r["namespaced"])
            if key not in self._resources:
                raise ApiError(404, f"no kind {kind} in {api_version}", "discovery")
        return self._resources[key]

    def forget_discovery(self) -> None:
        self._resources.clear()

    # -- requests -------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, what: str = "", ok: tuple[int, ...] = (), **kw: Any) -> Any:
        try:
            resp = self._client.request(method, path, **kw)
        except httpx.TransportError:
            # a pooled connection the API server closed (a restart): one fresh try, then the error
            resp = self._client.request(method, path, **kw)
        if resp.status_code >= 300 and resp.status_code not in ok:
            raise ApiError(resp.status_code, resp.text, what or f"{method} {path}")
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (create or update), as ``kubectl apply --server-side --force-conflicts``."""
        meta = obj["metadata"]
        res = self.resource(obj["apiVersion"], obj["kind"])
        path = res.path(meta.get("namespace"), meta["name"])
        out = self.request(
            "PATCH",
            path,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content=json.dumps(obj),
            headers={"Content-Type": "application/apply-patch+yaml"},
            what=f"apply {obj['kind']} {meta.get('namespace', '')}/{meta['name']}",
        )
        return dict(out)

    def apply_yaml(self, text: str, namespace: str | None = None) -> list[dict[str, Any]]:
        done = []
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            docs = doc["items"] if doc.get("kind", "").endswith("List") and "items" in doc else [doc]
            for d in docs:
                res = self.resource(d["apiVersion"], d["kind"])
                if namespace and res.namespaced:
                    d.setdefault("metadata", {}).setdefault("namespace", namespace)
                done.append(self.apply(d))
        return done

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        res = self.resource(api_version, kind)
        out = self.request("GET", res.path(namespace, name), ok=(404,))
        if isinstance(out, dict) and out.get("kind") == "Status" and out.get("code") == 404:
            return None
        return out if isinstance(out, dict) else None

    def list(self, api_version: str, kind: str, namespace: str | None = None, **params: str) -> dict[str, Any]:
        res = self.resource(api_version, kind)
        return dict(self.request("GET", res.path(namespace), params=params))

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str, **body: Any) -> Any:
        res = self.resource(api_version, kind)
        return self.request("DELETE", res.path(namespace, name), json=body or None, ok=(404,))

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: dict[str, Any],
              sub: str | None = None, kind_of_patch: str = "merge") -> dict[str, Any]:  # fmt: skip
        res = self.resource(api_version, kind)
        ctype = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
        return dict(
            self.request(
                "PATCH",
                res.path(namespace, name, sub),
                content=json.dumps(patch),
                headers={"Content-Type": ctype[kind_of_patch]},
            )
        )

    def watch(self, path: str, resource_version: str, timeout_s: int = 60, **params: str) -> Iterator[dict[str, Any]]:
        """Events of one watch request, until the server ends it (``timeoutSeconds``)."""
        query = {"watch": "1", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_s), **params}  # fmt: skip
        with self._client.stream("GET", path, params=query, timeout=httpx.Timeout(timeout_s + 30.0)) as resp:
            if resp.status_code >= 300:
                raise ApiError(resp.status_code, resp.read().decode(errors="replace"), f"watch {path}")
            for line in resp.iter_lines():
                if line:
                    yield json.loads(line)


def reply_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    """Answer one request of a harness control API (the pod stand-in's, the control plane's)."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """Call ``check`` until it returns something truthy; raise with ``what`` (and the last error) if not."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            got = check()
            if got:
                return got
        except ProcessDied:
            raise
        except Exception as exc:  # the component may not be up yet: keep trying
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s" + (f" (last error: {last})" if last else ""))
        time.sleep(interval)
