"""``scripts/controlplane build``: kube-apiserver, kube-controller-manager and KEDA from their Go modules.

Nothing is downloaded but Go modules through the module proxy (``GOPROXY``). The binaries are cached
outside the repository, keyed by version (``$KLS_CONTROLPLANE_CACHE``, default
``~/.cache/keda-llm-scaler/controlplane/k8s-<v>-keda-<v>/bin``), so later runs start in seconds.

- ``k8s.io/kubernetes`` cannot be ``go install``ed: its go.mod replaces its staging modules
  (``k8s.io/api`` …) with local paths the module zip does not carry. A go.mod of our own requires it and
  replaces each staging module with its published ``v0.X.Y``; the version is stamped with ``-X`` so the
  server reports the release instead of ``v0.0.0-master``.
- KEDA's go.mod pins its Kubernetes libraries with replace directives, which ``go install`` refuses too:
  its module source is copied and built as the main module, with its own go.mod and go.sum.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from keda_llm_scaler.enginelab.build import lab_cache

__all__ = ["KEDA_VERSION", "KUBERNETES_VERSION", "Binaries", "binaries", "build"]

KUBERNETES_VERSION = "v1.36.3"
KEDA_VERSION = "v2.21.0"
_KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager")
_KEDA_BINARIES = {"keda-operator": "./cmd/operator", "keda-adapter": "./cmd/adapter"}


@dataclass(frozen=True)
class Binaries:
    root: Path  # the cache directory of this version pair

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def path(self, name: str) -> Path:
        return self.bin / name

    @property
    def complete(self) -> bool:
        names = (*_KUBE_BINARIES, *_KEDA_BINARIES)
        have_crds = any((self.root / "crds").glob("keda.sh_*.yaml"))
        return all(os.access(self.path(n), os.X_OK) for n in names) and have_crds

    def missing(self) -> list[str]:
        return [n for n in (*_KUBE_BINARIES, *_KEDA_BINARIES) if not os.access(self.path(n), os.X_OK)]


def cache_root() -> Path:
    return lab_cache("controlplane", "KLS_CONTROLPLANE_CACHE")


def binaries(kubernetes: str = KUBERNETES_VERSION, keda: str = KEDA_VERSION) -> Binaries:
    return Binaries(cache_root() / f"k8s-{kubernetes}-keda-{keda}")


def _go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false", **(env or {})}
    proc = subprocess.run(["go", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"controlplane build: go {' '.join(args[:3])} failed in {cwd}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def _download(module: str, version: str, cwd: Path) -> dict[str, str]:
    return dict(json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], cwd)))


def _staging_modules(kubernetes_gomod: str) -> list[str]:
    """The ``k8s.io/<staging>`` modules that k8s.io/kubernetes replaces with local paths."""
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", kubernetes_gomod, re.M)))


def _log(msg: str, start: float) -> None:
    print(f"[controlplane build {time.monotonic() - start:6.0f}s] {msg}", file=sys.stderr, flush=True)


def _build_kubernetes(version: str, out: Path, work: Path, start: float, names: list[str]) -> None:
    src = work / "kubernetes"
    src.mkdir(parents=True, exist_ok=True)
    info = _download("k8s.io/kubernetes", version, work)
    staging = _staging_modules(Path(info["GoMod"]).read_text())
    lib_version = "v0." + version.removeprefix("v1.")  # v1.36.3 -> v0.36.3
    replaces = "\n".join(f"\t{m} => {m} {lib_version}" for m in staging if m != "k8s.io/sample-cli-plugin")
    (src / "go.mod").write_text(
        f"module keda-llm-scaler.local/controlplane-build\n\ngo 1.26\n\n"
        f"require k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n"
    )
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{b}"' for b in _KUBE_BINARIES)
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    _log(f"resolving k8s.io/kubernetes {version} (staging modules at {lib_version})", start)
    _go(["mod", "tidy"], src)
    ldflags = f"-s -w -X k8s.io/component-base/version.gitVersion={version}"
    for name in names:
        _log(f"building {name} {version}", start)
        tmp = out / f".{name}.tmp"
        _go(["build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), f"k8s.io/kubernetes/cmd/{name}"], src)
        tmp.rename(out / name)  # a build cut short never leaves a binary that looks complete


def _keda_source(version: str, work: Path) -> Path:
    return Path(_download("github.com/kedacore/keda/v2", version, work)["Dir"])


def _build_keda(version: str, out: Path, work: Path, start: float, names: list[str]) -> None:
    src = work / "keda"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(_keda_source(version, work), src)
    for path in [src, *src.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the module cache is read-only
    ldflags = f"-s -w -X github.com/kedacore/keda/v2/version.Version={version.removeprefix('v')}"
    for name in names:
        _log(f"building {name} {version}", start)
        tmp = out / f".{name}.tmp"
        _go(["build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), _KEDA_BINARIES[name]], src)
        tmp.rename(out / name)


def build(kubernetes: str = KUBERNETES_VERSION, keda: str = KEDA_VERSION) -> Binaries:
    """Build what is missing of one version pair (each binary on its own); returns where they are."""
    target = binaries(kubernetes, keda)
    if target.complete:
        return target
    if shutil.which("go") is None:
        raise SystemExit("controlplane build: the go command is not installed (Go >= 1.26 is needed)")
    start = time.monotonic()
    target.bin.mkdir(parents=True, exist_ok=True)
    work = target.root / "src"
    missing = target.missing()
    kube = [n for n in missing if n in _KUBE_BINARIES]
    if kube:
        _build_kubernetes(kubernetes, target.bin, work, start, kube)
    keda_missing = [n for n in missing if n in _KEDA_BINARIES]
    if keda_missing:
        _build_keda(keda, target.bin, work, start, keda_missing)
    crds = target.root / "crds"
    crds.mkdir(exist_ok=True)
    for crd in sorted((_keda_source(keda, work.parent) / "config" / "crd" / "bases").glob("*.yaml")):
        (crds / crd.name).write_bytes(crd.read_bytes())
    shutil.rmtree(work, ignore_errors=True)  # the sources stay in the Go module cache
    (target.root / "versions.json").write_text(json.dumps({"kubernetes": kubernetes, "keda": keda}) + "\n")
    _log(f"done: {target.bin}", start)
    return target
