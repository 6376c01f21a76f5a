"""A small Kubernetes API client for discovery (reads) and victim ranking (one kind of write: a pod's
deletion-cost annotation, ``patch_pod_annotation``).

Credentials: the in-cluster service account (token + CA, token re-read every minute because projected
tokens rotate), or a kubeconfig for development (token or client certificate; exec/auth-provider
plugins are not supported). One pooled httpx client.

* Collections that scaling follows (EndpointSlices, Pods) are *informers*: listed once, then watched
  from the list's ``resourceVersion`` (bookmarks on, server-side timeout jittered); a watch that ends is
  resumed from the last version seen, without a relist; only 410 Gone relists. Failures back off
  exponentially with jitter (0.5 s doubling to 30 s). One informer per collection and selector, shared
  by every target that reads it; unused ones stop after ``INFORMER_IDLE_S``.
* Single objects that change with deploys (Service, ScaledObject, workload) are GETs cached for
  ``SLOW_TTL_S``; concurrent identical GETs share one request, and a failure is cached for the current
  back-off, so any number of targets cost one API call per TTL, also while the API server is failing.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import json
import os
import random
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx

__all__ = ["KubeClient", "KubeConfig", "KubeError", "PatchResult", "label_selector", "object_key"]

SA_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_S: Final = 60.0
FAST_TTL_S: Final = 2.0
SLOW_TTL_S: Final = 30.0  # Services, ScaledObjects and workloads: change with deploys
BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
INFORMER_IDLE_S: Final = 600.0
WATCH_TIMEOUT_S: Final = (240, 360)  # server-side watch timeout, drawn per watch so reconnects spread out
STEADY_WATCH_S: Final = 5.0  # a watch that stayed open this long resets the back-off


class KubeError(Exception):
    pass


class Gone(KubeError):
    """410: the resourceVersion is older than the API server keeps: list again."""


# The outcome of a write, by what an operator would do about it.
PATCH_OK: Final = "ok"
PATCH_FORBIDDEN: Final = "forbidden"  # 401/403: RBAC (patch pods) is missing in that namespace
PATCH_GONE: Final = "not_found"  # 404: the pod left meanwhile
PATCH_CONFLICT: Final = "conflict"  # a new pod took the name: the UID in the patch is not its (422/409)
PATCH_ERROR: Final = "error"  # anything else: transport, 5xx, 429, 422


@dataclass(frozen=True, slots=True)
class PatchResult:
    outcome: str
    status: int | None = None
    message: str = ""


class Backoff:
    """Exponential back-off with full jitter: the n-th consecutive failure waits U(0.5, 1) x min(max,
    initial x 2^n). Jitter keeps many scalers (or informers) from retrying in lockstep."""

    def __init__(
        self, initial: float = BACKOFF_INITIAL_S, maximum: float = BACKOFF_MAX_S, rng: random.Random | None = None
    ) -> None:
        self.initial, self.maximum = initial, maximum
        self.failures = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        delay = min(self.maximum, self.initial * 2.0 ** min(self.failures, 30))
        self.failures += 1
        return delay * self._rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


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
        """The cluster and user of ``context`` (default: current-context) in a kubeconfig file.

        Every problem is one KubeError line naming the file (``serve`` prints it and exits 2)."""
        import yaml  # only development setups read kubeconfigs

        where = f"--kubeconfig {path}"
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise KubeError(f"{where}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise KubeError(f"{where}: not valid YAML{at}: {problem}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            kind = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}.get(
                type(doc).__name__, type(doc).__name__
            )
            raise KubeError(
                f"{where}: not a kubeconfig (a YAML mapping with clusters, contexts and users) but a YAML {kind}"
            )

        def named(kind: str, name: str) -> dict[str, Any]:
            items = doc.get(kind) or []
            if not isinstance(items, list):
                raise KubeError(f"{where}: {kind} is not a list")
            for item in items:
                if isinstance(item, dict) and item.get("name") == name:
                    body = item.get(kind[:-1]) or {}
                    if not isinstance(body, dict):
                        raise KubeError(f"{where}: {kind[:-1]} {name!r} is not a mapping")
                    return dict(body)
            raise KubeError(f"{where}: no {kind[:-1]} named {name!r}")

        ctx_name = context or doc.get("current-context")
        if not ctx_name:
            raise KubeError(f"{where}: no current-context and no --kube-context")
        ctx = named("contexts", str(ctx_name))
        for key in ("cluster", "user"):
            if not ctx.get(key):
                raise KubeError(f"{where}: context {ctx_name!r} names no {key}")
        cluster, user = named("clusters", str(ctx["cluster"])), named("users", str(ctx["user"]))
        if not cluster.get("server"):
            raise KubeError(f"{where}: cluster {ctx['cluster']!r} has no server")
        if "exec" in user or "auth-provider" in user:
            raise KubeError(
                f"{where}: user {ctx['user']!r} uses an exec/auth-provider plugin; use a token or client certificate"
            )
        base = path.parent
        private: list[Path] = []  # made only for inline credentials, removed when the process exits

        def file_or_data(file_key: str, data_key: str, source: dict[str, Any], name: str) -> Path | None:
            if source.get(data_key):
                try:
                    data = base64.b64decode(str(source[data_key]))
                except ValueError:
                    raise KubeError(f"{where}: {data_key} is not base64") from None
                if not private:
                    private.append(Path(tempfile.mkdtemp(prefix="keda-llm-scaler-kube-")))
                    atexit.register(shutil.rmtree, private[0], ignore_errors=True)
                out = private[0] / name
                out.write_bytes(data)
                out.chmod(0o600)
                return out
            if source.get(file_key):
                return (base / str(source[file_key])).resolve()
            return None

        token_file = Path(str(user["tokenFile"])) if user.get("tokenFile") else None
        return cls(
            api_url=str(cluster["server"]).rstrip("/"),
            token_file=token_file,
            token=str(user["token"]) if user.get("token") else None,
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
        # Each open watch holds its HTTP/1.1 connection for minutes: watches get their own pool without a
        # connection cap (one per informer), so they can never starve GETs, lists or each other.
        self._watch_http = httpx.AsyncClient(
            base_url=config.api_url,
            verify=verify,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            trust_env=False,
        )
        self._token: str | None = config.token
        self._token_read_at = -TOKEN_REFRESH_S
        self._cache: dict[str, tuple[float, Any]] = {}
        self._failed: dict[str, tuple[float, KubeError, Backoff]] = {}  # key -> (retry at, error, back-off)
        self._inflight: dict[str, asyncio.Task[Any]] = {}
        self._informers: dict[tuple[str, str], Informer] = {}
        self._swept_at = time.monotonic()
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
        self._forget_old()
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < ttl:
            return cached[1]
        failed = self._failed.get(key)
        if failed is not None and time.monotonic() < failed[0]:
            raise failed[1]  # still backing off: the same answer, no new request
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
        try:
            value = await self._fetch(path, params, what, allow_404)
        except KubeError as exc:
            backoff = self._failed[key][2] if key in self._failed else Backoff()
            self._failed[key] = (time.monotonic() + backoff.next(), exc, backoff)
            raise
        self._failed.pop(key, None)
        self._cache[key] = (time.monotonic(), value)
        return value

    def _forget_old(self) -> None:
        """Drop answers nobody has asked for in INFORMER_IDLE_S (objects of evicted targets)."""
        now = time.monotonic()
        if now - self._swept_at < 60.0:
            return
        self._swept_at = now
        for key in [k for k, (at, _) in self._cache.items() if now - at > INFORMER_IDLE_S]:
            del self._cache[key]
        for key in [k for k, (retry_at, _, _) in self._failed.items() if now - retry_at > INFORMER_IDLE_S]:
            del self._failed[key]

    # -- informers -------------------------------------------------------------------------------
    def informer(self, path: str, selector: str, what: str) -> Informer:
        """The shared list+watch of ``path`` with this label selector, started on first use."""
        now = time.monotonic()
        for key, idle in list(self._informers.items()):
            if now - idle.last_used > INFORMER_IDLE_S:
                idle.stop()
                del self._informers[key]
        informer = self._informers.get((path, selector))
        if informer is None:
            informer = self._informers[(path, selector)] = Informer(self, path, selector, what)
        informer.last_used = now
        return informer

    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    async def _list(self, path: str, selector: str, what: str) -> dict[str, Any]:
        data = await self._fetch(path, {"labelSelector": selector}, f"list {what}", allow_404=False)
        if not isinstance(data, dict):
            raise KubeError(f"Kubernetes API list {what}: not a list object")
        return data

    async def _watch(self, path: str, selector: str, resource_version: str, what: str) -> httpx.Response:
        """Open a watch stream: the response, headers read (within the client timeout), body streaming."""
        self.requests += 1
        timeout_s = random.randint(*WATCH_TIMEOUT_S)
        params = {
            "labelSelector": selector,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        # the body may stay quiet for minutes (no read timeout beyond the server's own), but the
        # answer itself must come within the client's timeout: a hung API server is an error
        timeout = httpx.Timeout(self._config.timeout_s, read=timeout_s + 30.0)
        request = self._watch_http.build_request("GET", path, params=params, headers=self._auth(), timeout=timeout)
        try:
            return await asyncio.wait_for(self._watch_http.send(request, stream=True), self._config.timeout_s)
        except TimeoutError:
            raise KubeError(f"Kubernetes API watch {what}: no answer within {self._config.timeout_s:g} s") from None
        except (httpx.HTTPError, OSError) as exc:
            raise KubeError(f"Kubernetes API watch {what}: {type(exc).__name__}: {exc}") from exc

    def endpointslices(self, namespace: str, service: str) -> Informer:
        return self.informer(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            f"kubernetes.io/service-name={service}",
            f"EndpointSlices of {namespace}/{service}",
        )

    def pods(self, namespace: str, selector: str) -> Informer:
        return self.informer(f"/api/v1/namespaces/{namespace}/pods", selector, f"pods {selector} in {namespace}")

    async def get_service(self, namespace: str, service: str) -> dict[str, Any] | None:
        data = await self.get(
            f"/api/v1/namespaces/{namespace}/services/{service}",
            ttl=SLOW_TTL_S,
            what=f"get Service {namespace}/{service}",
            allow_404=True,
        )
        return data if isinstance(data, dict) else None

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

    async def patch_pod_annotation(self, namespace: str, name: str, uid: str, key: str, value: str) -> PatchResult:
        """Set one annotation of one pod (JSON merge patch). With ``uid``, the patch names it: on a pod
        that was replaced under the same name (a StatefulSet's) that is a change of an immutable field,
        refused (422 Invalid, "metadata.uid ... field is immutable"), instead of giving the new pod the old
        one's annotation."""
        self.requests += 1
        metadata: dict[str, Any] = {"annotations": {key: value}}
        if uid:
            metadata["uid"] = uid
        try:
            resp = await self._http.patch(
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                content=json.dumps({"metadata": metadata}),
                headers={**self._auth(), "Content-Type": "application/merge-patch+json"},
            )
        except (httpx.HTTPError, OSError) as exc:
            return PatchResult(PATCH_ERROR, None, f"{type(exc).__name__}: {exc}")
        if resp.status_code == 200:
            return PatchResult(PATCH_OK, 200)
        try:
            message = str(resp.json().get("message", ""))
        except (ValueError, AttributeError):
            message = resp.text[:200]
        outcome = {401: PATCH_FORBIDDEN, 403: PATCH_FORBIDDEN, 404: PATCH_GONE, 409: PATCH_CONFLICT}.get(
            resp.status_code, PATCH_ERROR
        )
        if resp.status_code == 422 and "metadata.uid" in message:
            outcome = PATCH_CONFLICT  # the UID in the patch is not the pod's: the API server says "immutable"
        return PatchResult(outcome, resp.status_code, message[:300])

    # -- the scaler's own state (keda_llm_scaler.state_store): never cached, written with resourceVersion --
    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        data = await self._fetch(
            f"/api/v1/namespaces/{namespace}/configmaps/{name}", None, f"get ConfigMap {namespace}/{name}", True
        )
        return data if isinstance(data, dict) else None

    async def _write(self, method: str, path: str, body: dict[str, Any], what: str) -> bool:
        """True when written, False on a conflict (409: changed or created meanwhile); KubeError otherwise."""
        self.requests += 1
        try:
            resp = await self._http.request(
                method, path, content=json.dumps(body), headers={**self._auth(), "Content-Type": "application/json"}
            )
        except (httpx.HTTPError, OSError) as exc:
            raise KubeError(f"Kubernetes API {what}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code in (200, 201):
            return True
        if resp.status_code == 409:
            return False
        try:
            message = str(resp.json().get("message", ""))
        except (ValueError, AttributeError):
            message = resp.text[:200]
        raise KubeError(f"Kubernetes API {what}: HTTP {resp.status_code} {message[:300]}".rstrip())

    async def replace_configmap(self, namespace: str, name: str, obj: dict[str, Any]) -> bool:
        """PUT the object as read (its resourceVersion makes a concurrent change a 409, not a lost write)."""
        return await self._write(
            "PUT", f"/api/v1/namespaces/{namespace}/configmaps/{name}", obj, f"update ConfigMap {namespace}/{name}"
        )

    async def create_configmap(self, namespace: str, name: str, data: dict[str, str]) -> bool:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        return await self._write(
            "POST", f"/api/v1/namespaces/{namespace}/configmaps", body, f"create ConfigMap {namespace}/{name}"
        )

    async def aclose(self) -> None:
        for informer in self._informers.values():
            informer.stop()
        self._informers.clear()
        await self._http.aclose()
        await self._watch_http.aclose()


def object_key(meta: Mapping[str, Any], namespace: str = "") -> str | None:
    """An object's identity from its metadata (or an object reference, such as an endpoint's ``targetRef``):
    its UID, else namespace/name (``namespace`` when the metadata names none); None without either."""
    uid = meta.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    name = meta.get("name")
    if isinstance(name, str) and name:
        return f"{meta.get('namespace') or namespace}/{name}"
    return None


def _object_key(obj: dict[str, Any]) -> str | None:
    return object_key(obj.get("metadata") or {})  # UID, else namespace/name: any object, not only pods


class Informer:
    """One collection (path + label selector) listed once, then followed by watch.

    ``objects`` is the last known state: after a disconnect it stays readable while the watch resumes
    from ``resource_version``; ``error`` says what is wrong while it is. Counters (``lists``,
    ``watches``) make the API cost visible in tests and in the closing figures.
    """

    def __init__(self, client: KubeClient, path: str, selector: str, what: str) -> None:
        self._client = client
        self.path, self.selector, self.what = path, selector, what
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        self.error: str | None = None
        self.error_since: float | None = None  # monotonic; None while healthy
        self.lists = 0
        self.watches = 0
        self.last_used = time.monotonic()
        self._backoff = Backoff()
        self._task: asyncio.Task[None] | None = asyncio.create_task(self._run(), name=f"informer {what}")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def wait_synced(self, timeout: float) -> bool:
        if not self.synced.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.synced.wait(), timeout)
        return self.synced.is_set()

    def items(self) -> list[dict[str, Any]]:
        return list(self.objects.values())

    def _failed(self, exc: Exception) -> None:
        self.error = str(exc)
        if self.error_since is None:
            self.error_since = time.monotonic()

    async def _run(self) -> None:
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                opened = time.monotonic()
                events = await self._follow()
                if events or time.monotonic() - opened >= STEADY_WATCH_S:
                    self._backoff.reset()
                    continue  # the server ended a healthy watch: resume from where it left off
                raise KubeError(f"watch {self.what}: closed at once without events")
            except asyncio.CancelledError:
                raise
            except Gone:
                # relist from scratch, at once the first time, never in a tight loop after that
                self.resource_version = None
                if self._backoff.failures:
                    await asyncio.sleep(self._backoff.next())
                else:
                    self._backoff.failures = 1
            except Exception as exc:  # KubeError, transport errors, a malformed event: back off, resume
                self._failed(exc)
                await asyncio.sleep(self._backoff.next())

    async def _relist(self) -> None:
        self.lists += 1
        data = await self._client._list(self.path, self.selector, self.what)
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        self.objects = {k: i for i in items if (k := _object_key(i)) is not None}
        rv = (data.get("metadata") or {}).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise KubeError(f"list {self.what}: no resourceVersion")
        self.resource_version = rv
        self.error, self.error_since = None, None
        self.synced.set()

    async def _follow(self) -> int:
        """One watch stream; returns how many events it delivered."""
        assert self.resource_version is not None
        self.watches += 1
        events = 0
        resp = await self._client._watch(self.path, self.selector, self.resource_version, self.what)
        try:
            if resp.status_code == 410:
                raise Gone(f"watch {self.what}: 410 Gone")
            if resp.status_code != 200:
                body = (await resp.aread())[:200].decode(errors="replace")
                raise KubeError(f"Kubernetes API watch {self.what}: HTTP {resp.status_code} {body}".rstrip())
            self.error, self.error_since = None, None
            async for line in resp.aiter_lines():
                if line.strip():
                    self._apply(json.loads(line))
                    events += 1
        except httpx.HTTPError as exc:
            if events:
                return events  # a dropped connection after progress: resume from the last version
            raise KubeError(f"Kubernetes API watch {self.what}: {type(exc).__name__}: {exc}") from exc
        finally:
            await resp.aclose()
        return events

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(f"watch {self.what}: {obj.get('message', 'resource version too old')}")
            raise KubeError(f"watch {self.what}: HTTP {code} {obj.get('message', '')}".rstrip())
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            key = _object_key(obj)
            if key is not None:
                if kind == "DELETED":
                    self.objects.pop(key, None)
                else:
                    self.objects[key] = obj
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if isinstance(rv, str) and rv:
            self.resource_version = rv  # BOOKMARK events carry only this
