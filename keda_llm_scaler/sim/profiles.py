"""Hardware/model profiles of a vLLM replica (team reference REPLICA-PERF-MODEL.md §0, centre values).

Step time of one engine iteration, in ms::

    T_step = c + b·P + d·D + e·(K/1000) + f·Σ p_i·(q_i + p_i/2) + g·P·D

P prefill tokens in the step, D decoding sequences, K context tokens of the decoding sequences,
p_i/q_i a prefill chunk and the prefix already computed before it. ``g`` is 0 in the bundled (GPU)
profiles, as in the reference; ``calibrate`` fits it on CPU engines, whose prefill tokens cost more the
more decodes share their step (docs/sim-to-real.md).

The first three profiles are the reference's P1-P3. The next three have other knees (what limits the
replica first), derived with the reference's own formulas (§2.2 KV capacity, §2.4 coefficients) from the
sources each names:

* ``70b-h100x2`` — KV-bound: Llama-3.1-70B FP8 on 2xH100 (TP2). KV = 2·79.6·0.9 - 67.7 (weights) - 5.5
  - 2·0.6 = 68.9 GiB = 225k tokens (the reference's NIM cross-check), a third of P2's pool; c = 18.6 ms
  (NIM TP2 FP8 ITL floor), b = 0.081 ms/token (NIM TP2 prefill), d as P3, e = 160 KiB/GPU over 70 % of
  3.35 TB/s = 0.070, f as P3 (same FLOPs per GPU as H200).
* ``8b-a100`` — sequence-capped: Llama-3.1-8B BF16 on 1xA100-80GB, where vLLM's default max_num_seqs is
  256 (§0). c = 10 ms (vLLM CI A100 8B 12.3 ms/step offline, less the ~20 % the offline harness runs above
  online ITL), b = P1's x 2.2 (Splitwise: A100 prompt phase 2.1-2.4x slower) = 0.038, d = P1's x 1.5
  (token phase 1.5x), e = 128 KiB over 70 % of 2.0 TB/s = 0.094, f = P1's x 989/312 (dense BF16 FLOPs)
  = 3.7e-6; KV = 74.5·0.9 - 15.0 - 5.5 - 0.15 = 46.4 GiB = 380k tokens.
* ``32b-h100`` — a smaller model on one GPU with a small KV pool: Qwen2.5-32B FP8 (64 layers, 8 KV heads
  of 128: 256 KiB/token BF16 KV) on 1xH100. Weights 32.8 GB = 30.5 GiB; KV = 79.6·0.9 - 30.5 - 5.5 - 0.15
  = 35.5 GiB = 145k tokens; c = 32.8 GB over 80 % of 3.35 TB/s + ~1 ms = 13 ms, b = 2·32.5 GFLOP over 45 %
  of 1979 FP8 TFLOPS = 0.072, d = 0.02 (rough, as P2), e = 256 KiB over 70 % of 3.35 TB/s = 0.112,
  f = 4·64·5120 over 45 % of 989 TFLOPS = 2.9e-6; cold start as P1's range scaled by weights (~2x).

``8b-h200`` is the reference's optional P4 (c 5.0, b as P1, e 0.039, 863k KV tokens), held out: added after
the defaults were chosen, never replayed while choosing them (docs/replay.md, the validation set).

``load_profile(path)`` reads a user's own (JSON or YAML, the fields of ``Profile``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["PROFILES", "Profile", "get_profile", "load_profile"]


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
    # The API server's own time per request before its first token reaches the client (tokenizing, the
    # hand-off to the engine, the first chunk's write): added to each TTFT, not to the engine's steps. 0 in
    # the GPU profiles, whose coefficients are engine-side; ``calibrate`` measures it on a running engine.
    ttft_overhead_ms: float = 0.0
    # The same overhead by how many answers stream from the replica when the first token comes: (answers,
    # ms) points, linear between them and flat past the last; empty: ``ttft_overhead_ms`` at any load. On
    # a CPU engine under a quota the API server's first chunk waits behind the other answers' chunks and
    # the cgroup's throttled periods: 3 ms beside none, 20-60 ms beside a few (docs/sim-to-real.md).
    # ``calibrate`` measures it from 0 answers up; below a table's first point its first value holds.
    # () in the GPU profiles.
    ttft_overhead_by_streams: tuple[tuple[int, float], ...] = ()
    # A prefill token's extra cost per decoding sequence beside it in the step (the model's g·P·D). 0 in
    # the GPU profiles (the reference has no such term); on a CPU engine a mixed step is slower than its
    # prefill and its decodes apart, and one prefill factor fitted under load made the prefills of a
    # lightly loaded engine 16-41 % too slow (docs/sim-to-real.md).
    g_ms: float = 0.0

    def step_ms(self, prefill_tokens: float, decoding: int, context_tokens: float, attention: float = 0.0) -> float:
        """T_step (the module's docstring), the one definition the simulator runs; ``attention`` is
        Σ p_i·(q_i + p_i/2) over the step's prefill chunks."""
        return (
            self.c_ms
            + self.b_ms * prefill_tokens
            + self.d_ms * decoding
            + self.context_ms(context_tokens)
            + self.f_ms * attention
            + self.g_ms * prefill_tokens * decoding
        )

    def __post_init__(self) -> None:
        answers = [n for n, _ in self.ttft_overhead_by_streams]
        if answers != sorted(set(answers)) or any(n < 0 or ms < 0 for n, ms in self.ttft_overhead_by_streams):
            raise ValueError(
                f"profile {self.name}: ttft_overhead_by_streams must be (answers, ms) points with answers "
                f"distinct, ascending and >= 0 and ms >= 0, not {self.ttft_overhead_by_streams!r}"
            )

    def first_token_overhead_ms(self, streams: int) -> float:
        """The API server's time on a first token while ``streams`` other answers stream from the replica."""
        table = self.ttft_overhead_by_streams
        if not table:
            return self.ttft_overhead_ms
        if streams <= table[0][0]:
            return table[0][1]
        for (n0, ms0), (n1, ms1) in itertools.pairwise(table):
            if streams <= n1:
                return ms0 + (ms1 - ms0) * (streams - n0) / (n1 - n0)
        return table[-1][1]

    def context_ms(self, context_tokens: float) -> float:
        """T_step's K term: decode reading ``context_tokens`` of context (a run of decode-only steps grows
        by this of its decoding sequences' count each step)."""
        return self.e_ms * context_tokens / 1000.0


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
        Profile(
            "70b-h100x2",
            "Llama-3.1-70B FP8, 2xH100 (TP2): KV-bound, a third of 70b-h100x4's pool",
            18.6,
            0.081,
            0.05,
            0.070,
            2.95e-6,
            225_000,
            2,
            220.0,
            320.0,
        ),
        Profile(
            "8b-a100",
            "Llama-3.1-8B BF16, 1xA100-80GB: max_num_seqs 256 (vLLM's default there)",
            10.0,
            0.038,
            0.009,
            0.094,
            3.7e-6,
            380_000,
            1,
            90.0,
            150.0,
            max_num_seqs=256,
        ),
        Profile(
            "8b-h200",
            "Llama-3.1-8B BF16, 1xH200: the reference's optional P4 (863k KV tokens)",
            5.0,
            0.0173,
            0.006,
            0.039,
            1.18e-6,
            863_000,
            1,
            90.0,
            150.0,
        ),
        Profile(
            "32b-h100",
            "Qwen2.5-32B FP8, 1xH100: one GPU, a small KV pool (145k tokens)",
            13.0,
            0.072,
            0.02,
            0.112,
            2.9e-6,
            145_000,
            1,
            150.0,
            240.0,
        ),
    )
}

