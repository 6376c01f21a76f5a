"""``--victim-ranking``'s value: the namespaces where victim ranking is on.

Its own module so that the settings (``keda_llm_scaler.config``) check the flag without importing the ranker
(``keda_llm_scaler.deletion_cost``) and the Kubernetes client behind it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["RankingScope", "parse_scope"]


@dataclass(frozen=True, slots=True)
class RankingScope:
    """Where ranking is on: every namespace (``all_namespaces``) or the listed ones."""

    namespaces: frozenset[str] = frozenset()
    all_namespaces: bool = False

    def __contains__(self, namespace: object) -> bool:
        return self.all_namespaces or namespace in self.namespaces

    @property
    def enabled(self) -> bool:
        return self.all_namespaces or bool(self.namespaces)


def parse_scope(raw: str) -> RankingScope:
    """``--victim-ranking``: empty (off), ``*`` (every namespace), or comma-separated namespace names."""
    items = [part.strip() for part in raw.split(",") if part.strip()]
    if items == ["*"]:
        return RankingScope(all_namespaces=True)
    for item in items:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", item):
            raise ValueError(f"--victim-ranking {raw!r}: {item!r} is not a namespace name; accepted: * | ns1,ns2,...")
    return RankingScope(frozenset(items))
