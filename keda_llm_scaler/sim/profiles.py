"""Hardware/model profiles of a vLLM replica (team reference REPLICA-PERF-MODEL.md §0, centre values).

Step time of one engine iteration, in ms::

    T_step = c + b·P + d·D + e·(K/1000) + f·Σ p_i·(q_i + p_i/2)

P prefill tokens in the step, D decoding sequences, K context tokens of the decoding sequences,
p_i/q_i a prefill chunk and the prefix already computed before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["PROFILES", "Profile"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    description: str
    c_ms: float  # fixed step cost (weight read, launch, sampling)
    b_ms: float  # per prefill token
    d_ms: float  # per decoding sequence
    e_ms: float  # per 1k context tokens read by decode
    f_ms: float  # prefill attention, per token x context token
    kv_tokens: int  # KV capacity at gpu_memory_utilization 0.9
    gpus: int
    cold_start_mean_s: float  # warm node: image and weights cached
    cold_start_p90_s: float
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024

    def step_ms(self, prefill_tokens: float, decoding: int, context_tokens: float, attention: float = 0.0) -> float:
        return (
            self.c_ms
            + self.b_ms * prefill_tokens
            + self.d_ms * decoding
            + self.e_ms * context_tokens / 1000.0
            + self.f_ms * attention
        )


PROFILES: Final[dict[str, Profile]] = {
    p.name: p
    for p in (
        Profile(
            "8b-h100", "Llama-3.1-8B BF16, 1xH100 (TP1)", 6.0, 0.0173, 0.006, 0.055, 1.18e-6, 418_000, 1, 90.0, 150.0
        ),
        Profile(
            "70b-h100x4", "Llama-3.1-70B FP8, 4xH100 (TP4)", 12.0, 0.042, 0.03, 0.035, 1.47e-6, 691_000, 4, 240.0, 330.0
        ),
        Profile(
            "70b-h200x2", "Llama-3.1-70B FP8, 2xH200 (TP2)", 15.0, 0.068, 0.05, 0.049, 2.95e-6, 582_000, 2, 200.0, 300.0
        ),
    )
}
