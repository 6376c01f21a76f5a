"""Token mixes: the (prompt, output) sizes a workload's requests draw, apart from when they arrive.

``conversation`` is the bundled Azure 2023 conversation trace's own tokens. The others are lognormal
mixes, clipped, drawn deterministically per seed; each states where its shape comes from:

* ``prefill-heavy`` (code completion, RAG-style short answers): the Azure 2023 *code* trace's published
  statistics (REPLICA-PERF-MODEL.md §5.1: input p50 1469 / p90 5186 / max 7437, output p50 13 / p90 55 /
  max 1899), fitted by their median and p90. The trace itself is not bundled; its shape is.
* ``decode-heavy`` (long-form generation, reasoning-style answers to short prompts): prompts p50 200 /
  p90 600, outputs p50 600 / p90 1800, at most 4096. Chosen, not measured: the opposite corner of the
  conversation mix (1155 in / 211 out), so that decode and KV, not prefill, set the knee.
* ``rag`` (retrieval-augmented answers): prompts p50 3000 / p90 7000, at most 16000; outputs p50 120 /
  p90 400, at most 1024. Chosen, not measured, and held out: added after the defaults were chosen, never
  replayed while choosing them (docs/replay.md, the validation set).

A mix replaces each request's tokens and keeps its arrival time: ``apply_mix(trace, name, seed)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from keda_llm_scaler.sim.trace import TraceRequest

__all__ = ["MIXES", "TRACE_MIX", "LognormalMix", "apply_mix", "sample_mix"]

TRACE_MIX: Final = "conversation"  # the trace's own tokens
_Z90: Final = 1.2815515655446004  # the standard normal's 90th percentile


@dataclass(frozen=True, slots=True)
class LognormalMix:
    description: str
    prompt_p50: float
    prompt_p90: float
    prompt_max: int
    output_p50: float
    output_p90: float
    output_max: int

    def draw(self, rnd: random.Random) -> tuple[int, int]:
        return (
            _draw(rnd, self.prompt_p50, self.prompt_p90, self.prompt_max),
            _draw(rnd, self.output_p50, self.output_p90, self.output_max),
        )


def _draw(rnd: random.Random, p50: float, p90: float, top: int) -> int:
    sigma = math.log(p90 / p50) / _Z90
    return max(1, min(top, round(rnd.lognormvariate(math.log(p50), sigma))))


MIXES: Final[dict[str, LognormalMix | None]] = {
    TRACE_MIX: None,
    "prefill-heavy": LognormalMix(
        "long prompts, short answers (Azure 2023 code trace's shape)", 1469, 5186, 7437, 13, 55, 1899
    ),
    "decode-heavy": LognormalMix("short prompts, long answers", 200, 600, 4096, 600, 1800, 4096),
    "rag": LognormalMix("retrieved context: long prompts, medium answers", 3000, 7000, 16000, 120, 400, 1024),
}


def _mix(name: str) -> LognormalMix | None:
    if name not in MIXES:
        raise ValueError(f"unknown token mix {name!r}; choose from {', '.join(MIXES)}")
    return MIXES[name]


def apply_mix(trace: Sequence[TraceRequest], name: str, seed: int = 0) -> list[TraceRequest]:
    """The trace's arrivals with tokens drawn from the mix (the trace unchanged for ``conversation``)."""
    mix = _mix(name)
    if mix is None:
        return list(trace)
    rnd = random.Random(f"mix:{name}:{seed}")
    return [TraceRequest(r.t, *mix.draw(rnd)) for r in trace]


def sample_mix(name: str, fallback: Sequence[tuple[int, int]], n: int = 20_000, seed: int = 0) -> list[tuple[int, int]]:
    """``n`` (prompt, output) pairs of the mix, for a day built from a rate curve; ``fallback`` (the
    trace's own pairs) for ``conversation``."""
    mix = _mix(name)
    if mix is None:
        return list(fallback)
    rnd = random.Random(f"mix:{name}:{seed}")
    return [mix.draw(rnd) for _ in range(n)]
