"""The control plane's throwaway PKI, made with the ``openssl`` command (OpenSSL 3).

One cluster CA signs the API server's serving certificate, the admin and controller-manager client
certificates and KEDA's (its operator's gRPC server and its adapter share one pair, as the
``kedaorg-certs`` Secret does in a cluster). A separate front-proxy CA signs the client certificate the
aggregation layer presents to KEDA's metrics adapter. Service-account tokens are signed with an EC key.
Keys are ECDSA P-256: fast to make, accepted by every component here.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]

_DAYS = "3650"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Pki:
    dir: Path

    def file(self, name: str) -> Path:
        path = self.dir / name
        if not path.is_file():
            raise FileNotFoundError(f"the e2e PKI has no {name}")
        return path


def _openssl(args: list[str], cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-800:]}")


def _ca(d: Path, name: str, cn: str) -> None:
    _openssl(["req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", _DAYS,
              "-subj", f"/CN={cn}", "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"], d)  # fmt: skip


def _leaf(d: Path, ca: str, name: str, subject: str, usage: str, sans: list[str] | None = None) -> None:
    ext = ["-addext", f"extendedKeyUsage={usage}", "-addext", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if sans:
        ext += ["-addext", "subjectAltName=" + ",".join(sans)]
    _openssl(["req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", _DAYS,
              "-subj", subject, "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", *ext], d)  # fmt: skip


def make_pki(d: Path, apiserver_ips: list[str]) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca", "keda-llm-scaler-e2e-ca")
    _ca(d, "front-proxy-ca", "keda-llm-scaler-e2e-front-proxy-ca")
    names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
    sans = [f"IP:{ip}" for ip in ["127.0.0.1", *apiserver_ips]] + [f"DNS:{n}" for n in ["localhost", *names]]
    _leaf(d, "ca", "apiserver", "/CN=kube-apiserver", "serverAuth", sans)
    _leaf(d, "ca", "admin", "/O=system:masters/CN=kubernetes-admin", "clientAuth")
    _leaf(d, "ca", "controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
    keda = [f"DNS:{s}.keda.svc{z}" for s in ("keda-operator", "keda-metrics-apiserver") for z in ("", ".cluster.local")]
    _leaf(d, "ca", "keda", "/CN=keda-operator", "serverAuth,clientAuth", ["IP:127.0.0.1", "DNS:localhost", *keda])
    _leaf(d, "front-proxy-ca", "front-proxy-client", "/CN=front-proxy-client", "clientAuth")
    _openssl(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key"], d)
    _openssl(["ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"], d)
    # KEDA reads ca.crt/tls.crt/tls.key from one directory (its --cert-dir, the adapter's too)
    keda_dir = d / "keda"
    keda_dir.mkdir(exist_ok=True)
    for src, dst in (("ca.crt", "ca.crt"), ("keda.crt", "tls.crt"), ("keda.key", "tls.key")):
        (keda_dir / dst).write_bytes((d / src).read_bytes())
    return Pki(d)