_NUMBERS: Final = (
    "c_ms", "b_ms", "d_ms", "e_ms", "f_ms", "g_ms", "cold_start_mean_s", "cold_start_p90_s", "ttft_overhead_ms",
)  # fmt: skip
_OPTIONAL: Final = ("max_num_batched_tokens", "max_num_seqs", "ttft_overhead_ms", "g_ms")
_COUNTS: Final = ("kv_tokens", "gpus", "max_num_batched_tokens", "max_num_seqs")


def load_profile(path: Path) -> Profile:
    """A profile from a JSON or YAML file with the fields of ``Profile`` (``name`` defaults to the file's
    stem, ``description`` to its path; ``max_num_batched_tokens`` and ``max_num_seqs`` to vLLM's)."""
    text = path.read_text()
    data: Any
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    else:
        import yaml  # a dependency of the package (kubeconfig files)

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ValueError(f"{path}: not valid YAML") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a profile is a mapping of the fields {', '.join(_NUMBERS + _COUNTS)}")
    fields = {f.name for f in dataclasses.fields(Profile)}
    data = {k: v for k, v in data.items() if k != "fit_points"}  # calibrate's evidence, kept beside the fit
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{path}: unknown profile field(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {
        "name": str(data.get("name", path.stem)),
        "description": str(data.get("description", path)),
    }
    for key in _NUMBERS + _COUNTS:
        if key not in data:
            if key in _OPTIONAL:
                continue
            raise ValueError(f"{path}: missing profile field {key!r}")
        raw = data[key]
        if isinstance(raw, str):  # YAML 1.1 reads 2e-06 (no dot) as a string
            with contextlib.suppress(ValueError):
                raw = float(raw)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise ValueError(f"{path}: {key} must be a number, not {raw!r}")
        if key in _COUNTS:
            if raw != int(raw) or raw < 1:
                raise ValueError(f"{path}: {key} must be a whole number >= 1, not {raw!r}")
            raw = int(raw)
        elif raw < 0 or (key == "c_ms" and raw <= 0):
            raise ValueError(f"{path}: {key} must be {'> 0' if key == 'c_ms' else '>= 0'}, not {raw!r}")
        values[key] = raw
    if "ttft_overhead_by_streams" in data:
        values["ttft_overhead_by_streams"] = _overhead_table(path, data["ttft_overhead_by_streams"])
    if values["cold_start_p90_s"] < values["cold_start_mean_s"]:
        raise ValueError(f"{path}: cold_start_p90_s must be >= cold_start_mean_s")
    return Profile(**values)


def _overhead_table(path: Path, raw: Any) -> tuple[tuple[int, float], ...]:
    """``ttft_overhead_by_streams`` as written: [[answers, ms], ...] (calibrate's JSON) or {answers: ms}
    (YAML); answers whole, distinct and >= 0, ms >= 0."""
    what = f"{path}: ttft_overhead_by_streams must be [[answers, ms], ...] or {{answers: ms}}"
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"{what}, not {raw!r}")
    table: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise ValueError(f"{what}: {pair!r} is not a pair")
        n, ms = pair
        if not isinstance(n, bool) and not isinstance(ms, bool):
            with contextlib.suppress(TypeError, ValueError):
                n, ms = float(n), float(ms)  # YAML and JSON mapping keys are strings
        if (
            not isinstance(n, float) or not isinstance(ms, float) or not math.isfinite(n) or not math.isfinite(ms)
            or n != int(n) or n < 0 or ms < 0 or int(n) in table
        ):  # fmt: skip
            raise ValueError(f"{what}: answers a distinct whole number >= 0 and ms a number >= 0, not {pair!r}")
        table[int(n)] = ms
    return tuple(sorted(table.items()))


@functools.lru_cache(maxsize=32)
def get_profile(name_or_path: str) -> Profile:
    """A bundled profile by name, or a profile file (JSON/YAML) by path."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"--profile {name_or_path!r}: neither a bundled profile ({', '.join(PROFILES)}) nor a file")
    return load_profile(path)
